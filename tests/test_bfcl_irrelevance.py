"""BFCL v4's abstention items (`cipr-eval benchmark=bfcl_irrelevance`): loaded as BFCL ships them, scored as
BFCL scores them (no call is correct; a reply BFCL cannot decode counts as no call), and run end to end."""

from __future__ import annotations

import json

import pytest

from cipr.data.bfcl import IRRELEVANCE, NO_CALL_ANSWER, load_bfcl_irrelevance
from cipr.eval.config import compose_eval_config
from cipr.eval.evaluate import evaluate
from cipr.formats.toolrl import ToolRLFormat
from cipr.tools.interface import Call


def test_both_files_load_with_every_item(shared_data):
    items = load_bfcl_irrelevance(shared_data)
    assert len(items) == sum(IRRELEVANCE.values()) == 1124
    assert all(not e.reference and e.response == NO_CALL_ANSWER for e in items)
    assert sum(1 for e in items if len(e.interface) == 0) == 4  # live_irrelevance_120-9-0 ... 123-9-3
    assert [e.partition for e in load_bfcl_irrelevance(shared_data, ["irrelevance"])] == ["irrelevance"] * 240


def _bfcl_verdict(calls: list[Call]) -> bool:
    """BFCL's irrelevance rule (eval_runner's relevance check) on a decoded list of calls."""
    from bfcl_eval.utils import is_empty_output

    decoded = [{c.name: dict(c.arguments)} for c in calls]
    return is_empty_output(decoded)  # success: no function call in the output


def test_the_scorer_agrees_with_bfcls_checker_on_replayed_answers(tmp_path, shared_data):
    """Replayed no-call answers are correct and replayed calls are wrong, item by item, as BFCL decides."""
    fmt = ToolRLFormat()
    items = [e for e in load_bfcl_irrelevance(shared_data) if len(e.interface)][::20]
    for mode, expected in (("reference", True), ("call", False)):
        rows = []
        for e in items:
            calls = [] if mode == "reference" else [Call(e.interface.names[0], {})]
            rows.append(calls)
            assert _bfcl_verdict(calls) is expected
        out = tmp_path / mode
        if mode == "reference":
            summary = evaluate(compose_eval_config([
                "benchmark=bfcl_irrelevance", "backend=replay", "perturbations=[original]", f"out_dir={out}",
                f"data_root={shared_data}", "progress=false"]))
            records = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
            assert len(records) == 1124 and all(r["correct"] for r in records)
            assert summary["names"]["original"]["types"]["original"]["accuracy"]["value"] == 100.0
        for e, calls in zip(items, rows, strict=True):
            from cipr.eval.scorers import bfcl_scorer

            text = fmt.render_target(calls, response=e.response)
            parse = fmt.parse(text)
            verdict = bfcl_scorer(calls=parse.calls, target=e, shown=e, text=text, parse=parse)
            assert verdict.correct is _bfcl_verdict(list(parse.calls))


@pytest.mark.integration
def test_the_embedded_model_on_twenty_items(tmp_path, shared_data, one_thread):
    out = tmp_path / "irrelevance"
    summary = evaluate(compose_eval_config([
        "benchmark=bfcl_irrelevance", "limit=20", "perturbations=[original,typos]", "max_new_tokens=32",
        "consistency.enabled=true", f"out_dir={out}", f"data_root={shared_data}", "progress=false"]))
    records = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(records) == 40 and {r["perturbation"] for r in records} == {"original", "typos"}
    consistency = summary["consistency"]["names"]["original"]["types"]["typos"]
    assert 0 <= consistency["none_ref"]["value"] <= 100  # the no-call mass beside the generated verdict
    assert "none_ref" in (out / "report.md").read_text() or "no call" in (out / "report.md").read_text()
