"""The perturbations' packaged tables (`cipr.perturb.vocabulary`): what they hold, and a broken file named."""

from importlib import resources

import pytest

from cipr.core.errors import DataError
from cipr.perturb.vocabulary import VOCABULARY_FILE, vocabulary


def test_the_packaged_tables_hold_what_the_perturbations_draw_from():
    v = vocabulary()
    assert set(v.keyboard_neighbours) == set("abcdefghijklmnopqrstuvwxyz")
    assert all(len(k) == 1 and k not in n and n.isalpha() for k, n in v.keyboard_neighbours.items())
    assert v.abbreviations["calculate"] == "calc" and v.argument_synonyms["city"] == "location"
    assert all(len(short) < len(word) for word, short in v.abbreviations.items())
    assert len(v.unrelated_tools) == 30 and len({t.name for t in v.unrelated_tools}) == 30
    assert all(set(t.required) <= set(t.properties) for t in v.unrelated_tools)
    send = v.unrelated_tools[0]
    assert send.name == "send_sms" and send.required == ("phone_number", "body")
    assert send.parameters["properties"]["body"] == {"type": "string", "description": "Text of the message."}
    assert len(v.unrelated_arguments) == 10 and v.unrelated_arguments[0] == (
        "locale", {"type": "string", "description": "Locale used to format the output, e.g. en_US."})


@pytest.mark.parametrize("old, new, expected", [
    ("keyboard_neighbours: {", "keyboard_neighbours: {[", "not valid YAML"),
    ("  required: [phone_number, body]", "  required: [phone_number, bodyy]",
     "item 'unrelated_tools.0', field 'required': requires undeclared arguments ['bodyy']"),
    ("    body: {type: string,", "    body: {type: text,", "item 'unrelated_tools.0.properties.body.type'"),
    ("- name: translate_text", "- name: send_sms", "item 'unrelated_tools': a tool name is declared twice"),
    ("- {name: locale, type: string,", "- {nam: locale, type: string,", "item 'unrelated_arguments.0'"),
    ("abbreviations: {", "abbreviation: {", "'abbreviations' is a required property"),
])
def test_a_broken_vocabulary_file_names_its_file_and_entry(tmp_path, old, new, expected):
    text = resources.files("cipr.perturb").joinpath(VOCABULARY_FILE).read_text(encoding="utf-8")
    assert text.count(old) == 1
    path = tmp_path / "vocabulary.yaml"
    path.write_text(text.replace(old, new), encoding="utf-8")
    with pytest.raises(DataError, match="^file '" + str(path)) as err:
        vocabulary(path)
    assert expected in str(err.value)
    path.write_text(text, encoding="utf-8")
    assert vocabulary(path) == vocabulary()
