"""Canonicalization adapter: ids by position, mapping applied everywhere, exact translation back."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from perturb_examples import booking_example, booking_texts, tool_texts

from cipr.tools.canonical import (
    UndeclaredToolError,
    canonical_tool_id,
    canonicalize,
    canonicalize_interface,
    rewrite_text,
    rewrite_tool_text,
)
from cipr.tools.interface import Call, Example, Interface, Message, Tool


def _weather_example() -> Example:
    tools = (
        Tool("get_weather", "Weather for a city.", {"type": "object", "properties": {
            "city": {"type": "string"}, "date": {"type": "string"}}, "required": ["city"]}),
        Tool("search", "Web search.", {"type": "object", "properties": {"q": {"type": "string"}}}),
    )
    return Example(
        id="w1",
        messages=(Message("system", "Use get_weather when asked."),
                  Message("user", "search the weather in Paris"),
                  Message("assistant", "", (Call("get_weather", {"city": "Rome"}),)),
                  Message("tool", "sunny", name="get_weather"), Message("user", "and Paris?")),
        interface=Interface(tools),
        reference=(Call("get_weather", {"city": "Paris", "date": "today"}),),
        accepted=({"city": ("Paris",), "date": ("today", "")},),
    )


def test_ids_descriptions_types_required_values_stay():
    ex, nmap = canonicalize(_weather_example())
    t0, t1 = ex.interface
    assert (t0.name, t1.name) == ("function_01", "function_02")
    assert t0.description == "Weather for a city."
    assert t0.parameters == {"type": "object", "properties": {"arg_01": {"type": "string"},
                                                              "arg_02": {"type": "string"}},
                             "required": ["arg_01"]}
    assert ex.reference == (Call("function_01", {"arg_01": "Paris", "arg_02": "today"}),)
    assert ex.accepted == ({"arg_01": ("Paris",), "arg_02": ("today", "")},)
    # earlier turns: calls and tool-result names are mapped; text keeps the English word "search"
    assert ex.messages[0].content == "Use function_01 when asked."
    assert ex.messages[1].content == "search the weather in Paris"
    assert ex.messages[2].calls == (Call("function_01", {"arg_01": "Rome"}),)
    assert ex.messages[3].name == "function_01"
    assert nmap.backward == {"function_01": "get_weather", "function_02": "search"}


def test_translate_back_and_undeclared_refused():
    ex, nmap = canonicalize(_weather_example())
    assert nmap.translate_back(ex.reference[0]) == _weather_example().reference[0]
    with pytest.raises(UndeclaredToolError, match="function_03"):
        nmap.translate_back(Call("function_03", {}))
    with pytest.raises(UndeclaredToolError):  # an original name is not a canonical one: never guessed
        nmap.translate_back(Call("get_weather", {}))
    calls, errors = nmap.translate_calls([Call("function_02", {"arg_01": "x"}), Call("rm_rf", {})])
    assert calls == (Call("search", {"q": "x"}),)
    assert len(errors) == 1 and "rm_rf" in errors[0]


def test_unknown_argument_passes_through():
    _, nmap = canonicalize(_weather_example())
    assert nmap.translate_back(Call("function_01", {"arg_09": 1})) == Call("get_weather", {"arg_09": 1})


def test_rewrite_text_modes():
    m = {"search": "function_02", "math.factorial": "function_01"}
    assert rewrite_text("search math.factorial(5)", m) == "search function_01(5)"
    assert rewrite_text("search math.factorial(5)", m, "all") == "function_02 function_01(5)"
    assert rewrite_text("research math.factorials", m, "all") == "research math.factorials"
    assert rewrite_text("search", m, "none") == "search"


def test_id_width_grows_past_99_tools():
    assert canonical_tool_id(0, 12) == "function_01"
    assert canonical_tool_id(99, 120) == "function_100"
    assert canonical_tool_id(0, 120) == "function_001"


def test_duplicate_names_get_distinct_ids_and_translate_to_the_same_name():
    iface = Interface((Tool("f", "a"), Tool("f", "b")))
    canon, nmap = canonicalize_interface(iface)
    assert canon.names == ("function_01", "function_02")
    assert {nmap.translate_back(Call(c)).name for c in canon.names} == {"f"}


_names = st.from_regex(r"[A-Za-z][A-Za-z0-9_.]{0,14}", fullmatch=True)
_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                       lambda c: (st.lists(c, max_size=3)
                                  | st.dictionaries(st.text(max_size=4), c, max_size=3)),
                       max_leaves=6)


@st.composite
def _examples(draw):
    names = draw(st.lists(_names, min_size=1, max_size=8, unique=True))
    tools = []
    for n in names:
        args = draw(st.lists(_names, max_size=5, unique=True))
        tools.append(Tool(n, draw(st.text(max_size=20)), {"type": "object", "properties": {
            a: {"type": "string"} for a in args}, "required": args[:1]}))
    calls = []
    for _ in range(draw(st.integers(0, 3))):
        t = draw(st.sampled_from(tools))
        calls.append(Call(t.name, {a: draw(_values) for a in t.properties}))
    query = " ".join(draw(st.lists(st.sampled_from(names + ["please", "the"]), max_size=6)))
    return Example("h", (Message("user", query),), Interface(tuple(tools)), tuple(calls))


@settings(max_examples=150, deadline=None)
@given(_examples())
def test_round_trip_property(ex):
    canon, nmap = canonicalize(ex)
    assert [nmap.translate_back(c) for c in canon.reference] == list(ex.reference)
    assert all(n.startswith("function_") for n in canon.interface.names)
    for t, ct in zip(ex.interface, canon.interface, strict=True):
        assert ct.description == t.description
        assert [v for v in ct.properties.values()] == [v for v in t.properties.values()]
        assert all(a.startswith("arg_") for a in ct.properties)
    # no original identifier-like tool name survives in the query as a whole word
    for name in ex.interface.names:
        if "_" in name or "." in name or any(ch.isdigit() for ch in name):
            assert rewrite_text(canon.query, {name: "X"}) == canon.query or name.startswith("function_")


def test_round_trip_on_all_bfcl_items(shared_data):
    from cipr.data.bfcl import load_bfcl

    items = load_bfcl(shared_data)
    assert len(items) == 2501
    for ex in items:
        canon, nmap = canonicalize(ex)
        assert [nmap.translate_back(c) for c in canon.reference] == list(ex.reference), ex.id
        # accepted-values lists survive under canonical argument ids, value for value
        for orig, can, call in zip(ex.accepted, canon.accepted, ex.reference, strict=True):
            amap = nmap.forward_args(call.name)
            assert {amap.get(k, k): v for k, v in orig.items()} == dict(can), ex.id


def test_schema_titles_that_spell_the_original_names_are_dropped():
    tool = Tool("get_reservation_details", "Details of a reservation.", {
        "type": "object", "title": "GetReservationDetails", "required": ["reservation_id"],
        "properties": {"reservation_id": {"type": "string", "title": "Reservation Id",
                                          "description": "The id, e.g. 'ZFA04Y'."},
                       "extra": {"type": "object",
                                 "properties": {"note": {"type": "string", "title": "Note"}}}}})
    canon, _ = canonicalize_interface(Interface((tool,)))
    params = canon[0].parameters
    assert params == {"type": "object", "required": ["arg_01"], "properties": {
        "arg_01": {"type": "string", "description": "The id, e.g. 'ZFA04Y'."},
        "arg_02": {"type": "object", "properties": {"note": {"type": "string", "title": "Note"}}}}}
    assert "Reservation" not in str(params) and "GetReservation" not in str(params)
    # the input is not changed
    assert tool.parameters["properties"]["reservation_id"]["title"] == "Reservation Id"


def test_tool_names_in_descriptions_are_rewritten_as_text_is():
    ex = booking_example()
    canon, _ = canonicalize(ex)
    assert [tool_texts(t) for t in canon.interface] == booking_texts("function_01", "function_02")
    book = canon.interface[1].parameters["properties"]
    assert list(book) == ["arg_01", "arg_02", "arg_03"] and list(book["arg_03"]["properties"]) == ["name"]
    assert book["arg_02"]["enum"] == ["search_flights", "agent"]  # a value, not a mention
    assert canon.query == "Book UA512 for Dana Reyes; I found it with function_01."
    # mode "all" also renames the plain word `search`; mode "none" leaves every text as it was
    every = canonicalize(ex, "all")[0].interface
    assert every[1].description == "Book a seat on a flight found by function_01 (not by function_03)."
    assert every[2].description == "Web function_03, not for flights (use function_01)."
    assert [tool_texts(t) for t in canonicalize(ex, "none")[0].interface] == \
        [tool_texts(t) for t in ex.interface]
    # the input is not changed
    assert ex.interface[1].description.endswith("by search_flights (not by search).")


def test_rewrite_tool_text_renames_simultaneously():
    tool = Tool("a_tool", "Call b_tool before a_tool.", {"type": "object", "properties": {
        "x": {"type": "array", "description": "Ids from a_tool.",
              "items": {"type": "string", "description": "One b_tool id."}}}})
    out = rewrite_tool_text(tool, {"a_tool": "b_tool", "b_tool": "a_tool"})
    assert out.name == "a_tool" and out.description == "Call a_tool before b_tool."
    assert out.parameters["properties"]["x"] == {"type": "array", "description": "Ids from b_tool.",
                                                 "items": {"type": "string", "description": "One a_tool id."}}
    assert rewrite_tool_text(tool, {"a_tool": "z"}, "none") is tool


def test_every_renaming_by_name_map_rewrites_tool_text():
    """Function masking, distillation's synonym / swap renamings and the serving adapter use the same rule."""
    from cipr.distill.naming import rename_example
    from cipr.serve.conversation import canonical_request
    from cipr.train.data import mask_example

    ex = booking_example()
    masked, nmap = mask_example(ex, seed=0)
    assert [tool_texts(t) for t in masked.interface] == booking_texts(nmap.forward["search_flights"],
                                                                      nmap.forward["book_flight"])
    swapped, _ = rename_example(ex, {"search_flights": "book_flight", "book_flight": "search_flights"},
                                "identifiers")
    assert swapped.interface.names == ("book_flight", "search_flights", "search")
    assert swapped.interface[0].description == "Find flights; book one with search_flights."
    assert swapped.interface[1].description == "Book a seat on a flight found by book_flight (not by search)."
    body = {"model": "m", "tools": ex.interface.to_openai(),
            "messages": [{"role": "user", "content": ex.query}]}
    request, _ = canonical_request(body)
    fns = [t["function"] for t in request["tools"]]
    assert fns[1]["description"] == "Book a seat on a flight found by function_01 (not by search)."
    assert fns[1]["parameters"]["properties"]["arg_01"]["description"] == "An id from function_01 results."
    assert body["tools"][1]["function"]["description"].endswith("found by search_flights (not by search).")
