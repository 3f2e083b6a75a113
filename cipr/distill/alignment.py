"""Token alignment of two renderings of one trajectory whose action names differ (teacher vs student).

The teacher reads the original names (`search`), the student canonical ones (`function_01`); the texts
are equal except where a name was rewritten, and names tokenize to different lengths, so token i of one
side is not token i of the other. Two exact steps (no fuzzy matching):

1. Segments (`segment_texts`): the two texts are scanned in lockstep. Where side a has a whole-word
   occurrence of an old name (same word boundaries as `cipr.tools.canonical.rewrite_text`: not preceded by
   a word character or `.`, not followed by a word character) and side b has its new name at the
   same point, both spans form a *name* segment; otherwise the two characters must be equal and
   extend the current *shared* segment (trying the rename first is safe: the names differ, and the
   boundary rule keeps a shared word from being read as a rename). An old name that was not rewritten
   is shared text. Texts that differ in any other way raise `AlignmentError` with the position.
2. Tokens (`align_tokens`): a token of b is *paired* with a token of a when its char span lies inside
   one shared segment, the a-token has the span at the same offsets from that segment's start in a,
   and both have the same id. Every other token is *unpaired*: those touched by a name (SmolLM2's
   ` search` carries the space before the name, so it is unpaired although the space is shared),
   and shared text the two tokenizations cut differently around a name. Tokens whose spans repeat
   (the bytes of a split multi-byte character share one char span) pair in order of appearance.

Only tokens inside the given regions (assistant turns) count; the loss compares next-token
distributions at positions predicting paired tokens, and the action distributions cover the names.
"""

from __future__ import annotations

import bisect
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

_WORD = re.compile(r"\w")


class AlignmentError(ValueError):
    """The two texts differ other than by the given renames."""


@dataclass(frozen=True)
class Segment:
    """A shared or name span: chars [a_start, a_end) of text a and [b_start, b_end) of text b."""

    kind: Literal["shared", "name"]
    a_start: int
    a_end: int
    b_start: int
    b_end: int


def _is_word(text: str, i: int) -> bool:
    return 0 <= i < len(text) and _WORD.match(text[i]) is not None


def _whole(text: str, i: int, name: str) -> bool:
    if not text.startswith(name, i):
        return False
    before = text[i - 1] if i > 0 else ""
    return not (before and (_WORD.match(before) or before == ".")) and not _is_word(text, i + len(name))


def segment_texts(a: str, b: str, renames: Iterable[tuple[str, str]]) -> list[Segment]:
    """Shared and name segments of texts a and b, where b is a with some `(old, new)` renames applied
    (longer old names first); AlignmentError where the texts differ otherwise."""
    by_first: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for old, new in sorted(set(renames), key=lambda p: (-len(p[0]), p)):
        if not old or not new or old == new:
            raise AlignmentError(f"a rename needs two different non-empty names, got {old!r} -> {new!r}")
        by_first[old[0]].append((old, new))
    out: list[Segment] = []
    i = j = 0
    shared_from: tuple[int, int] | None = None

    def close() -> None:
        nonlocal shared_from
        if shared_from is not None and i > shared_from[0]:
            out.append(Segment("shared", shared_from[0], i, shared_from[1], j))
        shared_from = None

    while i < len(a) or j < len(b):
        candidates = by_first.get(a[i], ()) if i < len(a) else ()
        hit = next(((old, new) for old, new in candidates if _whole(a, i, old) and _whole(b, j, new)), None)
        if hit is not None:
            close()
            out.append(Segment("name", i, i + len(hit[0]), j, j + len(hit[1])))
            i, j = i + len(hit[0]), j + len(hit[1])
            continue
        if i < len(a) and j < len(b) and a[i] == b[j]:
            if shared_from is None:
                shared_from = (i, j)
            i, j = i + 1, j + 1
            continue
        raise AlignmentError(f"the texts differ other than by the renames at char {i} of a "
                             f"({a[i:i + 40]!r}) and char {j} of b ({b[j:j + 40]!r})")
    close()
    return out


@dataclass(frozen=True)
class TokenAlignment:
    """Paired token indices (`a_index[k]` of a with `b_index[k]` of b) and the regions' unpaired counts."""

    a_index: tuple[int, ...]
    b_index: tuple[int, ...]
    a_unpaired: int
    b_unpaired: int

    def __len__(self) -> int:
        return len(self.a_index)


def _inside(span: tuple[int, int], regions: Sequence[tuple[int, int]] | None) -> bool:
    if regions is None:
        return True
    return any(lo <= span[0] and span[1] <= hi for lo, hi in regions)


def align_tokens(segments: Sequence[Segment], a_ids: Sequence[int], a_offsets: Sequence[tuple[int, int]],
                 b_ids: Sequence[int], b_offsets: Sequence[tuple[int, int]], *,
                 a_regions: Sequence[tuple[int, int]] | None = None,
                 b_regions: Sequence[tuple[int, int]] | None = None) -> TokenAlignment:
    """Pair tokens of a and b at the same place of the same shared segment with the same id. Offsets are
    char spans; tokens outside the regions (None: everywhere) and empty spans are never paired."""
    if len(a_ids) != len(a_offsets) or len(b_ids) != len(b_offsets):
        raise ValueError("every token needs one (start, end) offset")
    shared = [s for s in segments if s.kind == "shared"]
    starts = [s.b_start for s in shared]
    a_at: dict[tuple[int, int], list[int]] = defaultdict(list)
    a_considered = 0
    for k, span in enumerate(a_offsets):
        if span[1] > span[0] and _inside(span, a_regions):
            a_at[tuple(span)].append(k)
            a_considered += 1
    taken: dict[tuple[int, int], int] = defaultdict(int)
    pairs_a: list[int] = []
    pairs_b: list[int] = []
    b_considered = 0
    for k, (lo, hi) in enumerate(b_offsets):
        if hi <= lo or not _inside((lo, hi), b_regions):
            continue
        b_considered += 1
        s = bisect.bisect_right(starts, lo) - 1
        if s < 0 or hi > shared[s].b_end:
            continue
        seg = shared[s]
        span = (lo - seg.b_start + seg.a_start, hi - seg.b_start + seg.a_start)
        candidates = a_at.get(span, [])
        n = taken[span]
        if n < len(candidates) and a_ids[candidates[n]] == b_ids[k]:
            taken[span] = n + 1
            pairs_a.append(candidates[n])
            pairs_b.append(k)
    return TokenAlignment(tuple(pairs_a), tuple(pairs_b), a_considered - len(pairs_a),
                          b_considered - len(pairs_b))
