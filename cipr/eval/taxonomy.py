"""Failure taxonomy (paper Appendix E): what went wrong in an incorrect response, resolved against the
declared tool list.

Classes, checked in this order (the first that applies wins):
- `correct`: the scorer accepted the response.
- `backend_error`: the backend never produced an output (endpoint failed after its retries).
- `parse_failure`: the output does not follow the call format (`ParseResult.ok` is False).
- `no_call`: a call was expected and none was made.
- `wrong_count`: the number of calls differs from the reference's (including a call where none was
  expected).
- `undeclared_tool`: a call names a tool the interface does not declare (under the adapter: a
  canonical id it cannot translate back). The paper's two wrong-tool classes are both declared tools,
  so this one is kept apart rather than folded into `unrelated_tool`.
- `equivalent_tool`: a called tool that the reference does not call has the same description as a
  reference tool once the cost or latency annotation is removed: the costlier or slower equivalent.
- `unrelated_tool`: any other wrong declared tool.
- `argument_error`: the right tools, the right count, and the scorer still rejects: an argument error
  given the correct tool.
- `other`: incorrect for a reason none of the above names (e.g. a text answer judged wrong).

An episode (`classify_episode`, from what `cipr.envs.base.Play` counted) gets, in this order: `correct`;
`backend_error`; `cut_off` (it ended at a turn cut off by the token limit); `parse_failure` (it ended at
a turn that could not be parsed, or wrote no readable call but a malformed one); `no_call` (it wrote no call
while the reference calls); then, calls written: `undeclared_tool` (a name the adapter refused); the
wrong tool added by the perturbation, `equivalent_tool` (a costlier or slower equivalent) or
`unrelated_tool` (another added tool); `parse_failure` (a malformed turn besides); `refused_call` (none was
executed: the environment refused them); `wrong_call` (calls executed, the episode still failed); `other`
(no call written and none expected, e.g. an answer judged wrong).

"Once the annotation is removed" is not defined further by the paper. Here an annotation is any
bracketed span (`[...]`, `(...)`, `{...}`, `<...>`) or sentence that mentions a cost or latency word
(`TaxonomyConfig.annotation_pattern`); both descriptions lose them and are compared as lower-case word
sequences. Two descriptions whose word-level diff holds only numbers, units, punctuation and
cost/latency words are also the same (an annotation glued to a description without a final period is
no sentence of its own). An original sentence mentioning cost is removed from both sides alike.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from cipr.tools.interface import Call, Interface

CLASSES = ("correct", "backend_error", "cut_off", "parse_failure", "no_call", "wrong_count",
           "undeclared_tool", "refused_call", "equivalent_tool", "unrelated_tool", "argument_error",
           "wrong_call", "other")
"""Of single responses (`classify`) and episodes (`classify_episode`; `cut_off`, `refused_call`, `wrong_call`
are episodes' only)."""

DEFAULT_ANNOTATION = (
    r"cost|price|pricing|priced|expensive|cheap|afford|fee\b|fees\b|charge|billing|billed|credit|budget|"
    r"premium|econom|dollar|cent\b|cents\b|usd|\$|€|latency|slow|fast|quick|speed|delay|wait|"
    r"response time|millisecond|\bms\b|seconds?\b|minutes?\b|\bsec\b|throughput|rate limit"
)


@dataclass(frozen=True)
class TaxonomyConfig:
    """What counts as a cost or latency annotation in a tool description (a case-insensitive regex)."""

    annotation_pattern: str = DEFAULT_ANNOTATION


@lru_cache(maxsize=8)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


_BRACKETS = re.compile(r"\[[^\[\]]*\]|\([^()]*\)|\{[^{}]*\}|<[^<>]*>")
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\n+")


def strip_annotation(description: str, config: TaxonomyConfig = TaxonomyConfig()) -> str:
    """The words of a description without bracketed spans or sentences that mention cost or latency."""
    kw = _compiled(config.annotation_pattern)
    text = _BRACKETS.sub(lambda m: " " if kw.search(m.group(0)) else m.group(0), description)
    kept = [s for s in _SENTENCE_BREAK.split(text) if s.strip() and not kw.search(s)]
    return " ".join(re.findall(r"\w+", " ".join(kept).lower()))


_TOKEN = re.compile(r"\$?\d+(?:[.,]\d+)*|\w+|[^\w\s]")
_NUMBER = re.compile(r"^\$?\d+(?:[.,]\d+)*$")


def _annotation_token(tok: str, kw: re.Pattern[str]) -> bool:
    return bool(_NUMBER.match(tok) or not tok[0].isalnum() and tok[0] != "$" or kw.search(tok)
                or tok in _UNIT_WORDS)


_UNIT_WORDS = frozenset({"per", "call", "calls", "request", "requests", "about", "around", "approximately",
                         "typically", "usd", "ms", "s"})


def _differ_only_in_annotation(a: str, b: str, kw: re.Pattern[str]) -> bool:
    """Word-level diff of a and b: every differing token is a number, unit, punctuation or cost/latency
    word, and the shared tokens include at least one real word of the description."""
    ta, tb = _TOKEN.findall(a.lower()), _TOKEN.findall(b.lower())
    shared_word = False
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ta, tb, autojunk=False).get_opcodes():
        if op == "equal":
            shared_word = shared_word or any(not _annotation_token(t, kw) for t in ta[i1:i2])
        elif not all(_annotation_token(t, kw) for t in ta[i1:i2] + tb[j1:j2]):
            return False
    return shared_word


def equivalent_descriptions(a: str, b: str, config: TaxonomyConfig = TaxonomyConfig()) -> bool:
    """Whether two descriptions are the same once cost or latency annotations are removed: equal after
    `strip_annotation` (and not empty), or differing only in annotation tokens (module docstring)."""
    sa, sb = strip_annotation(a, config), strip_annotation(b, config)
    if sa and sa == sb:
        return True
    return _differ_only_in_annotation(a, b, _compiled(config.annotation_pattern))


def is_equivalent_tool(called: str, correct: str, interface: Interface,
                       config: TaxonomyConfig = TaxonomyConfig()) -> bool:
    """Whether some declaration of `called` is the annotated equivalent of some declaration of `correct`."""
    if called == correct:
        return False
    return any(equivalent_descriptions(c.description, r.description, config)
               for c in interface.declarations(called) for r in interface.declarations(correct))


def classify(*, interface: Interface, reference: Sequence[Call], calls: Sequence[Call], correct: bool,
             parse_ok: bool = True, undeclared: Sequence[str] = (), backend_error: bool = False,
             config: TaxonomyConfig = TaxonomyConfig()) -> str:
    """The taxonomy class of one response (module docstring). `interface`, `reference` and `calls` are in
    the executable namespace; `undeclared`: names the adapter could not translate back."""
    if correct:
        return "correct"
    if backend_error:
        return "backend_error"
    if not parse_ok:
        return "parse_failure"
    n_calls = len(calls) + len(undeclared)
    if n_calls == 0 and reference:
        return "no_call"
    if n_calls != len(reference):
        return "wrong_count"
    if undeclared or any(c.name not in interface for c in calls):
        return "undeclared_tool"
    called, expected = Counter(c.name for c in calls), Counter(c.name for c in reference)
    extra = called - expected
    if extra:
        missing = list(expected - called) or list(expected)
        if any(is_equivalent_tool(name, ref, interface, config) for name in extra for ref in missing):
            return "equivalent_tool"
        return "unrelated_tool"
    if reference:
        return "argument_error"
    return "other"


def classify_episode(counts: Mapping[str, int], added_roles: Sequence[str], *, correct: bool, end: str | None,
                     reference_calls: int) -> str:
    """The taxonomy class of one episode (module docstring): `counts` and `added_roles` as the episode loop
    counted them (`cipr.envs.base.Play`), `end` why it ended, `reference_calls` how many calls the reference
    makes."""
    if correct:
        return "correct"
    if counts.get("backend_errors") or end == "backend_error":
        return "backend_error"
    if end == "cut_off":
        return "cut_off"
    if end == "unparseable":
        return "parse_failure"
    if not counts.get("calls"):
        if counts.get("parse_failures"):
            return "parse_failure"
        return "no_call" if reference_calls else "other"
    if counts.get("undeclared"):
        return "undeclared_tool"
    if added_roles:
        costly = any(r in ("costlier", "slower") for r in added_roles)
        return "equivalent_tool" if costly else "unrelated_tool"
    if counts.get("parse_failures"):
        return "parse_failure"
    return "wrong_call" if counts.get("executed") else "refused_call"
