"""The held-out types applied to the interface the model sees (cipr/perturb/shown.py), under both namings."""

from __future__ import annotations

import difflib
import random

import pytest
from perturb_examples import booking_example, weather_example

from cipr.perturb import apply_perturbation
from cipr.perturb.shown import SYNONYMS, paraphrase
from cipr.tools.canonical import canonicalize

TYPES = ("lookalike_shown", "paraphrase", "reorder")


def _shown(example, names):
    return canonicalize(example)[0] if names == "canonical" else example


@pytest.mark.parametrize("names", ["original", "canonical"])
@pytest.mark.parametrize("kind", TYPES)
def test_every_tool_maps_back_to_its_original_and_the_reference_follows(kind, names):
    ex = booking_example()
    base = _shown(ex, names)
    out, corr = apply_perturbation(ex, kind, seed=3, names=names)
    assert corr.source_names == ex.interface.names
    for name, srcs in zip(out.interface.names, corr.sources, strict=True):
        if srcs:  # an equivalent: the shown name is kept and stands for the same original tool
            (src,) = srcs
            assert base.interface.names[ex.interface.names.index(src)] == name
    for ref, new in zip(base.reference, out.reference, strict=True):
        assert ref == new  # names and arguments unchanged
    assert out == apply_perturbation(ex, kind, seed=3, names=names)[0]  # a pure function of (item, seed)


@pytest.mark.parametrize("names", ["original", "canonical"])
def test_lookalike_adds_one_near_name_per_called_tool(names):
    ex = weather_example()
    base = _shown(ex, names)
    out, corr = apply_perturbation(ex, "lookalike_shown", seed=1, names=names)
    added = [(n, t) for n, s, t in zip(out.interface.names, corr.sources, corr.twin_of, strict=True) if not s]
    called = {c.name for c in base.reference}
    assert len(added) == len(called) and len(out.interface) == len(base.interface) + len(called)
    for name, of in added:
        shown_name = base.interface.names[ex.interface.names.index(of)]
        assert shown_name in called and name != shown_name
        assert difflib.SequenceMatcher(None, name, shown_name).ratio() > 0.6
    if names == "canonical":
        assert all(n.startswith(("function_", "fn_", "func")) for n, _ in added)


def test_paraphrase_rewords_descriptions_only():
    ex = booking_example()
    out, _ = apply_perturbation(ex, "paraphrase", seed=0, names="canonical")
    base = _shown(ex, "canonical")
    assert out.interface.names == base.interface.names and out.messages == base.messages
    assert [t.parameters for t in out.interface] == [t.parameters for t in base.interface]
    assert [t.description for t in out.interface] != [t.description for t in base.interface]
    assert paraphrase("Get the current weather.", random.Random(0)) != "Get the current weather."
    assert "get" in SYNONYMS and "Retrieve" not in paraphrase("Nothing to swap here", random.Random(0))


@pytest.mark.parametrize("seed", range(5))
def test_reorder_moves_every_tool_and_keeps_its_name(seed):
    ex = booking_example()
    base = _shown(ex, "canonical")
    out, corr = apply_perturbation(ex, "reorder", seed=seed, names="canonical")
    assert sorted(out.interface.names) == sorted(base.interface.names)
    assert all(a != b for a, b in zip(out.interface.names, base.interface.names, strict=True))
    assert {t.name: t for t in out.interface} == {t.name: t for t in base.interface}
