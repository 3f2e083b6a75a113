"""The runner's scorers: BFCL's AST matching (also used for ToolRL test rows and synthetic examples)
and RoTBench's Content-Filling criterion, each wrapped as a `cipr.eval.runner.Scorer`."""

from __future__ import annotations

from collections.abc import Sequence

from cipr.eval.runner import Scorer, Verdict
from cipr.formats.base import ParseResult
from cipr.tools.interface import Call, Example


def bfcl_scorer(*, calls: Sequence[Call], target: Example, shown: Example, text: str,
                parse: ParseResult) -> Verdict:
    """`cipr.scoring.bfcl.score_bfcl` on the calls translated back to the target's names.

    Examples without accepted-values lists (ToolRL, synthetic) accept exactly the reference values or
    an alternative; an example without reference calls is answered correctly by no call.
    """
    from cipr.scoring.bfcl import score_bfcl

    v = score_bfcl(calls, target)
    return Verdict(v.correct, v.error, v.detail)


def rotbench_scorer(*, calls: Sequence[Call], target: Example, shown: Example, text: str,
                    parse: ParseResult) -> Verdict:
    """RoTBench's Content Filling, with RoTBench's own extraction of the action from the raw text
    (`parse_prediction`), so the benchmark's numbers are reproduced; scored in the names shown.

    Error classes: parse_failure (no extractable action), wrong_name (Tool Selection fails),
    wrong_keys (Parameter Identification fails), wrong_value (Content Filling fails).
    """
    from cipr.scoring.rotbench import content_filling, parse_prediction

    pred = parse_prediction(text)
    cf, m = content_filling(pred, target)
    if cf == 1.0:
        return Verdict(True)
    if pred is None:
        return Verdict(False, "parse_failure", "no `Action:` / `Action Input:` JSON object in the output")
    if not m["tool_selection"]:
        return Verdict(False, "wrong_name", f"action {pred.name!r} matches no accepted answer")
    if not m["parameter_identification"]:
        return Verdict(False, "wrong_keys", f"keys {sorted(pred.arguments)} match no accepted answer")
    return Verdict(False, "wrong_value", "argument values match no accepted answer")


SCORERS: dict[str, Scorer] = {"bfcl": bfcl_scorer, "rotbench": rotbench_scorer}
