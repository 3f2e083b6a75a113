"""The training perturbation (paper §3.2): twins, relabeling, reordering, ablation variants."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perturb_examples import booking_example, examples, parallel_example, tool_texts, weather_example

from cipr.perturb import TrainingPerturbationConfig, in_distribution, perturb_for_training
from cipr.perturb.cost_latency import (
    EXPLICIT_REQUESTS,
    IMPLICIT_REQUESTS,
    KINDS,
    STYLES,
    VERSIONS,
    CostLatencySpec,
    annotate,
    draw_values,
)
from cipr.perturb.training import COST_WORDINGS, DEGRADED_WORDINGS, VARIANTS
from cipr.perturb.vocabulary import vocabulary
from cipr.scoring.bfcl import score_bfcl
from cipr.tools.canonical import canonicalize
from cipr.tools.interface import Call, Example

ID = re.compile(r"function_\d{2,}$")


def _canon(ex: Example) -> Example:
    return canonicalize(ex)[0]


def _check(original: Example, perturbed: Example, corr) -> None:
    """Rewritten reference is correct, translates back to the original, ids are fresh and distinct."""
    assert score_bfcl(perturbed.reference, perturbed).correct
    assert corr.names == perturbed.interface.names
    assert len(set(corr.names)) == len(corr.names)
    assert all(ID.match(n) for n in corr.names)
    assert corr.is_bijection()
    back = tuple(corr.translate_back(c) for c in perturbed.reference)
    assert back == original.reference
    for i, tool in enumerate(perturbed.interface):
        assert list(tool.properties) == [f"arg_{j + 1:02d}" for j in range(len(tool.properties))]
        if corr.is_added(i):
            assert corr.roles[i] == "twin" and corr.twin_of[i] in original.interface.names


def test_full_expansion_doubles_the_list() -> None:
    ex = _canon(parallel_example())
    p, corr = perturb_for_training(ex, seed=3)
    _check(ex, p, corr)
    assert len(p.interface) == 2 * len(ex.interface)
    assert sorted(t for t in corr.twin_of if t) == sorted(ex.interface.names)
    assert p.query == ex.query and p.messages == ex.messages
    assert p.meta["perturbation"]["variant"] == "full"


def test_description_twins_state_a_degradation_and_keep_the_schema() -> None:
    ex = _canon(weather_example())
    p, corr = perturb_for_training(ex, TrainingPerturbationConfig(schema_twin_prob=0.0), seed=0)
    for i, tool in enumerate(p.interface):
        if corr.is_added(i):
            src = ex.interface.get(corr.twin_of[i])
            assert any(w in tool.description for w in DEGRADED_WORDINGS)
            assert src.description in tool.description
            assert sorted(map(str, tool.properties.values())) == sorted(map(str, src.properties.values()))


def test_schema_twins_swap_a_needed_argument_for_an_unrelated_one() -> None:
    ex = _canon(weather_example())
    called = ex.reference[0].name
    unrelated = [s for _, s in vocabulary().unrelated_arguments]
    for seed in range(6):
        p, corr = perturb_for_training(ex, TrainingPerturbationConfig(schema_twin_prob=1.0), seed=seed)
        for i, tool in enumerate(p.interface):
            if not corr.is_added(i):
                continue
            src = ex.interface.get(corr.twin_of[i])
            assert tool.description == src.description
            changed = [s for s in tool.properties.values() if s not in src.properties.values()]
            assert len(changed) == 1 and changed[0] in unrelated
            if corr.twin_of[i] == called:  # the twin of the called tool loses an argument the call passes
                eq = corr.written_for(called)[0]
                ref = p.reference[0]
                twin_slots = {str(s) for s in tool.properties.values()}
                passed = {str(p.interface[eq].properties[a]) for a in ref.arguments}
                assert passed - twin_slots, "the replaced argument must be one the reference passes"


def test_positional_relabel_and_no_reordering() -> None:
    ex = _canon(parallel_example())
    cfg = TrainingPerturbationConfig(relabel="positional", reorder_tools=False, reorder_arguments=False)
    p, corr = perturb_for_training(ex, cfg, seed=0)
    n = len(p.interface)
    assert p.interface.names == tuple(f"function_{i + 1:02d}" for i in range(n))
    # without reordering each twin follows its original
    for i in range(0, n, 2):
        assert corr.sources[i] and corr.twin_of[i + 1] == corr.sources[i][0]


def test_reordering_moves_tools_and_arguments() -> None:
    ex = _canon(weather_example())
    positions, arg_orders = set(), set()
    for seed in range(12):
        p, corr = perturb_for_training(ex, TrainingPerturbationConfig.preset("reorder_only"), seed=seed)
        _check(ex, p, corr)
        i = corr.written_for(ex.reference[0].name)[0]
        positions.add(i)
        arg_orders.add(tuple(corr.arguments[i][a] for a in p.interface[i].properties))
    assert len(positions) == 2 and len(arg_orders) > 3


def test_variants() -> None:
    ex = _canon(parallel_example())
    n = len(ex.interface)
    p, corr = perturb_for_training(ex, TrainingPerturbationConfig.preset("reorder_only"), seed=1)
    assert len(p.interface) == n and not any(corr.is_added(i) for i in range(n))
    p, corr = perturb_for_training(ex, TrainingPerturbationConfig.preset("twins_only"), seed=1)
    assert len(p.interface) == 2 * n
    assert [s[0] for s in corr.sources if s] == list(ex.interface.names)  # originals keep their order
    p, corr = perturb_for_training(ex, TrainingPerturbationConfig.preset("single_near_duplicate"), seed=1)
    assert len(p.interface) == n + 1
    (k,) = [i for i in range(n + 1) if corr.is_added(i)]
    assert corr.twin_of[k] in {c.name for c in ex.reference}
    assert corr.sources[k - 1] == (corr.twin_of[k],)  # right after its original
    for v in VARIANTS:
        assert perturb_for_training(ex, TrainingPerturbationConfig.preset(v), seed=0)[0].meta["perturbation"][
            "variant"] == v
    with pytest.raises(ValueError):
        TrainingPerturbationConfig.preset("nope")


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        TrainingPerturbationConfig(twins="some")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TrainingPerturbationConfig(schema_twin_prob=1.5)
    with pytest.raises(ValueError):
        TrainingPerturbationConfig(relabel="alphabetic")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TrainingPerturbationConfig(wordings=())
    with pytest.raises(ValueError):
        TrainingPerturbationConfig(twin_wordings="cost")  # type: ignore[arg-type]


def test_deterministic_per_seed_and_item() -> None:
    ex = _canon(parallel_example())
    a = perturb_for_training(ex, seed=7)
    assert a == perturb_for_training(ex, seed=7)
    others = {json.dumps(perturb_for_training(ex, seed=s)[0].interface.to_openai()) for s in range(8)}
    assert len(others) == 8
    renamed = ex.with_(id="another_item")
    assert perturb_for_training(renamed, seed=7)[0].interface != a[0].interface


def test_ids_in_the_query_are_relabeled_too() -> None:
    ex = _canon(weather_example())
    called = ex.reference[0].name
    ex = ex.with_(messages=(ex.messages[0].__class__("user", f"Use {called} please."),))
    p, corr = perturb_for_training(ex, seed=0)
    new = corr.names[corr.written_for(called)[0]]
    assert p.query == f"Use {new} please."


def test_ids_in_descriptions_are_relabeled_too() -> None:
    ex = _canon(booking_example())  # book_flight's texts name function_01 (search_flights)
    p, corr = perturb_for_training(ex, seed=0)
    flights = corr.names[corr.written_for("function_01")[0]]
    book = corr.written_for("function_02")[0]
    assert p.interface[book].description == f"Book a seat on a flight found by {flights} (not by search)."
    twins = [i for i in range(len(corr)) if corr.twin_of[i] == "function_02"]
    for i in [book, *twins]:  # the twin copies the text and is relabeled with it
        assert flights in p.interface[i].description, i
        ids = {w for x in tool_texts(p.interface[i]) for w in re.findall(r"function_\d+", x)}
        assert ids == {flights}, i


def test_in_distribution_speaks_original_names() -> None:
    ex = weather_example()
    p, corr = in_distribution(ex, seed=0)
    assert corr.source_names == ex.interface.names
    assert {s[0] for s in corr.sources if s} == set(ex.interface.names)
    assert tuple(corr.translate_back(c) for c in p.reference) == ex.reference
    assert score_bfcl(p.reference, p).correct


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(examples(), st.integers(0, 10_000), st.sampled_from(VARIANTS))
def test_property_random_interfaces(ex: Example, seed: int, variant: str) -> None:
    canon = _canon(ex)
    p, corr = perturb_for_training(canon, TrainingPerturbationConfig.preset(variant), seed=seed)
    _check(canon, p, corr)
    n = len(canon.interface)
    expected = {"full": 2 * n, "twins_only": 2 * n, "reorder_only": n,
                "single_near_duplicate": n + 1}[variant]
    assert len(p.interface) == expected
    assert perturb_for_training(canon, TrainingPerturbationConfig.preset(variant), seed=seed) == (p, corr)
    # the original calls (canonical ids) are not what the perturbed interface expects unless ids collide
    wrong = tuple(Call(c.name, dict(c.arguments)) for c in canon.reference)
    if all(c.name not in p.interface.names for c in wrong):
        assert not score_bfcl(wrong, p).correct


# -- twins never carry the held-out cost or latency cue ------------------------------------------------

COST_WORDS = ("cost", "price", "expensive", "cheap", "$")
TIME_WORDS = ("latency", "millisecond", "second", "responds", " ms")


def _words(text: str) -> list[str]:
    return re.findall(r"\$|[a-z]+|\d+(?:\.\d+)?", text.lower())


def _spans(text: str, n: int = 4) -> set[tuple[str, ...]]:
    w = _words(text)
    return {tuple(w[i:i + n]) for i in range(len(w) - n + 1)}


def held_out_templates() -> list[str]:
    """Every text the held-out cost/latency types write: annotations of each kind and style at every value
    `draw_values` can draw, and the explicit and implicit query requests."""
    import random

    texts: set[str] = set()
    for kind in KINDS:
        values = {v for seed in range(400) for v in draw_values(kind, random.Random(seed))}
        for style in STYLES:
            for version in VERSIONS:
                spec = CostLatencySpec(kind, style, version)
                texts.update(annotate("", spec, v) for v in values)
        texts.update(EXPLICIT_REQUESTS[kind])
    texts.update(IMPLICIT_REQUESTS)
    return sorted(texts)


HELD_OUT_SPANS = set().union(*(_spans(t) for t in held_out_templates()))


def _leaks(text: str) -> list[str]:
    """What in `text` repeats the held-out cue: a cost word, or a 4-word span of a held-out template."""
    low = text.lower()
    found = [w for w in COST_WORDS if w in low]
    found += [" ".join(s) for s in _spans(text) & HELD_OUT_SPANS]
    return found


def test_held_out_templates_are_enumerated() -> None:
    texts = held_out_templates()
    assert any(t.startswith("[Cost: $") for t in texts) and any(t.startswith("[Latency: ") for t in texts)
    assert any("costs about $" in t for t in texts) and any("responds in about" in t for t in texts)
    assert any("seconds" in t for t in texts) and any("milliseconds" in t for t in texts)
    assert len(HELD_OUT_SPANS) > 50
    # the check bites: each cost wording of the ablation pool is caught
    assert all(_leaks(w) for w in COST_WORDINGS)


def test_default_wordings_share_no_cue_with_the_held_out_templates() -> None:
    for wording in DEGRADED_WORDINGS:
        assert not _leaks(wording), wording
        assert not any(w in wording.lower() for w in TIME_WORDS), wording
        assert not re.search(r"\d", wording), wording
    pool = TrainingPerturbationConfig().wording_pool
    assert pool == DEGRADED_WORDINGS and not set(pool) & set(COST_WORDINGS)


def test_cost_wordings_only_behind_the_ablation_switch() -> None:
    cfg = TrainingPerturbationConfig.preset("full", twin_wordings="with_cost")
    assert set(COST_WORDINGS) <= set(cfg.wording_pool) and set(DEGRADED_WORDINGS) <= set(cfg.wording_pool)
    ex = _canon(parallel_example())
    p, _ = perturb_for_training(ex, cfg, seed=0)
    assert p.meta["perturbation"]["variant"] == "full" and \
        p.meta["perturbation"]["twin_wordings"] == "with_cost"
    assert perturb_for_training(ex, seed=0)[0].meta["perturbation"]["twin_wordings"] == "default"
    costly = 0
    for seed in range(40):
        p, corr = perturb_for_training(ex, TrainingPerturbationConfig(schema_twin_prob=0.0,
                                                                      twin_wordings="with_cost"), seed=seed)
        costly += sum(any(w in t.description for w in COST_WORDINGS) for i, t in enumerate(p.interface)
                      if corr.is_added(i))
    assert costly > 0


def _added_text(p: Example, corr, i: int) -> str:
    """What twin i adds to the tool it degrades: description words and swapped argument descriptions."""
    twin = p.interface[i]
    (j,) = corr.written_for(corr.twin_of[i])
    original = p.interface[j]
    assert original.description.strip() in twin.description
    added = twin.description.replace(original.description.strip(), "", 1)
    before = {json.dumps(s, sort_keys=True) for s in original.properties.values()}
    swapped = [s for s in twin.properties.values() if json.dumps(s, sort_keys=True) not in before]
    return " ".join([added] + [str(s.get("description", "")) for s in swapped])


@pytest.mark.integration
def test_bfcl_twins_carry_no_held_out_cue(shared_data) -> None:
    """Every twin of every BFCL item (three seeds) adds a default wording or a schema swap, never the cue."""
    from cipr.data.bfcl import load_bfcl

    items = load_bfcl(shared_data)
    assert len(items) == 2501
    twins = described = 0
    for seed in (0, 5, 11):
        for ex in items:
            p, corr = in_distribution(ex, seed=seed)
            for i in range(len(p.interface)):
                if not corr.is_added(i):
                    continue
                twins += 1
                added = _added_text(p, corr, i)
                assert not _leaks(added), (ex.id, seed, added)
                (j,) = corr.written_for(corr.twin_of[i])
                wording = p.interface[i].description.replace(p.interface[j].description.strip(),
                                                             "", 1).strip()
                if wording:
                    described += 1
                    assert wording in DEGRADED_WORDINGS, (ex.id, wording)
    assert twins > 3 * 6000 and described > twins // 3
