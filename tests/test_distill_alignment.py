"""Token alignment across renamed action names: hand-built cases, a property test, and real renderings."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cipr.data.trajectories import toyshop_trajectories
from cipr.distill.alignment import AlignmentError, Segment, align_tokens, segment_texts
from cipr.distill.batch import build_item
from cipr.formats import get_format


def test_segments_of_a_rename_hand_built():
    a = "Action: search[red shoes]"
    b = "Action: function_01[red shoes]"
    assert segment_texts(a, b, [("search", "function_01")]) == [
        Segment("shared", 0, 8, 0, 8), Segment("name", 8, 14, 8, 19), Segment("shared", 14, 25, 19, 30)]


def test_a_name_left_unrenamed_in_prose_is_shared_text():
    a = "- search[<argument>]: its argument in brackets"
    b = "- function_01[<arg_01>]: its argument in brackets"
    segs = segment_texts(a, b, [("search", "function_01"), ("argument", "arg_01")])
    assert [(s.kind, a[s.a_start:s.a_end], b[s.b_start:s.b_end]) for s in segs] == [
        ("shared", "- ", "- "), ("name", "search", "function_01"), ("shared", "[<", "[<"),
        ("name", "argument", "arg_01"),
        ("shared", ">]: its argument in brackets", ">]: its argument in brackets")]


def test_swapped_names_and_word_boundaries():
    a = "search click researched click_me search"
    b = "click search researched click_me click"
    segs = segment_texts(a, b, [("search", "click"), ("click", "search")])
    assert [s.kind for s in segs] == ["name", "shared", "name", "shared", "name"]
    assert a[segs[2].a_start:segs[2].a_end] == "click" and b[segs[2].b_start:segs[2].b_end] == "search"


def test_texts_that_differ_otherwise_raise_with_the_position():
    with pytest.raises(AlignmentError, match=r"char 14 of a .*char 19 of b"):
        segment_texts("Action search[x]", "Action function_01[y]", [("search", "function_01")])
    with pytest.raises(AlignmentError):
        segment_texts("abc", "abcd", [])


def test_tokens_pair_by_segment_offset_and_id_hand_built():
    # a = "x search y", b = "x function_01 y"; names tokenize to 1 and 3 tokens, the space merges into them.
    segs = segment_texts("x search y", "x function_01 y", [("search", "function_01")])
    a_ids, a_off = [1, 2, 3], [(0, 1), (1, 8), (8, 10)]
    b_ids, b_off = [1, 4, 5, 6, 3], [(0, 1), (1, 10), (10, 11), (11, 13), (13, 15)]
    al = align_tokens(segs, a_ids, a_off, b_ids, b_off)
    assert (al.a_index, al.b_index, al.a_unpaired, al.b_unpaired) == ((0, 2), (0, 4), 1, 3)


def test_same_span_different_id_and_repeated_spans_and_regions():
    segs = [Segment("shared", 0, 4, 0, 4)]
    # two byte tokens share span (1, 2) (a split multi-byte character); the second differs in id on side b
    a_ids, a_off = [7, 8, 9, 10], [(0, 1), (1, 2), (1, 2), (2, 4)]
    b_ids, b_off = [7, 8, 99, 10], [(0, 1), (1, 2), (1, 2), (2, 4)]
    al = align_tokens(segs, a_ids, a_off, b_ids, b_off)
    assert (al.a_index, al.b_index) == ((0, 1, 3), (0, 1, 3))
    al = align_tokens(segs, a_ids, a_off, b_ids, b_off, a_regions=[(2, 4)], b_regions=[(2, 4)])
    assert (al.a_index, al.b_index, al.a_unpaired, al.b_unpaired) == ((3,), (3,), 0, 0)


def test_different_cuts_of_shared_text_stay_unpaired():
    # shared "ab" is one token on side a and two on side b: nothing pairs, nothing is guessed
    segs = [Segment("shared", 0, 2, 0, 2)]
    al = align_tokens(segs, [5], [(0, 2)], [6, 7], [(0, 1), (1, 2)])
    assert (len(al), al.a_unpaired, al.b_unpaired) == (0, 1, 2)


_CHUNK = st.text(alphabet=" []:,\nxyz?", min_size=0, max_size=6).map(lambda s: f" {s} ")
_NAMES = st.sampled_from(["search", "click", "find"])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_CHUNK, _NAMES), min_size=0, max_size=6), _CHUNK)
def test_segments_recover_every_inserted_name(parts, tail):
    renames = {"search": "function_01", "click": "fn_x9", "find": "tool_100"}
    a = "".join(c + n for c, n in parts) + tail
    b = "".join(c + renames[n] for c, n in parts) + tail
    segs = segment_texts(a, b, renames.items())
    names = [(a[s.a_start:s.a_end], b[s.b_start:s.b_end]) for s in segs if s.kind == "name"]
    assert names == [(n, renames[n]) for _, n in parts]
    shared_a = "".join(a[s.a_start:s.a_end] for s in segs if s.kind == "shared")
    shared_b = "".join(b[s.b_start:s.b_end] for s in segs if s.kind == "shared")
    assert shared_a == shared_b == "".join(c for c, _ in parts) + tail


def test_real_rendering_pairs_identical_tokens_and_leaves_name_tokens_out(tiny_tokenizer):
    item = build_item(toyshop_trajectories(1, seed=3)[0], get_format("webshop"), tiny_tokenizer)
    t, s = item.teacher, item.student
    tt, st_ = item.teacher_tokens, item.student_tokens
    assert len(item.alignment) > 100
    for i, j in zip(item.alignment.a_index, item.alignment.b_index, strict=True):
        assert tt.ids[i] == st_.ids[j]
        assert t.text[slice(*tt.offsets[i])] == s.text[slice(*st_.offsets[j])]
        assert any(lo <= st_.offsets[j][0] and st_.offsets[j][1] <= hi for lo, hi in s.turns)
    paired = set(item.alignment.b_index)
    for j, (lo, hi) in enumerate(st_.offsets):
        inside = any(a <= lo and hi <= b for a, b in s.turns)
        touches_name = "function_0" in s.text[max(lo - 10, 0):hi + 10] and any(
            lo < d.start + s.prompt_end + len("Action: ") + len(d.taken)
            and hi > d.start + s.prompt_end + len("Action: ") for d in s.decisions)
        if inside and touches_name:
            assert j not in paired
    # every student token of the assistant turns is paired or counted unpaired
    considered = sum(any(a <= lo and hi <= b for a, b in s.turns) and hi > lo for lo, hi in st_.offsets)
    assert len(item.alignment) + item.alignment.b_unpaired == considered
