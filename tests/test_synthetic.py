"""Synthetic generator: catalog validity, reference calls valid and recoverable, determinism, options."""

from __future__ import annotations

import random
from collections import Counter

import jsonschema
import pytest

from cipr.data.synthetic import (
    CHITCHAT,
    SyntheticConfig,
    catalog,
    catalog_interface,
    fill,
    generate_synthetic,
    synthetic_stats,
)
from cipr.tools.canonical import canonicalize

TOOLS = {c.tool.name: c for c in catalog()}


def _validator(schema):
    validator = jsonschema.Draft202012Validator
    return validator(schema, format_checker=validator.FORMAT_CHECKER)


@pytest.fixture(scope="module")
def examples():
    return generate_synthetic(1500, 7)


def test_catalog_size_and_schemas():
    cat = catalog()
    assert len(cat) >= 40 and len(TOOLS) == len(cat)  # names unique
    assert len({c.domain for c in cat}) >= 10
    assert not catalog_interface().duplicate_names()
    for c in cat:
        jsonschema.Draft202012Validator.check_schema(dict(c.tool.parameters))
        assert len(c.tool.description.split()) >= 6, c.tool.name
        assert all(p.get("description") for p in c.tool.properties.values()), c.tool.name
        assert set(c.tool.required) <= set(c.tool.properties)
        for intent in c.intents:
            given = set(intent.slots) | set(intent.fixed)
            assert given <= set(c.tool.properties), (c.tool.name, intent.template)
            assert set(c.tool.required) <= given, (c.tool.name, intent.template)
            assert not intent.template.startswith("{"), intent.template


def test_every_template_fills_valid_calls():
    rng = random.Random(0)
    for c in catalog():
        validator = _validator(c.tool.parameters)
        for intent in c.intents:
            for _ in range(10):
                query, call = fill(c, intent, rng)
                assert call.name == c.tool.name
                validator.validate(dict(call.arguments))
                assert "{" not in query and "}" not in query


def _written(value):
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def test_reference_calls_valid_declared_and_recoverable(examples):
    for e in examples:
        assert not e.interface.duplicate_names()
        assert 2 <= len(e.interface) <= 5 or len(e.interface) == len({c.name for c in e.reference})
        for call in e.reference:
            tool = e.interface.get(call.name)
            assert tool is not None, (e.id, call.name)
            _validator(tool.parameters).validate(dict(call.arguments))
            fixed = {}
            for intent in TOOLS[call.name].intents:
                fixed.update(intent.fixed)
            for arg, value in call.arguments.items():
                if isinstance(value, bool) or (arg in fixed and fixed[arg] == value):
                    continue
                for text in _written(value):
                    assert text in e.query, (e.id, arg, text, e.query)


def test_kinds_have_the_right_shape(examples):
    kinds = Counter(e.partition for e in examples)
    assert set(kinds) == {"single", "parallel", "no_call"}
    for e in examples:
        assert e.messages[0].role == "user" and len(e.messages) == 1 and e.source == "synthetic"
        if e.partition == "single":
            assert len(e.reference) == 1 and e.response is None
        elif e.partition == "parallel":
            assert 2 <= len(e.reference) <= 3 and e.response is None
            keys = [c.key() for c in e.reference]
            assert len(set(keys)) == len(keys)  # parallel calls ask for different things
        else:
            assert e.reference == () and e.response
            if e.meta["reason"] == "tool_unavailable":
                assert all(TOOLS[n].domain != e.meta["domain"] for n in e.interface.names)
                assert e.meta["unavailable_tool"] not in e.interface
            else:
                assert (e.query, e.response) in CHITCHAT
    reasons = Counter(e.meta["reason"] for e in examples if e.partition == "no_call")
    assert reasons["tool_unavailable"] > 0 and reasons["no_tool_needed"] > 0
    parallel = [e for e in examples if e.partition == "parallel"]
    assert any(len({c.name for c in e.reference}) == 1 for e in parallel)
    assert any(len({c.name for c in e.reference}) > 1 for e in parallel)


def test_fractions_are_respected():
    exs = generate_synthetic(1000, 3, parallel_fraction=0.3, no_call_fraction=0.2)
    kinds = Counter(e.partition for e in exs)
    assert abs(kinds["parallel"] / 1000 - 0.3) < 0.05 and abs(kinds["no_call"] / 1000 - 0.2) < 0.05
    for parallel, kind in ((1.0, "parallel"), (0.0, "single")):
        exs = generate_synthetic(50, 3, parallel_fraction=parallel, no_call_fraction=0.0)
        assert {e.partition for e in exs} == {kind}


def test_interface_size_range():
    exs = generate_synthetic(200, 5, tools_per_example=(4, 4), parallel_fraction=0.0)
    assert {len(e.interface) for e in exs} == {4}


def test_distractors_prefer_the_domain_when_asked():
    def same_domain_share(p):
        exs = generate_synthetic(300, 11, parallel_fraction=0.0, no_call_fraction=0.0,
                                 same_domain_distractors=p)
        n = same = 0
        for e in exs:
            dom = TOOLS[e.reference[0].name].domain
            for name in e.interface.names:
                if name != e.reference[0].name:
                    n += 1
                    same += TOOLS[name].domain == dom
        return same / n
    assert same_domain_share(1.0) > 0.6 > same_domain_share(0.0)


def test_a_narrower_catalog_restricts_every_kind_and_leaves_the_whole_one_unchanged():
    only = ("get_current_weather", "get_stock_price", "send_email", "play_song")
    exs = generate_synthetic(300, 4, tools_per_example=(2, 3), tools=only)
    assert {e.partition for e in exs} == {"single", "parallel", "no_call"}
    assert {t for e in exs for t in e.interface.names} == set(only)
    assert {c.name for e in exs for c in e.reference} == set(only)
    assert generate_synthetic(100, 4, tools=()) == generate_synthetic(100, 4)  # empty: the whole catalog
    with pytest.raises(ValueError, match="nope not in the synthetic catalog"):
        generate_synthetic(10, 0, tools=("nope",))
    with pytest.raises(ValueError, match="2 tools cannot fill interfaces of up to 3"):
        SyntheticConfig(tools=only[:2], tools_per_example=(2, 3))


def test_deterministic_per_seed_and_different_across_seeds(examples):
    again = generate_synthetic(1500, 7)
    assert again == examples
    assert generate_synthetic(100, 7) == examples[:100]  # prefix-stable
    other = generate_synthetic(100, 8)
    assert sum(a.query == b.query for a, b in zip(other, examples[:100], strict=True)) < 10
    assert len({e.id for e in examples}) == len(examples)
    assert SyntheticConfig(n=100, seed=7).generate() == examples[:100]


@pytest.mark.parametrize("kwargs", [
    {"tools_per_example": (0, 3)}, {"tools_per_example": (4, 2)}, {"tools_per_example": (2, 500)},
    {"parallel_fraction": 0.7, "no_call_fraction": 0.5}, {"no_call_fraction": -0.1},
    {"same_domain_distractors": 1.5},
])
def test_bad_options(kwargs):
    with pytest.raises(ValueError):
        generate_synthetic(10, 0, **kwargs)


def test_stats():
    st = synthetic_stats(300, 2)
    assert st["catalog_tools"] == len(catalog()) and sum(st["catalog_domains"].values()) == len(catalog())
    exs = generate_synthetic(300, 2)
    assert st["examples"] == 300 and st["kinds"] == dict(sorted(Counter(e.partition for e in exs).items()))
    assert st["calls"] == sum(len(e.reference) for e in exs)
    sizes = st["tools_per_example"]
    assert 2 <= sizes["min"] <= sizes["mean"] <= sizes["max"]


def test_canonical_round_trip(examples):
    for e in examples[:200]:
        canon, nmap = canonicalize(e)
        assert all(n.startswith("function_") for n in canon.interface.names)
        assert tuple(nmap.translate_back(c) for c in canon.reference) == e.reference


def test_the_test_split_never_repeats_a_training_item():
    import json

    from cipr.data.synthetic import TRAIN_GUARD

    def key(e):
        return e.messages[0].content, json.dumps([c.to_dict() for c in e.reference], sort_keys=True)

    trained = {key(e) for e in generate_synthetic(TRAIN_GUARD, 0, tools_per_example=(1, 2))}
    test = generate_synthetic(200, 0, split="test")
    assert len(test) == 200 and len({e.id for e in test}) == 200
    assert all(e.id.startswith("synthetic-test-0-") for e in test)
    assert not [e.id for e in test if key(e) in trained]
    assert generate_synthetic(50, 0, split="test") == test[:50]  # prefix-stable like the training stream
    assert generate_synthetic(96, 0) == generate_synthetic(200, 0)[:96]  # the training stream is unchanged


def test_training_and_evaluation_options_reach_the_generator():
    from cipr.eval.benchmarks import load_examples
    from cipr.eval.config import BenchmarkConfig, EvalConfig
    from cipr.train.data import DataConfig
    from cipr.train.data import load_examples as load_training

    narrow = ("get_current_weather", "get_stock_price", "search_news", "translate_text")
    options = {"tools_per_example": (3, 3), "parallel_fraction": 0.0, "no_call_fraction": 0.0,
               "same_domain_distractors": 0.0, "tools": narrow}
    train = load_training(DataConfig(n=40, **options))
    test = load_examples(EvalConfig(benchmark=BenchmarkConfig(name="synthetic", n=40, **options)))
    for exs in (train, test):
        assert len(exs) == 40 and {e.partition for e in exs} == {"single"}
        assert all(len(e.interface) == 3 and len(e.reference) == 1 for e in exs)
        assert {t for e in exs for t in e.interface.names} == set(narrow)
    from cipr.data.synthetic import _item_key

    assert not {_item_key(e) for e in train} & {_item_key(e) for e in test}  # never a training item
    with pytest.raises(ValueError, match="must lie in \\[0, 1\\]"):
        SyntheticConfig(parallel_fraction=0.8, no_call_fraction=0.5)


@pytest.mark.parametrize("old, new, expected", [
    ("lists:", "lists: [", "not valid YAML"),
    ("    capability: check air quality", "    capabilty: check air quality",
     "item 'domains.weather.2': Additional properties are not allowed ('capabilty' was unexpected)"),
    ("enum: *units}", "enum: celsius}", "item 'domains.weather.0.parameters.properties.units.enum'"),
    ("- Check the AQI in {city}.", "- Check the AQI in {town}.",
     "item \"tool 'get_air_quality'\", field 'intents.1': fills undeclared arguments ['town']"),
    ("- name: get_air_quality", "- name: get_current_weather", "declared twice: get_current_weather"),
    ("  word: [", "  wrd: [", "item 'pools.wrd': 'wrd' is not an argument of any tool"),
])
def test_a_malformed_catalog_names_its_file_entry_and_field(tmp_path, old, new, expected):
    from importlib import resources

    from cipr.core.errors import DataError
    from cipr.data.synthetic import CATALOG_FILE, _read

    text = resources.files("cipr.data").joinpath(CATALOG_FILE).read_text(encoding="utf-8")
    assert text.count(old) >= 1
    path = tmp_path / "catalog.yaml"
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(DataError, match="^file '" + str(path)) as err:
        _read(path)
    assert expected in str(err.value)
    path.write_text(text, encoding="utf-8")
    assert _read(path).tools == catalog()


def test_exclude_holds_back_tools_and_single_templates_and_names_bad_entries():
    held = ("get_current_weather", "get_weather_forecast#0")
    exs = generate_synthetic(300, 0, exclude=held)
    assert all("get_current_weather" not in e.interface.names for e in exs)
    used = [tuple(t) for e in exs for t in e.meta.get("templates", [])]
    assert ("get_weather_forecast", 0) not in used and ("get_weather_forecast", 1) in used
    # the default stream is untouched
    assert generate_synthetic(50, 0) == generate_synthetic(50, 0, exclude=())
    with pytest.raises(ValueError, match="names no template"):
        generate_synthetic(5, 0, exclude=("get_weather_forecast#7",))
    with pytest.raises(ValueError, match="not in the synthetic catalog"):
        generate_synthetic(5, 0, exclude=("no_such_tool",))
