"""Held-out perturbations on hand-built items: what each type builds, names/orders, and the registry."""

from __future__ import annotations

import difflib
import random
import re

import pytest
from jsonschema import Draft202012Validator
from perturb_examples import (
    AREA,
    booking_example,
    booking_texts,
    parallel_example,
    tool_texts,
    weather_example,
)

from cipr.perturb import HELD_OUT, apply_perturbation, list_perturbations
from cipr.perturb.cost_latency import EXPLICIT_REQUESTS, IMPLICIT_REQUESTS, CostLatencySpec, annotate
from cipr.perturb.naming import abbreviate, resembling_name, typo
from cipr.perturb.typos import TypoConfig, add_typos
from cipr.perturb.vocabulary import vocabulary
from cipr.scoring.bfcl import score_bfcl
from cipr.tools.interface import Call, Example, Interface, Message, Tool

COST_TYPES = [n for n in HELD_OUT if n.startswith(("cost_", "latency_"))]


def _ok(p: Example) -> bool:
    return score_bfcl(p.reference, p).correct


# ----------------------------------------------------------------------------- registry
def test_registry_lists_every_type_with_its_group() -> None:
    rows = list_perturbations()
    groups: dict[str, list[str]] = {}
    for name, group, desc in rows:
        groups.setdefault(group, []).append(name)
        assert desc and "\n" not in desc
    assert groups["typos_distractors"] == ["typos", "distractor_similar_name", "same_name_description",
                                           "same_name_parameters"]
    assert len(groups["cost_latency_explicit"]) == 6 and len(groups["cost_latency_implicit"]) == 6
    assert groups["in_distribution"] == ["in_distribution", "relabel_function"]
    assert groups["renaming"] == ["relabel_random"]
    assert groups["shown"] == ["lookalike_shown", "paraphrase", "reorder"]
    assert {"drift_stale_examples", "drift_renamed_parameters", "drift_distractors", "drift_type_narrowing",
            "drift_enum_replacement", "drift_refactor", "drift_mild", "drift_medium"} == set(groups["drift"])
    assert "in_distribution" not in HELD_OUT and "relabel_function" not in HELD_OUT
    assert len(HELD_OUT) == len(rows) - 2


def test_apply_perturbation_rejects_bad_requests() -> None:
    ex = weather_example()
    with pytest.raises(KeyError):
        apply_perturbation(ex, "no_such_type", seed=0)
    with pytest.raises(ValueError):
        apply_perturbation(ex, "typos", seed=0, order="costly_first")
    with pytest.raises(ValueError):
        apply_perturbation(ex, "cost_tag_explicit", seed=0, order="sideways")
    with pytest.raises(ValueError):
        apply_perturbation(ex, "typos", seed=0, names="random")
    with pytest.raises(ValueError, match="canonical"):
        apply_perturbation(ex, "in_distribution", seed=0, names="original")


@pytest.mark.parametrize("name", [n for n, _, _ in list_perturbations()])
def test_every_type_keeps_the_reference_correct(name: str) -> None:
    for ex in (weather_example(), parallel_example()):
        for names in ("original", "canonical"):
            if name == "in_distribution" and names == "original":
                continue
            p, corr = apply_perturbation(ex, name, seed=1, names=names)
            assert _ok(p), (name, names, score_bfcl(p.reference, p))
            assert corr.names == p.interface.names and corr.source_names == ex.interface.names
            assert p.meta["perturbation"]["name"] == name and p.id == ex.id
            assert (p, corr) == apply_perturbation(ex, name, seed=1, names=names)
            if name != "drift_refactor":
                assert corr.is_bijection()


# ----------------------------------------------------------------------------- typos
def test_typo_is_one_edit_and_keeps_the_first_letter() -> None:
    rng = random.Random(0)
    for word in ("weather", "include", "Francisco", "detail"):
        for _ in range(20):
            t = typo(word, rng)
            assert t != word and t[0] == word[0]
            assert abs(len(t) - len(word)) <= 1


def test_add_typos_counts_and_protects() -> None:
    text = "Please tell me the weather forecast for Springfield tomorrow morning"
    out, k = add_typos(text, random.Random(1), {"springfield"}, TypoConfig(rate=0.5))
    eligible = ["Please", "tell", "weather", "forecast", "tomorrow", "morning"]  # >= 4 letters, unprotected
    assert k == round(0.5 * len(eligible))
    changed = [w for w, v in zip(text.split(), out.split(), strict=True) if w != v]
    assert len(changed) == k and set(changed) <= set(eligible)
    assert "Springfield" in out
    assert add_typos("get_weather(x) 12345 ok", random.Random(0), set()) == ("get_weather(x) 12345 ok", 0)


def test_typos_type_changes_only_the_query() -> None:
    ex = weather_example()
    p, corr = apply_perturbation(ex, "typos", seed=0)
    assert p.query != ex.query
    assert "San Francisco" in p.query and "celsius" in p.query and "3" in p.query
    assert p.interface == ex.interface and p.reference == ex.reference
    nothing = ex.with_(messages=(Message("user", "何か"),))
    q, _ = apply_perturbation(nothing, "typos", seed=0)
    assert q.query == "何か" and "unchanged" in q.meta["perturbation"]["notes"][0]


# ----------------------------------------------------------------------------- distractors
def test_similar_name_distractor_per_called_tool() -> None:
    ex = parallel_example()
    p, corr = apply_perturbation(ex, "distractor_similar_name", seed=2)
    added = [i for i in range(len(corr)) if corr.is_added(i)]
    assert len(added) == 2
    pool = {(t.description, str(t.parameters)) for t in vocabulary().unrelated_tools}
    for i in added:
        t, target = p.interface[i], corr.twin_of[i]
        assert corr.roles[i] == "distractor" and target in {c.name for c in ex.reference}
        assert t.name not in ex.interface.names
        assert difflib.SequenceMatcher(None, t.name, target).ratio() >= 0.6
        assert (t.description, str(t.parameters)) in pool
    assert p.reference == ex.reference


def test_resembling_name_never_collides() -> None:
    rng = random.Random(0)
    for _ in range(50):
        name = resembling_name("get_weather", rng, {"get_weathers", "get_weather_v2"})
        assert name not in {"get_weather", "get_weathers", "get_weather_v2"}


def test_same_name_duplicates() -> None:
    ex = weather_example()
    p, corr = apply_perturbation(ex, "same_name_description", seed=0)
    decls = p.interface.declarations("get_weather")
    assert len(decls) == 2
    dup = next(t for i, t in enumerate(p.interface) if corr.roles[i] == "duplicate")
    assert dup.parameters == ex.interface.get("get_weather").parameters
    assert dup.description != ex.interface.get("get_weather").description
    q, qcorr = apply_perturbation(ex, "same_name_parameters", seed=0)
    k = next(i for i in range(len(qcorr)) if qcorr.roles[i] == "duplicate")
    bad = q.interface[k]
    assert not set(bad.properties) & set(WEATHER_ARGS)
    assert list(Draft202012Validator(dict(bad.parameters)).iter_errors(dict(ex.reference[0].arguments)))
    assert _ok(q)
    # with canonical names the reference points at the intact declaration, wherever the duplicate is
    for seed in range(6):
        c, ccorr = apply_perturbation(ex, "same_name_parameters", seed=seed, names="canonical")
        ref = c.reference[0].name
        assert ccorr.action_key(ref) == "get_weather" and _ok(c)


WEATHER_ARGS = ("city", "units", "days", "detailed")


# ----------------------------------------------------------------------------- cost and latency
def test_abbreviations() -> None:
    assert abbreviate("calculate_triangle_area") == "calc_trng_area"
    assert abbreviate("get_weather") == "get_wthr"
    assert abbreviate("GeometryPresentation.createPresentation") == "GmtrPrsn.crtPrsn"
    assert abbreviate("get_area") not in ("get_area",)


def test_annotations() -> None:
    tag = CostLatencySpec("cost", "tag", "explicit")
    assert annotate("Does X.", tag, 0.002) == "[Cost: $0.002 per call] Does X."
    assert annotate("Does X.", CostLatencySpec("cost", "nl", "explicit"), 0.04) == \
        "Does X. Each call to this tool costs about $0.04."
    assert annotate("Does X.", CostLatencySpec("latency", "tag", "implicit"), 2400) == \
        "[Latency: 2.4 s] Does X."
    assert annotate("Does X.", CostLatencySpec("latency", "nl", "implicit"), 120) == \
        "Does X. This tool typically responds in about 120 milliseconds."


def _stated(desc: str) -> float:
    m = re.search(r"\$(\d+(?:\.\d+)?)|(\d+(?:\.\d+)?) (ms|milliseconds|s|seconds)\b", desc)
    assert m, desc
    if m.group(1):
        return float(m.group(1))
    return float(m.group(2)) * (1 if m.group(3) in ("ms", "milliseconds") else 1000)


@pytest.mark.parametrize("name", COST_TYPES)
def test_cost_latency_construction(name: str) -> None:
    kind, style, version = name.split("_")
    ex = parallel_example()
    called = [c.name for c in ex.reference]
    for order in ("original", "costly_first"):
        p, corr = apply_perturbation(ex, name, seed=4, order=order)
        assert len(p.interface) == len(ex.interface) + 2
        for src in called:
            (good,) = corr.written_for(src)
            (bad,) = [i for i in range(len(corr)) if corr.twin_of[i] == src]
            assert p.interface[bad].name == src  # the familiar name goes to the worse tool
            assert p.interface[good].name != src
            if style == "abbrev":
                assert p.interface[good].name == abbreviate(src)
            assert p.interface[good].parameters == p.interface[bad].parameters
            assert _stated(p.interface[good].description) < _stated(p.interface[bad].description)
            assert (good < bad) == (order == "original") and abs(good - bad) == 1
            assert corr.roles[bad] == ("costlier" if kind == "cost" else "slower")
        requests = EXPLICIT_REQUESTS[kind] if version == "explicit" else IMPLICIT_REQUESTS
        assert p.query.startswith(ex.query) and p.query[len(ex.query):].strip() in requests
        assert _ok(p)
        assert not score_bfcl(ex.reference, p).correct  # the familiar names now call the costlier tools
        c, ccorr = apply_perturbation(ex, name, seed=4, order=order, names="canonical")
        assert c.interface.names == tuple(f"function_{i + 1:02d}" for i in range(len(c.interface)))
        assert _ok(c) and ccorr.to_json() == {
            w: corr.to_json()[n] for w, n in zip(c.interface.names, p.interface.names, strict=True)}


# ----------------------------------------------------------------------------- drift
def test_stale_examples_use_a_name_the_schema_lacks() -> None:
    ex = weather_example()
    p, _ = apply_perturbation(ex, "drift_stale_examples", seed=0)
    desc = p.interface.get("get_weather").description
    m = re.search(r"Example: (\{.*\})$", desc)
    assert m and desc.startswith(ex.interface.get("get_weather").description)
    keys = set(__import__("json").loads(m.group(1)))
    assert keys - set(WEATHER_ARGS) and p.interface.get("get_weather").parameters == ex.interface.get(
        "get_weather").parameters


def test_renamed_parameters() -> None:
    ex = weather_example()
    p, corr = apply_perturbation(ex, "drift_renamed_parameters", seed=0)
    new_args = list(p.interface.get("get_weather").properties)
    (renamed,) = [a for a in new_args if a not in WEATHER_ARGS]
    old = corr.arguments[corr.written_for("get_weather")[0]][renamed]
    assert old in WEATHER_ARGS and old not in new_args
    assert renamed in p.reference[0].arguments and renamed in p.accepted[0]
    assert p.reference[0].arguments[renamed] == ex.reference[0].arguments[old]
    assert not score_bfcl(ex.reference, p).correct


def test_overlapping_distractors() -> None:
    ex = parallel_example()
    p, corr = apply_perturbation(ex, "drift_distractors", seed=0)
    for i in range(len(corr)):
        if corr.is_added(i):
            src = ex.interface.get(corr.twin_of[i])
            assert src.description in p.interface[i].description and p.interface[i].name.startswith(src.name)


def test_type_narrowing() -> None:
    ex = weather_example()
    p, _ = apply_perturbation(ex, "drift_type_narrowing", seed=0)
    assert p.interface.get("get_weather").properties["days"]["type"] == "integer"  # number -> integer first
    ex2 = parallel_example()
    q, _ = apply_perturbation(ex2, "drift_type_narrowing", seed=0)
    flights = q.interface.get("search_flights").properties
    narrowed = [a for a in ("origin", "destination") if "enum" in flights[a]]
    assert len(narrowed) == 1
    a = narrowed[0]
    assert ex2.reference[0].arguments[a] in flights[a]["enum"] and len(flights[a]["enum"]) == 3
    assert q.interface.get("calculate_triangle_area").properties["base"].get("enum") or \
        q.interface.get("calculate_triangle_area").properties["height"].get("enum")  # integer -> enum
    assert _ok(q)


def test_enum_replacement() -> None:
    ex = weather_example()
    p, _ = apply_perturbation(ex, "drift_enum_replacement", seed=0)
    enum = p.interface.get("get_weather").properties["units"]["enum"]
    assert "celsius" not in enum and "fahrenheit" not in enum and len(set(enum)) == 2
    assert p.reference[0].arguments["units"] in enum and p.accepted[0]["units"][0] in enum
    assert not score_bfcl(ex.reference, p).correct and _ok(p)
    # without an enum a passed free string is narrowed, then respelled
    q, _ = apply_perturbation(parallel_example(), "drift_enum_replacement", seed=0)
    flights = q.interface.get("search_flights").properties
    (a,) = [a for a in ("origin", "destination") if "enum" in flights[a]]
    assert q.reference[0].arguments[a] in flights[a]["enum"] and \
        q.reference[0].arguments[a] not in ("SFO", "JFK")


def test_refactor_split_on_an_enum() -> None:
    ex = weather_example()
    p, corr = apply_perturbation(ex, "drift_refactor", seed=0)
    halves = corr.written_for("get_weather")
    assert len(halves) == 2 and not corr.is_bijection()
    assert all(corr.roles[i] == "split" for i in halves)
    ref = p.reference[0]
    assert ref.name in {p.interface[i].name for i in halves}
    split_arg = next(a for a in ("units", "detailed") if a not in ref.arguments)
    assert split_arg not in p.interface.get(ref.name).properties
    assert _ok(p) and not score_bfcl(ex.reference, p).correct


def test_refactor_merge() -> None:
    ex = parallel_example()  # area and flights have no enum or boolean: merge
    p, corr = apply_perturbation(ex, "drift_refactor", seed=0)
    (m,) = [i for i in range(len(corr)) if corr.roles[i] == "merged"]
    merged = p.interface[m]
    assert len(p.interface) == len(ex.interface) - 1 and len(corr.sources[m]) == 2
    assert merged.name == corr.sources[m][0] and merged.required == ("operation",)
    ops = merged.properties["operation"]["enum"]
    for call in p.reference:
        if call.name == merged.name:
            assert call.arguments["operation"] in ops
    assert _ok(p)
    single = Example("single", (Message("user", "area of base 3 height 4"),), Interface((AREA,)),
                     (Call(AREA.name, {"base": 3, "height": 4}),), accepted=({"base": (3,), "height": (4,)},),
                     meta={"language": "python"})
    s, scorr = apply_perturbation(single, "drift_refactor", seed=0)  # merged with an unrelated pool tool
    assert len(s.interface) == 1 and scorr.sources == ((AREA.name,),) and _ok(s)
    assert s.reference[0].arguments["operation"] == "calculate_triangle_area"


@pytest.mark.parametrize(("name", "renames", "distractors"), [("drift_mild", 2, 1), ("drift_medium", 3, 3)])
def test_composite_drift_counts(name: str, renames: int, distractors: int) -> None:
    ex = weather_example()
    p, corr = apply_perturbation(ex, name, seed=0)
    notes = p.meta["perturbation"]["notes"]
    assert sum(n.startswith("renamed") for n in notes) == renames
    assert sum(corr.roles[i] == "distractor" for i in range(len(corr))) == distractors
    stale = [n for n in notes if n.startswith("stale example")]
    assert sum(n.count(" for ") for n in stale) == renames  # description changes = schema changes here
    assert _ok(p) and not score_bfcl(ex.reference, p).correct


def test_tool_names_in_the_query_follow_canonical_names() -> None:
    ex = weather_example()
    ex = ex.with_(messages=(Message("user", "Call get_weather for Paris."),))
    p, corr = apply_perturbation(ex, "cost_tag_explicit", seed=0, names="canonical")
    # canonicalized after construction: the familiar name in the query is the costlier tool's
    costly = next(i for i in range(len(corr)) if corr.roles[i] == "costlier")
    assert p.query.startswith(f"Call {p.interface.names[costly]} for Paris.")
    q, _ = apply_perturbation(ex, "cost_tag_explicit", seed=0)
    assert q.query.startswith("Call get_weather for Paris.")


def test_tool_declared_without_properties() -> None:
    bare = Tool("ping", "Checks the service is up.", {"type": "object", "properties": {}})
    ex = Example("bare", (Message("user", "Is the service up right now?"),), Interface((bare,)),
                 (Call("ping", {}),), accepted=({},), meta={"language": "python"})
    for name in HELD_OUT:
        if name == "reorder":  # one tool: nothing to move, refused
            with pytest.raises(ValueError, match="nothing to reorder"):
                apply_perturbation(ex, name, seed=0)
            continue
        p, _ = apply_perturbation(ex, name, seed=0)
        assert _ok(p), name


def test_renamings_reach_the_tool_descriptions() -> None:
    """Tool names mentioned in descriptions and argument descriptions follow every renaming, as the query
    does."""
    ex = booking_example()
    for name, names in (("relabel_random", "original"), ("relabel_random", "canonical"),
                        ("relabel_function", "canonical")):
        p, corr = apply_perturbation(ex, name, seed=0, names=names)
        flights, book, _ = p.interface.names  # renaming keeps the order
        assert [tool_texts(t) for t in p.interface] == booking_texts(flights, book), (name, names)
        assert p.query == f"Book UA512 for Dana Reyes; I found it with {flights}."
    # canonical ids assigned after a construction: the familiar name (and its mentions) is the costlier tool's
    p, corr = apply_perturbation(ex, "cost_tag_explicit", seed=0, names="canonical")
    costly = p.interface.names[next(i for i in range(len(corr)) if corr.roles[i] == "costlier")]
    assert p.interface[0].description == f"Find flights; book one with {costly}."
    assert not any("search_flights" in x for t in p.interface for x in tool_texts(t))
    q, _ = apply_perturbation(ex, "cost_tag_explicit", seed=0)  # original names: text left as it is
    assert q.interface[0].description == "Find flights; book one with book_flight."
