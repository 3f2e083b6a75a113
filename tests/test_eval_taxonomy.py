"""Failure taxonomy on hand-built interfaces (Appendix E)."""

from __future__ import annotations

import pytest

from cipr.eval.taxonomy import classify, equivalent_descriptions, strip_annotation
from cipr.tools.interface import Call, Interface, Tool

P = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
BASE = "Get the current weather for a city."
IFACE = Interface((
    Tool("weather_lookup_fast", BASE + " Cost: $0.001 per call.", P),
    Tool("get_weather", BASE + " Cost: $0.10 per call.", P),
    Tool("get_weathr", "Translate a sentence into French.", P),
    Tool("get_time", "Current local time in a city.", P),
))
REF = (Call("weather_lookup_fast", {"city": "Rome"}),)


@pytest.mark.parametrize("a,b,same", [
    (BASE + " This tool costs $5 per call.", BASE + " This tool is free.", False),  # "free" is no cost word
    (BASE + " This tool costs $5 per call.", BASE + " This tool is cheap.", True),
    ("[cost: high] " + BASE, BASE + " [cost: low]", True),
    ("[LATENCY 2.5s] " + BASE, BASE + " (fast: ~20 ms)", True),
    (BASE, "Get the weather forecast for a city.", False),
    ("Costs a lot.", "Slow.", False),  # nothing left after stripping: not evidence of equivalence
])
def test_equivalent_descriptions(a, b, same):
    assert equivalent_descriptions(a, b) is same


def test_strip_annotation_keeps_words_not_punctuation():
    assert strip_annotation("Get the weather, for a city!  [slow]") == "get the weather for a city"


def cls(calls, correct=False, **kw):
    return classify(interface=IFACE, reference=REF, calls=calls, correct=correct, **kw)


def test_every_class():
    assert cls(REF, correct=True) == "correct"
    assert cls((), backend_error=True) == "backend_error"
    assert cls((), parse_ok=False) == "parse_failure"
    assert cls(()) == "no_call"
    assert cls(REF * 2) == "wrong_count"
    assert cls((), undeclared=("function_09",)) == "undeclared_tool"
    assert cls((Call("weather", {"city": "Rome"}),)) == "undeclared_tool"
    assert cls((Call("get_weather", {"city": "Rome"}),)) == "equivalent_tool"
    assert cls((Call("get_weathr", {"city": "Rome"}),)) == "unrelated_tool"
    assert cls((Call("get_time", {"city": "Rome"}),)) == "unrelated_tool"
    assert cls((Call("weather_lookup_fast", {"city": "Paris"}),)) == "argument_error"
    assert classify(interface=IFACE, reference=(), calls=(), correct=False) == "other"
    assert classify(interface=IFACE, reference=(), calls=REF, correct=False) == "wrong_count"


def test_parallel_calls_resolve_the_extra_name():
    ref = (Call("weather_lookup_fast", {"city": "Rome"}), Call("get_time", {"city": "Rome"}))
    calls = (Call("get_time", {"city": "Rome"}), Call("get_weather", {"city": "Rome"}))
    assert classify(interface=IFACE, reference=ref, calls=calls, correct=False) == "equivalent_tool"
    calls = (Call("get_time", {"city": "Rome"}), Call("get_weathr", {"city": "Rome"}))
    assert classify(interface=IFACE, reference=ref, calls=calls, correct=False) == "unrelated_tool"


@pytest.mark.parametrize("a,b,same", [
    ("Area of a triangle Each call to this tool costs about $0.002.",
     "Area of a triangle Each call to this tool costs about $0.04.", True),
    ("Area of a triangle This tool typically responds in about 120 milliseconds.",
     "Area of a triangle This tool typically responds in about 1.4 seconds.", True),
    ("[Cost: $0.002 per call] Translate a text", "[Cost: $0.02 per call] Get the weather", False),
    ("[Latency: 80 ms] Area of a triangle", "[Latency: 1.6 s] Area of a circle", False),
])
def test_equivalence_without_sentence_boundaries(a, b, same):
    assert equivalent_descriptions(a, b) is same
