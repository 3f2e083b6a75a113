"""Hand-built and generated Examples shared by the perturbation tests (not a test module)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from cipr.tools.interface import Call, Example, Interface, Message, Tool

WEATHER = Tool("get_weather", "Returns the current weather for a city.", {
    "type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "City name."},
        "units": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Temperature units."},
        "days": {"type": "number", "description": "How many days to forecast."},
        "detailed": {"type": "boolean", "description": "Whether to include details."}}})
FLIGHTS = Tool("search_flights", "Searches flights between two airports.", {
    "type": "object", "required": ["origin", "destination"], "properties": {
        "origin": {"type": "string", "description": "IATA code of the departure airport."},
        "destination": {"type": "string", "description": "IATA code of the arrival airport."}}})
AREA = Tool("calculate_triangle_area", "Calculates the area of a triangle from its base and height.", {
    "type": "object", "required": ["base", "height"], "properties": {
        "base": {"type": "integer", "description": "Base length."},
        "height": {"type": "integer", "description": "Height."}}})


def weather_example() -> Example:
    """One call to get_weather (with an enum, a number and a boolean argument) among two tools."""
    return Example(
        "hand_weather", (Message("user", "What's the weather like in San Francisco in celsius for the next 3 "
                                         "days? Please include every detail you have."),),
        Interface((FLIGHTS, WEATHER)),
        (Call("get_weather", {"city": "San Francisco", "units": "celsius", "days": 3, "detailed": True}),),
        accepted=({"city": ("San Francisco", "SF"), "units": ("celsius",), "days": (3,),
                   "detailed": (True,)},),
        source="test", partition="simple_python", meta={"language": "python"})


def parallel_example() -> Example:
    """Two calls to two different tools (parallel_multiple style) among three tools."""
    return Example(
        "hand_parallel", (Message("user", "Find flights from SFO to JFK and compute the area of a triangle "
                                          "with base 10 and height 5."),),
        Interface((WEATHER, FLIGHTS, AREA)),
        (Call("search_flights", {"origin": "SFO", "destination": "JFK"}),
         Call("calculate_triangle_area", {"base": 10, "height": 5})),
        accepted=({"origin": ("SFO",), "destination": ("JFK",)}, {"base": (10,), "height": (5,)}),
        source="test", partition="parallel_multiple", meta={"language": "python"})


def booking_example() -> Example:
    """Tools whose text names other tools: in descriptions, argument descriptions (a nested one too) and an
    enum value (data, never renamed); `search` is a plain-word name, `get_airport_code` is not declared."""
    flights = Tool("search_flights", "Find flights; book one with book_flight.", {
        "type": "object", "required": ["origin"], "properties": {
            "origin": {"type": "string", "description": "IATA code, as get_airport_code returns it."}}})
    book = Tool("book_flight", "Book a seat on a flight found by search_flights (not by search).", {
        "type": "object", "required": ["flight_id"], "properties": {
            "flight_id": {"type": "string", "description": "An id from search_flights results."},
            "via": {"type": "string", "enum": ["search_flights", "agent"],
                    "description": "Where the id came from."},
            "passenger": {"type": "object", "description": "Who flies.", "properties": {
                "name": {"type": "string", "description": "As booked, not as in search_flights."}}}}})
    search = Tool("search", "Web search, not for flights (use search_flights).", {
        "type": "object", "properties": {"q": {"type": "string", "description": "Query."}}})
    return Example(
        "hand_booking", (Message("user", "Book UA512 for Dana Reyes; I found it with search_flights."),),
        Interface((flights, book, search)),
        (Call("book_flight", {"flight_id": "UA512", "via": "search_flights"}),),
        accepted=({"flight_id": ("UA512",), "via": ("search_flights",)},), source="test",
        partition="simple_python", meta={"language": "python"})


BOOKING_TEXT = {
    "search_flights": ["Find flights; book one with {book}.", "IATA code, as get_airport_code returns it."],
    "book_flight": ["Book a seat on a flight found by {flights} (not by search).",
                    "An id from {flights} results.", "Where the id came from.", "Who flies.",
                    "As booked, not as in {flights}."],
    "search": ["Web search, not for flights (use {flights}).", "Query."],
}
"""`tool_texts` of each booking_example tool after a renaming of identifier-like names, `{flights}` and
`{book}` standing for the new names of search_flights and book_flight."""


def booking_texts(flights: str, book: str) -> list[list[str]]:
    """The `tool_texts` of booking_example's tools, in order, with search_flights and book_flight renamed."""
    return [[x.format(flights=flights, book=book) for x in BOOKING_TEXT[name]]
            for name in ("search_flights", "book_flight", "search")]


def tool_texts(tool: Tool) -> list[str]:
    """A tool's description and every description in its parameter schema, depth first."""
    out = [tool.description]

    def walk(schema: Any) -> None:
        for key, value in schema.items():
            if key == "description" and isinstance(value, str):
                out.append(value)
            elif key == "properties":
                for sub in value.values():
                    walk(sub)

    walk(tool.parameters)
    return out


_TYPES = ("string", "integer", "number", "boolean", "enum")
_VALUES: dict[str, Any] = {"string": st.text("abcdefgh ", min_size=1, max_size=8).map(str.strip).filter(bool),
                           "integer": st.integers(-50, 50), "number": st.floats(-9, 9, allow_nan=False),
                           "boolean": st.booleans(), "enum": st.sampled_from(["red", "green", "blue"])}


@st.composite
def examples(draw: st.DrawFn) -> Example:
    """A random interface (1-4 tools, 0-4 arguments of mixed types) and 1-2 reference calls."""
    n_tools = draw(st.integers(1, 4))
    names = draw(st.lists(st.sampled_from(["alpha", "beta_tool", "get_gamma", "DeltaApi", "eps.run", "zeta"]),
                          min_size=n_tools, max_size=n_tools, unique=True))
    tools = []
    for name in names:
        n_args = draw(st.integers(0, 4))
        args = draw(st.lists(st.sampled_from(["x", "y_value", "zName", "w", "count", "city"]),
                             min_size=n_args, max_size=n_args, unique=True))
        props = {}
        for a in args:
            t = draw(st.sampled_from(_TYPES))
            props[a] = {"type": "string", "enum": ["red", "green", "blue"]} if t == "enum" else {"type": t}
        required = [a for a in args if draw(st.booleans())]
        tools.append(Tool(name, f"Does the {name} thing.", {"type": "object", "properties": props,
                                                            "required": required}))
    calls, accepted = [], []
    for _ in range(draw(st.integers(1, 2))):
        tool = draw(st.sampled_from(tools))
        args = {}
        for a, s in tool.properties.items():
            if a in tool.required or draw(st.booleans()):
                args[a] = draw(_VALUES["enum" if "enum" in s else s["type"]])
        calls.append(Call(tool.name, args))
        accepted.append({a: (v,) for a, v in args.items()})
    return Example("gen", (Message("user", "Please do it."),), Interface(tuple(tools)), tuple(calls),
                   accepted=tuple(accepted), source="test", partition="generated",
                   meta={"language": "python"})
