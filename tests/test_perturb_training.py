"""The training perturbation (paper §3.2): twins, relabeling, reordering, ablation variants."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perturb_examples import examples, parallel_example, weather_example

from cipr.canonical import canonicalize
from cipr.interface import Call, Example
from cipr.perturb import TrainingPerturbationConfig, in_distribution, perturb_for_training
from cipr.perturb.pool import UNRELATED_ARGUMENTS
from cipr.perturb.training import DEGRADED_WORDINGS, VARIANTS
from cipr.scoring.bfcl import score_bfcl

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
    unrelated = [s for _, s in UNRELATED_ARGUMENTS]
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
    expected = {"full": 2 * n, "twins_only": 2 * n, "reorder_only": n, "single_near_duplicate": n + 1}[variant]
    assert len(p.interface) == expected
    assert perturb_for_training(canon, TrainingPerturbationConfig.preset(variant), seed=seed) == (p, corr)
    # the original calls (canonical ids) are not what the perturbed interface expects unless ids collide
    wrong = tuple(Call(c.name, dict(c.arguments)) for c in canon.reference)
    if all(c.name not in p.interface.names for c in wrong):
        assert not score_bfcl(wrong, p).correct
