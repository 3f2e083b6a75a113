"""Correspondence: lookups, bijection, export form, translation back, composition (hand-built)."""

from __future__ import annotations

import pytest

from cipr.perturb.correspondence import Correspondence
from cipr.tools.interface import Call


def _corr() -> Correspondence:
    # written: a_alt (equivalent of a, arg p -> q), a (costlier equivalent: added), b (equivalent of b)
    return Correspondence(names=("a_alt", "a", "b"), sources=(("a",), (), ("b",)), twin_of=(None, "a", None),
                          roles=("equivalent", "costlier", "equivalent"),
                          arguments=({"p": "q"}, {}, {"x": "x"}), source_names=("a", "b"))


def test_lookups() -> None:
    c = _corr()
    assert len(c) == 3
    assert c.equivalent(0) == "a" and c.equivalent(1) is None and c.equivalent(2) == "b"
    assert c.is_added(1) and not c.is_added(0)
    assert c.written_for("a") == (0,) and c.written_for("b") == (2,) and c.written_for("zzz") == ()


def test_action_keys_keep_added_tools_apart() -> None:
    c = _corr()
    assert c.action_key("a_alt") == "a"
    assert c.action_key("a") == "+a"
    assert c.action_key("b") == "b"
    with pytest.raises(KeyError):
        c.action_key("nope")


def test_same_name_duplicate_resolves_to_the_equivalent() -> None:
    c = Correspondence(names=("f", "g", "f"), sources=((), ("g",), ("f",)), twin_of=("f", None, None),
                       roles=("duplicate", "equivalent", "equivalent"), arguments=({}, {}, {}),
                       source_names=("g", "f"))
    assert c.action_key("f") == "f"
    assert c.to_json() == {"f": "f", "g": "g"}
    assert c.to_records()[0] == \
        {"name": "f", "sources": [], "twin_of": "f", "role": "duplicate", "arguments": {}}
    assert c.is_bijection()


def test_bijection() -> None:
    assert _corr().is_bijection()
    split = Correspondence(("a1", "a2", "b"), (("a",), ("a",), ("b",)), (None,) * 3, ("split",) * 3,
                           ({}, {}, {}), ("a", "b"))
    assert not split.is_bijection()
    merged = Correspondence(("ab",), (("a", "b"),), (None,), ("merged",), ({},), ("a", "b"))
    assert not merged.is_bijection()
    missing = Correspondence(("a",), (("a",),), (None,), ("equivalent",), ({},), ("a", "b"))
    assert not missing.is_bijection()
    foreign = Correspondence(("a", "z"), (("a",), ("z",)), (None, None), ("equivalent",) * 2,
                             ({}, {}), ("a",))
    assert not foreign.is_bijection()


def test_export_form() -> None:
    assert _corr().to_json() == {"a_alt": "a", "a": None, "b": "b"}
    merged = Correspondence(("ab", "c"), (("a", "b"), ()), (None, None), ("merged", "distractor"), ({}, {}),
                            ("a", "b"))
    assert merged.to_json() == {"ab": ["a", "b"], "c": None}


def test_translate_back() -> None:
    c = _corr()
    assert c.translate_back(Call("a_alt", {"p": 1, "extra": 2})) == Call("a", {"q": 1, "extra": 2})
    assert c.translate_back(Call("b", {"x": 3})) == Call("b", {"x": 3})
    with pytest.raises(KeyError):
        c.translate_back(Call("a", {}))


def test_compose_with_a_canonicalization() -> None:
    c = Correspondence(("function_07", "function_02"), (("function_01",), ()), (None, "function_01"),
                       ("equivalent", "twin"), ({"arg_02": "arg_01"}, {}), ("function_01",))
    back = c.compose({"function_01": "get_weather"}, {"function_01": {"arg_01": "city"}})
    assert back.sources == (("get_weather",), ())
    assert back.twin_of == (None, "get_weather")
    assert back.arguments == ({"arg_02": "city"}, {})
    assert back.source_names == ("get_weather",)
    assert back.names == c.names


def test_lengths_must_agree() -> None:
    with pytest.raises(ValueError):
        Correspondence(("a",), (("a",), ()), (None,), ("equivalent",), ({},))
