"""RoTBench levels re-applied to canonical ids (paper Appendix F): helpers by hand, all First_Turn items."""

from __future__ import annotations

import random

import pytest

from cipr.core.errors import DataError
from cipr.data.rotbench import LEVELS, load_rotbench
from cipr.perturb.rotbench import (
    align_parameters,
    canonical_level,
    classify,
    edit_like,
    levenshtein,
    pair_with_clean,
    reapply_level,
    shipped_correspondence,
)
from cipr.scoring.rotbench import accepted_answers, content_filling
from cipr.tools.canonical import canonical_tool_id, canonicalize
from cipr.tools.interface import Example, Tool


def test_levenshtein_by_hand() -> None:
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == 3
    assert levenshtein("get_translation_nllb", "get_tranlationnllb") == 2


def test_classify() -> None:
    assert classify("get_weather", "get_weather") == "same"
    assert classify("get_weather", "rehtaew_teg") == "reversed"
    assert classify("get_weather", "get_waether") == "edited"
    assert classify("get_weather", "QzKWjf") == "random"
    assert classify("q", "Bq", "slight") == "edited"      # the level allows only edits
    assert classify("txt_url", "t_url", "medium") == "random"  # the level allows no edits


def test_edit_like_keeps_the_edit_rate() -> None:
    rng = random.Random(0)
    for _ in range(30):
        out = edit_like("function_01", "get_translation_nllb", "get_tSranslation_znbllb", rng)  # 3 edits / 20
        assert out != "function_01"
        assert 1 <= levenshtein("function_01", out) <= 2  # round(3/20 * 11) = 2 edits, which may overlap


def _tool(props: list[tuple[str, str]], required: list[str] | None = None) -> Tool:
    return Tool("t", "d", {"type": "object", "properties": {n: {"type": "string", "description": d}
                                                            for n, d in props}, "required": required or []})


def test_align_parameters() -> None:
    clean = _tool([("a", "A"), ("b", "B"), ("c", "C")])
    assert align_parameters(clean, _tool([("x", "A"), ("b", "B"), ("zz", "C")])) == \
        ([(0, 0), (1, 1), (2, 2)], [], [])
    assert align_parameters(clean, _tool([("b", "A"), ("c", "B"), ("a", "C")])) == \
        ([(0, 0), (1, 1), (2, 2)], [], [])
    added = _tool([("a", "A"), ("b", "B"), ("c", "C"), ("Qx", "random")])
    assert align_parameters(clean, added) == ([(0, 0), (1, 1), (2, 2)], ["Qx"], [])
    collided = _tool([("b", "B"), ("c", "C")])  # a corrupted name collided and a parameter was lost
    assert align_parameters(clean, collided) == ([(1, 0), (2, 1)], [], ["a"])


@pytest.fixture(scope="module")
def first_turn(shared_data) -> dict[str, list[Example]]:
    return {lv: load_rotbench(shared_data, "First_Turn", lv) for lv in LEVELS}


def test_clean_level_is_plain_canonicalization(first_turn) -> None:
    for ex in first_turn["clean"]:
        p, corr = reapply_level(ex, ex)
        q, _ = canonicalize(ex)
        assert p.interface == q.interface and p.reference == q.reference and p.alternatives == q.alternatives
        assert corr.is_bijection()


@pytest.mark.parametrize("level", LEVELS)
def test_reapplied_levels_pair_item_by_item(shared_data, first_turn, level: str) -> None:
    shipped = first_turn[level]
    rows = canonical_level(shared_data, "First_Turn", level, seed=0)
    assert [p.id for p, _ in rows] == [s.id for s in shipped]
    assert len(rows) == {"clean": 105, "union": 105}.get(level, 210)
    pairs = pair_with_clean(first_turn["clean"], shipped)
    for (clean, s), (p, corr) in zip(pairs, rows, strict=True):
        n = len(clean.interface)
        ids = [canonical_tool_id(i, n) for i in range(n)]
        names = list(p.interface.names)
        assert len(set(names)) == n, "no level introduces a duplicated identifier"
        assert p.messages[0].content == s.messages[0].content  # the same query
        assert corr.sources == tuple((t.name,) for t in clean.interface) and corr.is_bijection()
        # the shipped descriptions, with the tool names they mention canonicalized as in the clean record
        assert [t.description for t in p.interface] == \
            [t.description for t in canonicalize(clean)[0].interface]
        for i, (c_t, s_t) in enumerate(zip(clean.interface, s.interface, strict=True)):
            if c_t.name == s_t.name:
                assert names[i] == ids[i]
            else:
                assert names[i] != ids[i]
        if sorted(t.name for t in s.interface) == sorted(t.name for t in clean.interface):
            assert sorted(names) == sorted(ids)  # a shuffle of names stays a shuffle of the ids
        # the gold answers keep their values and score as the shipped ones do
        for a_s, a_p in zip(accepted_answers(s), accepted_answers(p), strict=True):
            assert list(a_s.arguments.values()) == list(a_p.arguments.values())
            assert content_filling(a_p, p)[0] == content_filling(a_s, s)[0]
        assert p.meta["finish_tool"] == names[-1]
        sc = shipped_correspondence(clean, s)
        assert sc.names == s.interface.names and sc.sources == corr.sources


def test_heavy_shuffle_is_the_same_permutation(first_turn) -> None:
    pairs = pair_with_clean(first_turn["clean"], first_turn["heavy"])
    shuffled = 0
    for clean, s in pairs:
        cn, sn = clean.interface.names, s.interface.names
        if cn == sn or sorted(cn) != sorted(sn) or len(set(cn)) < len(cn):
            continue
        p, _ = reapply_level(clean, s)
        n = len(cn)
        for i, name in enumerate(sn):
            assert p.interface.names[i] == canonical_tool_id(cn.index(name), n)
        shuffled += 1
    assert shuffled >= 100


def test_seed_changes_only_the_edited_names(first_turn) -> None:
    pairs = pair_with_clean(first_turn["clean"], first_turn["slight"])
    changed = 0
    for clean, s in pairs:
        a, _ = reapply_level(clean, s, seed=0)
        assert a == reapply_level(clean, s, seed=0)[0]
        b, _ = reapply_level(clean, s, seed=1)
        for i, (c_t, s_t) in enumerate(zip(clean.interface, s.interface, strict=True)):
            if c_t.name == s_t.name:
                assert a.interface.names[i] == b.interface.names[i]
        changed += a.interface.names != b.interface.names
    assert changed >= 100  # the 105 records with edited tool names


def test_misaligned_records_are_rejected(first_turn) -> None:
    clean = first_turn["clean"]
    other = next(e for e in clean if len(e.interface) != len(clean[0].interface))
    with pytest.raises(DataError, match="does not line up"):
        reapply_level(clean[0], other)
    with pytest.raises(DataError, match="pairs with clean record"):
        pair_with_clean(clean, first_turn["slight"][1:] + first_turn["slight"][:1])
