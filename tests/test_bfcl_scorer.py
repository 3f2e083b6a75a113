"""BFCL AST scorer: hand-written cases for every error class, the languages, and the paper's fix."""

from __future__ import annotations

import pytest

from cipr.formats.base import ParseResult
from cipr.scoring.bfcl import ERROR_CLASSES, score_bfcl, standardize
from cipr.scoring.bfcl_literals import read_java, read_js, write_java, write_js
from cipr.tools.canonical import canonicalize
from cipr.tools.interface import Call, Example, Interface, Message, Tool
from cipr.tools.schema import normalize_schema


def _tool(name, props, required=(), language="python", description=""):
    raw = {"type": "dict", "properties": props, "required": list(required)}
    return Tool(name, description, normalize_schema(raw, language=language))


WEATHER = _tool("get_weather", {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]},
                                "days": {"type": "integer"}, "ratio": {"type": "float"},
                                "detailed": {"type": "boolean"}}, required=["city"])
STOCK = _tool("get_stock", {"company": {"type": "string"}, "date": {"type": "string"}}, required=["company"])


def _example(tools, reference, accepted, language="python", **kw):
    return Example(id="hand_1", messages=(Message("user", "q"),), interface=Interface(tuple(tools)),
                   reference=tuple(reference), accepted=tuple(accepted), source="bfcl",
                   meta={"language": language}, **kw)


W_ACC = {"city": ["Paris", "Paris, France"], "unit": ["c", ""], "days": [3], "ratio": [0.5, ""]}
W_EX = _example([WEATHER, STOCK], [Call("get_weather", {"city": "Paris", "days": 3})], [W_ACC])


def _score(args, name="get_weather", ex=W_EX, **kw):
    return score_bfcl([Call(name, args)], ex, **kw)


def test_correct_calls():
    assert _score({"city": "Paris", "days": 3}).correct
    assert _score({"city": "paris,france", "days": 3, "unit": "C"}).correct  # normalized strings
    assert _score({"city": "Paris", "days": 3, "ratio": 0.5}).correct
    assert _score({"days": 3, "city": "PARIS"}).correct  # argument order is free


def test_string_normalization():
    assert standardize("Paris, France") == "parisfrance"
    assert standardize("It's 1/2-3_4*5^6.") == 'it"s123456'


@pytest.mark.parametrize(("calls", "error"), [
    ([], "no_call"),
    ([Call("get_weather", {"city": "Paris", "days": 3})] * 2, "wrong_count"),
    ([Call("get_stock", {"company": "Paris"})], "wrong_name"),
    ([Call("get_weather", {"days": 3})], "missing_argument"),  # required by the schema
    ([Call("get_weather", {"city": "Paris"})], "missing_argument"),  # listed without the optional marker ""
    ([Call("get_weather", {"city": "Paris", "days": 3, "hour": 9})], "extra_argument"),  # not declared
    ([Call("get_weather", {"city": "Paris", "days": 3, "detailed": True})],
     "extra_argument"),  # declared, unlisted
    ([Call("get_weather", {"city": "Paris", "days": "3"})], "wrong_type"),
    ([Call("get_weather", {"city": "Paris", "days": True})], "wrong_type"),  # bool is not int
    ([Call("get_weather", {"city": "Paris", "days": 3.0})], "wrong_type"),  # float is not int
    ([Call("get_weather", {"city": 7, "days": 3})], "wrong_type"),
    ([Call("get_weather", {"city": "Rome", "days": 3})], "wrong_value"),
    ([Call("get_weather", {"city": "Paris", "days": 4})], "wrong_value"),
    ([Call("get_weather", {"city": "Paris", "days": 3, "unit": "k"})], "wrong_value"),
])
def test_error_classes(calls, error):
    verdict = score_bfcl(calls, W_EX)
    assert not verdict.correct and verdict.error == error and verdict.detail
    assert error in ERROR_CLASSES


def test_parse_failures_are_passed_in():
    v = score_bfcl(ParseResult(calls=(), ok=False, error="invalid JSON in <tool_call>"), W_EX)
    assert (v.correct, v.error, v.detail) == (False, "parse_failure", "invalid JSON in <tool_call>")
    assert score_bfcl([Call("get_weather", {"city": "Paris", "days": 3})], W_EX, parse_error="x").error == \
        "parse_failure"
    assert score_bfcl(ParseResult(calls=(Call("get_weather", {"city": "Paris", "days": 3}),)), W_EX).correct


def test_int_passes_for_float():
    assert _score({"city": "Paris", "days": 3, "ratio": 0.5}).correct
    ex = _example([WEATHER], [Call("get_weather", {"city": "Paris", "ratio": 2.0})],
                  [{"city": ["Paris"], "ratio": [2.0]}])
    assert _score({"city": "Paris", "ratio": 2}, ex=ex).correct
    assert _score({"city": "Paris", "ratio": "2"}, ex=ex).error == "wrong_type"


def test_parallel_calls_in_any_order():
    acc = [{"company": ["Apple"], "date": ["2022-01-01"]}, {"company": ["Microsoft"], "date": ["2022-01-01"]}]
    ref = [Call("get_stock", {"company": "Apple", "date": "2022-01-01"}),
           Call("get_stock", {"company": "Microsoft", "date": "2022-01-01"})]
    ex = _example([STOCK], ref, acc)
    assert score_bfcl(ref, ex).correct and score_bfcl(ref[::-1], ex).correct
    wrong = [ref[0], Call("get_stock", {"company": "Microsoft", "date": "2023-01-01"})]
    v = score_bfcl(wrong, ex)
    assert v.error == "wrong_value" and v.detail.startswith("reference call 1") and "2023-01-01" in v.detail
    assert score_bfcl(ref[:1], ex).error == "wrong_count"


def test_parallel_matching_is_not_greedy():
    # the first reference accepts both companies (as in BFCL's parallel_178): a greedy matcher that gives
    # the first predicted call (Apple) to it leaves the second reference (Apple only) without a partner
    acc = [{"company": ["Microsoft", "Apple"]}, {"company": ["Apple"]}]
    ex = _example([STOCK],
                  [Call("get_stock", {"company": "Microsoft"}), Call("get_stock", {"company": "Apple"})], acc)
    assert score_bfcl([Call("get_stock", {"company": "Apple"}), Call("get_stock", {"company": "Microsoft"})],
                      ex).correct


def test_nested_dict_and_list_of_dicts():
    tool = _tool("order", {"options": {"type": "dict", "properties": {"size": {"type": "string"},
                                                                     "extra": {"type": "integer"}}},
                           "items": {"type": "array", "items": {"type": "dict"}}})
    acc = {"options": [{"size": ["Large", "L"], "extra": [1, ""]}],
           "items": [[{"name": ["tea"], "qty": [2]}, {"name": ["cake"], "qty": [1]}]]}
    ex = _example([tool], [Call("order", {"options": {"size": "Large"},
                                          "items": [{"name": "tea", "qty": 2}, {"name": "cake", "qty": 1}]})],
                  [acc])
    ok_items = [{"name": "Tea", "qty": 2}, {"name": "cake", "qty": 1}]
    assert _score({"options": {"size": "l", "extra": 1}, "items": ok_items}, "order", ex).correct
    assert _score({"options": {"size": "XL"}, "items": ok_items}, "order", ex).error == "wrong_value"
    assert _score({"options": {"size": "L", "color": 1}, "items": ok_items}, "order", ex).error == \
        "wrong_value"
    # missing key
    assert _score({"options": {"extra": 1}, "items": ok_items}, "order", ex).error == "wrong_value"
    # order
    assert _score({"options": {"size": "L"}, "items": ok_items[::-1]}, "order", ex).error == "wrong_value"
    assert _score({"options": {"size": "L"}, "items": ok_items[:1]}, "order", ex).error == "wrong_value"
    assert _score({"options": "L", "items": ok_items}, "order", ex).error == "wrong_type"


def test_lists_compare_elementwise_after_normalization():
    tool = _tool("tag", {"tags": {"type": "array", "items": {"type": "string"}},
                         "nums": {"type": "array", "items": {"type": "integer"}}})
    ex = _example([tool], [Call("tag", {"tags": ["New York", "LA"], "nums": [1, 2]})],
                  [{"tags": [["New York", "LA"]], "nums": [[1, 2]]}])
    assert _score({"tags": ["new york", "la"], "nums": [1, 2]}, "tag", ex).correct
    assert _score({"tags": ["LA", "New York"], "nums": [1, 2]}, "tag", ex).error == "wrong_value"
    assert _score({"tags": ["New York", "LA"], "nums": [1, "2"]}, "tag", ex).error == "wrong_type"
    # BFCL quirk kept: an optional marker among the accepted lists makes the element type check vacuous
    optional = _example([tool], [Call("tag", {"tags": ["a"]})], [{"tags": [["a"]], "nums": [[1, 2], ""]}])
    assert _score({"tags": ["a"], "nums": [1, "2"]}, "tag", optional).error == "wrong_value"


def test_variable_names_among_accepted_values():
    # BFCL writes a variable as a string among the accepted values of a typed parameter
    tool = _tool("plot", {"data": {"type": "array", "items": {"type": "float"}}})
    ex = _example([tool], [Call("plot", {"data": "points"})], [{"data": ["points"]}])
    assert _score({"data": "points"}, "plot", ex).correct
    assert _score({"data": "Points"}, "plot", ex).error == "wrong_value"  # variables compare exactly


def test_no_call_expected_and_exact_examples():
    ex = Example(id="x", messages=(), interface=Interface((STOCK,)), reference=())
    assert score_bfcl([], ex).correct
    assert score_bfcl([Call("get_stock", {"company": "A"})], ex).error == "wrong_count"
    exact = Example(id="y", messages=(), interface=Interface((STOCK,)),
                    reference=(Call("get_stock", {"company": "Apple"}),),
                    alternatives=((Call("get_stock", {"company": "AAPL"}),),))
    assert score_bfcl([Call("get_stock", {"company": "apple"})], exact).correct
    assert score_bfcl([Call("get_stock", {"company": "AAPL"})], exact).correct
    assert score_bfcl([Call("get_stock", {"company": "Apple", "date": "x"})], exact).error == "extra_argument"


# ------------------------------------------------------------------ the paper's fix (duplicates)

def test_same_name_duplicate_any_declaration_permits():
    # a same-name duplicate whose schema is corrupted: it requires an argument the task does not need
    corrupted = _tool("get_weather", {"city": {"type": "string"}, "unit": {"type": "string"},
                                      "days": {"type": "integer"}}, required=["city", "unit"],
                      description="Weather (deprecated).")
    ex = _example([corrupted, WEATHER, STOCK], [Call("get_weather", {"city": "Paris", "days": 3})], [W_ACC])
    good = [Call("get_weather", {"city": "Paris", "days": 3})]
    assert score_bfcl(good, ex).correct
    # the released checker's behaviour: only the first declaration of the name counts
    v = score_bfcl(good, ex, any_declaration=False)
    assert not v.correct and v.error == "missing_argument" and "'unit'" in v.detail
    # an invalid call is still rejected, with the first declaration's error
    assert score_bfcl([Call("get_weather", {"city": "Paris"})], ex).error == "missing_argument"
    assert score_bfcl([Call("get_weather", {"city": "Rome", "days": 3})], ex).error == "missing_argument"
    assert score_bfcl([Call("get_weather", {"city": "Rome", "days": 3, "unit": "c"})], ex).error == \
        "wrong_value"


def test_validates_against_the_tool_the_reference_names():
    # a tool added in front of a single-tool item must not become the schema the call is checked against
    ex = _example([STOCK, WEATHER], [Call("get_weather", {"city": "Paris", "days": 3})], [W_ACC])
    assert score_bfcl([Call("get_weather", {"city": "Paris", "days": 3})], ex).correct
    assert score_bfcl([Call("get_stock", {"company": "Paris"})], ex).error == "wrong_name"


def test_renamed_interface_still_scores():
    canon, nmap = canonicalize(W_EX)
    assert canon.reference[0].name == "function_01"
    assert score_bfcl(canon.reference, canon).correct
    assert score_bfcl([Call("function_01", {"arg_01": "paris, france", "arg_03": 3})], canon).correct
    assert score_bfcl([Call("function_01", {"arg_01": "Rome", "arg_03": 3})], canon).error == "wrong_value"
    assert score_bfcl([Call("function_02", {"arg_01": "Paris"})], canon).error == "wrong_name"


def test_reference_naming_an_undeclared_tool_is_an_error():
    ex = _example([STOCK], [Call("get_weather", {"city": "Paris"})], [{"city": ["Paris"]}])
    with pytest.raises(ValueError, match="does not declare"):
        score_bfcl([Call("get_weather", {"city": "Paris"})], ex)


# -------------------------------------------------------------------------------- Java / JavaScript

def _java_example():
    props = {"ids": {"type": "ArrayList", "items": {"type": "long"}}, "limit": {"type": "long"},
             "ok": {"type": "boolean"}, "name": {"type": "String"}, "env": {"type": "HashMap"},
             "ratio": {"type": "double"}, "parts": {"type": "ArrayList", "items": {"type": "any"}},
             "vars": {"type": "HashMap"}}
    tool = _tool("Svc.update", props, required=["ids"], language="java")
    acc = {"ids": [[101, 202]], "limit": [5, ""], "ok": [True, ""], "name": ["Alpha Beta", ""],
           "env": [{"MODE": ["fast"]}, ""], "ratio": [0.5, ""], "parts": [["a", 1, True], ""],
           "vars": ["envVars", ""]}
    return _example([tool], [Call("Svc.update", {"ids": "new ArrayList<Long>(Arrays.asList(101L, 202L))"})],
                    [acc], language="java")


@pytest.mark.parametrize(("args", "error"), [
    ({"ids": "new ArrayList<Long>(Arrays.asList(101L, 202L))"}, None),
    ({"ids": "new ArrayList<>() {{ add(101L); add(202L); }}", "limit": "5L", "ok": "true"}, None),
    ({"ids": "new ArrayList<Long>(Arrays.asList(101L, 202L))", "name": "alpha beta", "ratio": "0.5"}, None),
    ({"ids": "new ArrayList<Long>(Arrays.asList(101L, 202L))",
      "env": 'new HashMap<String, String>() {{ put("MODE", "fast"); }}'}, None),
    ({"ids": "new ArrayList<Long>(Arrays.asList(101L, 202L))", "vars": "envVars"}, None),  # a variable
    ({"ids": "new ArrayList<Long>(Arrays.asList(101L, 202L))", "vars": "envvars"}, "wrong_value"),  # exact
    ({"ids": "new ArrayList<Long>(Arrays.asList(101L, 202L))", "env": "envVars"},
     "wrong_type"),  # not a variable
    ({"ids": 'new ArrayList<Object>(Arrays.asList("a", 1, true))', "parts": 'new ArrayList<Object>('
      'Arrays.asList("a", 1, true))'}, "wrong_type"),  # ids holds strings and numbers, not longs
    ({"ids": "new ArrayList<Long>(Arrays.asList(101L, 202L))",
      "parts": 'new ArrayList<Object>(Arrays.asList("a", 1, true))'}, None),  # difference 5: Java values
    ({"ids": "new ArrayList<Long>(Arrays.asList(101L, 202L))", "limit": "5"}, "wrong_type"),  # no L suffix
    ({"ids": "new ArrayList<Long>(Arrays.asList(101L, 202L))", "limit": 5}, "wrong_type"),  # not source text
    ({"ids": "new ArrayList<Long>(Arrays.asList(101L, 303L))"}, "wrong_value"),
    ({"ids": "new ArrayList<Long>(Arrays.asList(101L, 202L))", "ok": "false"}, "wrong_value"),
    ({"ids": "new ArrayList<Long>(Arrays.asList(101L, 202L))", "name": '"Alpha Beta"'}, "wrong_value"),
])
def test_java_values_are_source_literals(args, error):
    v = score_bfcl([Call("Svc.update", args)], _java_example())
    assert v.error == error, v.detail


@pytest.mark.parametrize(("args", "error"), [
    ({"name": '"Bob"', "scores": "[1.5, 2]", "big": "12n", "flag": "true", "opts": "{depth: 2, mode: 'x'}"},
     None),
    ({"name": "'bob'", "scores": "new Array(1.5, 2)"}, None),
    ({"name": "Bob", "scores": "[1.5, 2.0]"}, None),
    ({"name": '"Bob"', "scores": "[1.5, 2]", "big": "12"}, "wrong_type"),
    ({"name": '"Bob"', "scores": "1.5, 2"}, "wrong_type"),
    ({"name": '"Bob"', "scores": "[1.5, 3]"}, "wrong_value"),
    ({"name": '"Bob"', "scores": "[1.5, 2]", "opts": "{depth: 3}"}, "wrong_value"),
    ({"name": '"Bob"', "scores": "[1.5, 2]", "flag": True}, "wrong_type"),
])
def test_javascript_values_are_source_literals(args, error):
    props = {"name": {"type": "String"}, "scores": {"type": "array", "items": {"type": "float"}},
             "big": {"type": "Bigint"}, "flag": {"type": "Boolean"}, "opts": {"type": "dict"}}
    tool = _tool("rank", props, required=["name", "scores"], language="javascript")
    acc = {"name": ["Bob"], "scores": [[1.5, 2.0]], "big": [12, ""], "flag": [True, ""],
           "opts": [{"depth": [2], "mode": ["x", ""]}, ""]}
    ex = _example([tool], [Call("rank", {"name": '"Bob"', "scores": "[1.5, 2.0]"})], [acc],
                  language="javascript")
    v = score_bfcl([Call("rank", args)], ex)
    assert v.error == error, v.detail


@pytest.mark.parametrize(("value", "java_type", "nested"), [
    (5, "long", None), (-3, "integer", None), (2.5, "float", None), (1e-05, "double", None),
    (True, "boolean", None), ("any text", "String", None), ([1, 2, 3], "Array", "integer"),
    (["a b", "c"], "ArrayList", "String"), ([7, 8], "ArrayList", "long"),
    ({"k": 1, "s": "v", "b": False}, "HashMap", None), ([], "ArrayList", "integer"),
    (["x", 2, True], "ArrayList", "any"), ("myVariable", "HashMap", None),
])
def test_java_literals_round_trip(value, java_type, nested):
    assert read_java(write_java(value, java_type, nested), java_type, nested) == value


@pytest.mark.parametrize(("value", "js_type", "nested"), [
    ("it's", "String", None), ('say "hi"', "String", None), (3, "integer", None), (1e-05, "float", None),
    (2.5, "float", None), (12, "Bigint", None), (False, "Boolean", None), ([1.5, 2.0], "array", "float"),
    (["a", "b"], "array", "String"), ([[1, 2], [3, 4]], "array", "array"), ({"a": 1, "b": "x"}, "dict", None),
    ({"list": ["p", "q"], "n": 2}, "dict", None), ("someVar", "dict", None),
])
def test_javascript_literals_round_trip(value, js_type, nested):
    assert read_js(write_js(value, js_type, nested), js_type, nested) == value


def test_bfcl_reader_quirks_are_kept():
    # text of the wrong form stays text (so the type check reports it)
    assert read_java("5", "long") == "5" and read_java("yes", "boolean") == "yes"
    assert read_js("1e5", "float") == "1e5"
    # Array<String> keeps quotes in BFCL's reader; ArrayList<String> strips them
    assert read_java('new String[]{"a", "b"}', "Array", "String") == ['"a"', '"b"']
    assert read_java('new ArrayList<String>(Arrays.asList("a", "b"))', "ArrayList", "String") == ["a", "b"]
    # a collection of `any`: BFCL keeps each element's source text; we read Java values (difference 5)
    assert read_java('new ArrayList<>(Arrays.asList("a", 1))', "ArrayList", "any", nested_any_values=False) \
        == ['"a"', "1"]
    assert read_java('new ArrayList<>(Arrays.asList("a", 1))', "ArrayList", "any") == ["a", 1]


def test_real_references_score_correct_under_original_and_canonical_names(shared_data):
    """Renaming tools and arguments rewrites the Example; the scorer follows (all 2,501 items)."""
    from cipr.data.bfcl import load_bfcl

    wrong = []
    for ex in load_bfcl(shared_data):
        canon, nmap = canonicalize(ex)
        if not (score_bfcl(ex.reference, ex).correct and score_bfcl(canon.reference, canon).correct):
            wrong.append(ex.id)
        elif len(canon.reference) == 1 and score_bfcl([Call(nmap.forward[ex.reference[0].name] + "x",
                                                            canon.reference[0].arguments)], canon).correct:
            wrong.append(ex.id)
    assert wrong == []
