"""notebooks/results.ipynb runs headless (nbclient) on two small hand-written runs."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.integration  # subprocesses / end-to-end runs: the integration tier

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "results.ipynb"
TYPES = [("original", "original", ("original",)), ("typos", "typos_distractors", ("original",)),
         ("cost_tag_explicit", "cost_latency_explicit", ("original", "costly_first"))]


def write_run(run: Path, model: str, skill: int) -> None:
    """Five items; item i is correct on a type when i < skill (cost types: only in the original order)."""
    run.mkdir(parents=True)
    lines = []
    for i in range(5):
        for pert, group, orders in TYPES:
            for order in orders:
                ok = i < skill and (order == "original" or pert == "original")
                lines.append({"id": f"item{i}", "partition": "simple", "names": "canonical",
                              "perturbation": pert, "group": group, "order": order, "raw": "", "correct": ok,
                              "error": None if ok else "wrong_name",
                              "taxonomy": "correct" if ok else "equivalent_tool"})
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (run / "run.json").write_text(json.dumps({"model": model, "benchmark": "bfcl",
                                              "perturbations": [t for t, _, _ in TYPES]}))


def test_notebook_executes_on_fixture_runs(tmp_path, monkeypatch):
    a, b = tmp_path / "grpo", tmp_path / "cipr"
    write_run(a, "grpo", 2)
    write_run(b, "cipr", 4)
    monkeypatch.setenv("CIPR_EVAL_RUNS", f"{a}:{b}")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    assert "Table 1 shape" in text and "B − A" in text
    # 2 plots per run + the cross-run figure
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 5
    for run in (a, b):
        assert (run / "summary.json").exists() and (run / "plots" / "accuracy_by_type.png").exists()
    s = json.loads((b / "summary.json").read_text())["names"]["canonical"]
    assert s["types"]["original"]["accuracy"]["value"] == 80.0
    assert s["types"]["cost_tag_explicit"]["orders"]["costly_first"]["value"] == 0.0
