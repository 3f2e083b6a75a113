"""Validator reports (codes, paths, expected/got), cards, reply parsing, and the contract snapshot."""

from __future__ import annotations

import pytest

from cipr.core.errors import DataError
from cipr.guard import CallValidator, ContractSnapshot, ValidatorConfig, tool_card, validate_call
from cipr.guard.contract import contract_hash
from cipr.guard.parse import parse_json_calls, parse_reply
from cipr.tools.interface import Call, Tool

SEARCH = Tool("search_hotels", "Find hotels.", {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name."},
        "stars": {"type": "integer", "enum": [3, 4, 5]},
        "price": {"type": ["number", "null"], "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}},
        "dates": {"type": "object",
                  "properties": {"start": {"type": "string"}, "nights": {"type": "integer"}},
                  "required": ["start"]},
        "extra": {"anyOf": [{"type": "string"}, {"type": "boolean"}]},
    },
    "required": ["city", "dates"]})
SNAP = ContractSnapshot.from_tools([SEARCH])


def issues(args, config=None):
    report = validate_call(Call("search_hotels", args), SNAP, config)
    return sorted((i.path, i.code, repr(i.expected), repr(i.got)) for i in report.issues)


def test_valid_call_has_no_issues():
    report = validate_call(Call("search_hotels",
                                {"city": "Rome", "dates": {"start": "2025-01-01"}, "price": None,
                                 "tags": ["spa"], "stars": 4, "extra": True}), SNAP)
    assert report.valid and report.render() == "valid" and report.tool == "search_hotels"


def test_each_issue_code_with_path_expected_and_got():
    got = issues({"town": "Rome", "stars": 2, "price": -1, "tags": ["a", 3], "extra": 1,
                  "dates": {"nights": "two", "begin": "x"}})
    assert got == sorted([
        ("arguments.city", "missing_required", "'string'", "None"),
        ("arguments.town", "unknown_argument", "['city']", "'Rome'"),
        ("arguments.stars", "enum_mismatch", "[3, 4, 5]", "2"),
        ("arguments.price", "constraint", "{'minimum': 0}", "-1"),
        ("arguments.tags[1]", "wrong_type", "'string'", "3"),
        ("arguments.extra", "wrong_type", "['string', 'boolean']", "1"),
        ("arguments.dates.start", "missing_required", "'string'", "None"),
        ("arguments.dates.nights", "wrong_type", "'integer'", "'two'"),
        ("arguments.dates.begin", "unknown_argument", "['start']", "'x'"),  # declared, not given
    ])


def test_name_level_issues():
    v = CallValidator(SNAP)
    (i,) = v.validate(Call("", {})).issues
    assert (i.code, i.path, i.expected) == ("missing_name", "name", ["search_hotels"])
    report = v.validate(Call("book_hotel", {"city": "x"}))
    assert report.codes == ("unknown_tool",) and not report.name_resolved and report.tool is None
    report = v.validate(Call("search_hotels", ["Rome"]))
    assert report.codes == ("arguments_not_object",) and report.name_resolved


def test_config_switches():
    args = {"city": "Rome", "dates": {"start": "x"}, "town": 1, "stars": "four"}
    assert [c for _, c, _, _ in issues(args)] == ["enum_mismatch", "wrong_type", "unknown_argument"]
    assert issues(args, ValidatorConfig(strict_unknown=False, check_types=False, check_enums=False)) == []
    closed = Tool("t", "",
                  {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True})
    assert validate_call(Call("t", {"b": 1}), ContractSnapshot.from_tools([closed])).valid


def test_same_name_duplicate_is_valid_if_any_declaration_accepts():
    a = Tool("f", "first", {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]})
    b = Tool("f", "second", {"type": "object", "properties": {"y": {"type": "integer"}}, "required": ["y"]})
    snap = ContractSnapshot.from_tools([a, b])
    assert validate_call(Call("f", {"y": 1}), snap).valid
    report = validate_call(Call("f", {"y": "1"}), snap)  # 1 issue against b, 3 against a
    assert report.codes == ("wrong_type",)


def test_snapshot_rejects_invalid_schema_and_hashes_content():
    bad = Tool("f", "", {"type": "object", "properties": {"x": {"type": "dict"}}})
    with pytest.raises(DataError, match="'f'.*parameters"):
        ContractSnapshot.from_tools([bad])
    assert contract_hash([SEARCH]) == SNAP.version and len(SNAP.version) == 16
    assert contract_hash([SEARCH.with_(description="Find hotels!")]) != SNAP.version
    with pytest.raises(DataError, match="does not declare"):
        SNAP.refresh([SEARCH], authorize=["ghost"])


def test_card_lists_required_and_typed_fields_without_field_descriptions():
    card = tool_card(SEARCH)
    assert card.required == ("city", "dates", "dates.start")
    text = card.render()
    assert text.splitlines()[:3] == \
        ["tool: search_hotels", "description: Find hotels.", "required: city, dates, dates.start"]
    assert "  - stars (integer, optional) one of: 3, 4, 5" in text
    assert "  - price (number|null, optional)" in text and "  - tags (array<string>, optional)" in text
    assert "  - dates.nights (integer, optional)" in text and "  - extra (string|boolean, optional)" in text
    assert "City name." not in text


@pytest.mark.parametrize(("text", "calls", "attempted"), [
    ('{"name": "f", "arguments": {"a": 1}}', [Call("f", {"a": 1})], True),
    ('Sure! <tool_call>\n{"name": "f", "parameters": {"a": 1}}\n</tool_call>', [Call("f", {"a": 1})], True),
    ('{"type": "function", "function": {"name": "f", "arguments": "{\\"a\\": 1}"}}',
     [Call("f", {"a": 1})], True),
    ('[{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]',
     [Call("f", {}), Call("g", {})], True),
    ('{"arguments": {"a": 1}}', [Call("", {"a": 1})], True),
    ('{"a": 1}', [Call("", {"a": 1})], True),
    ('<tool_call>\n{"name": "f", "argu\n</tool_call>', [Call("", {})], True),
    ('{"name": "f", "arguments": ', [Call("", {})], True),
    ('{"name": "f", "arguments": "oops"}', [Call("f", "oops")], True),
    ("The weather is fine.", [], False),
])
def test_parse_json_calls(text, calls, attempted):
    parsed = parse_json_calls(text)
    assert list(parsed.calls) == calls and parsed.attempted == attempted


def test_parse_reply_prefers_the_call_format():
    from cipr.formats.toolrl import ToolRLFormat

    fmt = ToolRLFormat()
    text = fmt.render_target([Call("f", {"a": 1})])
    assert parse_reply(text, fmt).calls == (Call("f", {"a": 1}),)
    assert parse_reply('{"name": "g", "arguments": {}}', fmt).calls == (Call("g", {}),)  # JSON repair reply
    assert parse_reply("<think> x </think>\n<response> hi </response>", fmt).attempted is False


def test_every_python_reference_call_of_bfcl_is_valid(shared_data):
    """The validator must not flag real correct calls: BFCL's Python single and multiple items."""
    from cipr.data.bfcl import load_bfcl

    examples = load_bfcl(shared_data, partitions=["simple_python", "multiple"])
    assert len(examples) == 600
    invalid = [(e.id, v.render()) for e in examples for v in
               (CallValidator(ContractSnapshot.from_tools(e.interface)).validate(c) for c in e.reference)
               if not v.valid]
    assert invalid == []
