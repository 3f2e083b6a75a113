"""The transfer experiment (cipr/experiments/transfer.py, transfer_analysis.py): its statistics by hand
values, its splits, the λ = 0 identity on the arms' own path, and (integration) the whole command on a tiny
model."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest
from safetensors.torch import load_file
from support.tiny_models import save_tiny

from cipr.experiments.items import heldout_exclude, transfer_items
from cipr.experiments.transfer_analysis import (
    analyze,
    decision,
    leave_one_seed_out,
    matrix,
    paired_t,
    render,
    two_way_bootstrap,
)
from cipr.train.config import compose_train


def test_paired_t_by_hand():
    out = paired_t([1.0, 2.0, 3.0, 4.0])  # mean 2.5, sd 1.2910, t(0.975, 3) = 3.1824
    half = 3.182446 * 1.290994 / 2
    assert out["mean"] == 2.5 and out["n"] == 4
    assert out["low"] == pytest.approx(2.5 - half, rel=1e-5)
    assert out["high"] == pytest.approx(2.5 + half, rel=1e-5)
    assert out["t"] == pytest.approx(2.5 / (1.290994 / 2), rel=1e-5)


def test_decision_rule():
    assert decision(-0.05, -0.01) == "shown"
    assert decision(-0.02, 0.04) == "bounded"
    assert decision(-0.05, 0.01) == "inconclusive"
    assert decision(-0.029, -0.001) == "shown"  # both hold: shown comes first


def test_two_way_bootstrap_is_the_mean_and_widens_with_either_spread():
    flat = np.full((12, 50), -0.02)
    out = two_way_bootstrap(flat, draws=200)
    assert out["mean"] == pytest.approx(-0.02) and out["low"] == pytest.approx(-0.02) and out["high"] == \
        pytest.approx(-0.02)
    rng = np.random.default_rng(1)
    seeds = flat + rng.normal(0, 0.05, (12, 1))
    items = flat + rng.normal(0, 0.05, (1, 50))
    w_seeds, w_items = (two_way_bootstrap(m, draws=400) for m in (seeds, items))
    assert w_seeds["high"] - w_seeds["low"] > 0.02 and w_items["high"] - w_items["low"] > 0.01


def _records(effect: float, seeds: int = 4, items: int = 6) -> list[dict]:
    out = []
    for arm in ("multi_interface", "cipr"):
        for s in range(seeds):
            for i in range(items):
                kl = 0.2 + 0.01 * i + 0.003 * s + (effect if arm == "cipr" else 0.0)
                for kind in ("relabel_random", "relabel_function"):
                    out.append({"arm": arm, "seed": s, "id": f"x{i}", "split": "near" if i < 3 else "hard",
                            "perturbation": kind, "kl": kl, "action_acc_ref": 1.0,
                            "action_acc_pert": 1.0})
    return out


def test_analysis_recovers_a_planted_effect_and_names_the_decision():
    meta = {"design": {"primary": "relabel_random", "heldin": "relabel_function",
                       "types": ["relabel_random", "relabel_function"],
                       "items": {"near": [1, 2, 3], "hard": [4, 5, 6]}}}
    shown = analyze(_records(-0.05), meta)
    assert shown["primary"]["mean"] == pytest.approx(-0.05) and shown["decision"] == "shown"
    assert shown["arms"]["cipr"]["seeds"] == [0, 1, 2, 3] and len(shown["arms"]["cipr"]["primary_kl"]) == 4
    assert shown["two_way"]["mean"] == pytest.approx(-0.05) and shown["outcome"]["P0_shown"]
    assert shown["by_split"]["near"]["items"] == 3 and shown["robust"]["log_kl"]["mean"] < 0
    rng = np.random.default_rng(0)
    noisy = _records(0.0)
    for r in noisy:
        r["kl"] += float(rng.normal(0, 0.1)) ** 2
    assert analyze(noisy, meta)["decision"] in ("bounded", "inconclusive")
    seeds, items, by_arm = matrix(noisy, "kl", "relabel_random", "hard")
    assert seeds == [0, 1, 2, 3] and items == ["x3", "x4", "x5"] and by_arm["cipr"].shape == (4, 3)


def test_leave_one_seed_out_drops_the_farthest_seed_by_hand():
    out = leave_one_seed_out([0.1, 0.0, 0.2, 1.0], [5, 6, 7, 8])
    assert out["seed"] == 8 and out["difference"] == 1.0
    assert out["without"]["n"] == 3 and out["without"]["mean"] == pytest.approx(0.1)
    assert leave_one_seed_out([0.1, 0.2, 0.3], [0, 1, 2]) == {}


def test_a_failed_positive_control_comes_first_and_bounded_is_called_one_sided():
    meta = {"design": {"primary": "relabel_random", "heldin": "relabel_function",
                       "types": ["relabel_random", "relabel_function"],
                       "items": {"near": [1, 2, 3], "hard": [4, 5, 6]}}}
    records = _records(0.0)
    rng = np.random.default_rng(1)
    for r in records:  # no effect on either type: P0 fails; the primary interval straddles 0 narrowly
        r["kl"] += float(rng.normal(0, 0.001))
    report = analyze(records, meta)
    assert not report["outcome"]["P0_shown"] and report["decision"] == "bounded"
    text = render(report)
    result = text.split("## Result", 1)[1]
    assert result.index("**The positive control did not hold**") < result.index("**Bounded (one-sided)")
    assert "not read as a test of transfer" in result and "not harm" in result
    assert f"seed {report['sensitivity']['seed']}" in result
    shown = render(analyze(_records(-0.05), meta))
    assert "positive control did not hold" not in shown and "**Transfer is shown**" in shown


def _point(arm: str, seed: int, out, *extra: str):
    from cipr.experiments.spec import load_options
    from cipr.experiments.study import Point, point_overrides

    options = load_options(["study=cpu_transfer", f"out_dir={out}", *extra])
    return compose_train(point_overrides(options, Point(arm, seed)))


@pytest.mark.integration
def test_the_sweep_holds_the_drawn_held_out_split_and_the_items_respect_it(tmp_path):
    from cipr.experiments.items import draw_items
    from cipr.experiments.spec import load_options

    cfg = _point("cipr", 3, tmp_path)
    assert list(cfg.data.exclude) == heldout_exclude()
    assert cfg.algo.name == "cipr" and cfg.algo.terms["rescore"].weight == 1.0
    assert cfg.algo.action_weight == 1.0
    assert cfg.trainer.seed == 3 and cfg.perturb.seed == 3
    items = transfer_items(cfg.data, 6, eval_seed=5)
    held_tools = {e for e in cfg.data.exclude if "#" not in e}
    held_templates = {tuple(e.split("#")) for e in cfg.data.exclude if "#" in e}
    for e in items["hard"]:
        ((tool, k),) = e.meta["templates"]
        assert tool in held_tools or (tool, str(k)) in held_templates
    for e in items["near"]:
        ((tool, k),) = e.meta["templates"]
        assert tool not in held_tools and (tool, str(k)) not in held_templates
        assert not set(e.interface.names) & held_tools
    assert len(items["near"]) == len(items["hard"]) == 6
    committed = json.loads(open("docs/results/cpu_transfer.json").read())["meta"]["design"]["items"]
    drawn = draw_items(load_options(["study=cpu_transfer"]).study, cfg.data)
    assert {s: [e.id for e in v] for s, v in drawn.items()} == committed


@pytest.mark.integration
def test_lambda_zero_cipr_trains_like_multi_interface_on_the_arms_own_path(tmp_path):
    """The experiment's own configs (action_weight 1, per-seed copies, held-out split), CIPR at λ = 0."""
    tiny = save_tiny(tmp_path / "tiny")
    train = {"model": "tiny", "model.name_or_path": str(tiny), "trainer.max_steps": 2,
             "trainer.save_steps": 2, "trainer.warm_start.steps": 0, "data.n": 16,
             "logging.progress_bar": False}
    from cipr.train.run import run

    runs = {}
    for arm in ("multi_interface", "cipr"):
        extra = [f"++train.{k}={v}" for k, v in train.items()]
        extra += ["study.arms.cipr=['algo=cipr_sft','algo.terms.rescore.weight=0']"]
        runs[arm] = run(_point(arm, 1, tmp_path / arm, *extra))
    a, b = (load_file(str(r / "supervised" / "final" / "model.safetensors")) for r in runs.values())
    assert a.keys() == b.keys() and all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)
    lines = [json.loads(x) for x in (runs["cipr"] / "metrics.jsonl").read_text().splitlines()]
    assert any("consistency/rescore/kl" in r for r in lines)  # the zero-weight term was computed


@pytest.mark.integration
def test_the_spec_trains_reads_reports_and_recomputes(tmp_path, one_thread):
    from cipr.cli.study import main

    tiny = save_tiny(tmp_path / "tiny")
    out, report = tmp_path / "out", tmp_path / "report"
    args = ["study=cpu_transfer", "study.seeds=[0,1]", "study.items.n=3", "study.items.secondary_items=1",
            "study.items.seed=1", "study.read_at=[2]", f"out_dir={out}", f"report_dir={report}",
            "train.model=tiny", f"train.model.name_or_path={tiny}", "train.trainer.save_steps=2",
            "train.trainer.warm_start.steps=2", "train.logging.progress_bar=false"]
    assert main(["run", *args, "run_seeds=[0]", "report=false"]) == 0 and not report.exists()
    assert sorted(p.name for p in (out / "records").iterdir()) == [
        "cipr_s0.json", "cipr_s0.jsonl", "cipr_s0.trace.jsonl", "multi_interface_s0.json",
        "multi_interface_s0.jsonl", "multi_interface_s0.trace.jsonl"]
    assert not list((out / "points" / "cipr_s0" / "supervised").glob("checkpoint-*"))  # dropped once read
    assert main(["run", *args]) == 0  # the second piece: seed 1 only, then the report over both
    data = json.loads((report / "cpu_transfer.json").read_text())
    assert data["arms"]["cipr"]["seeds"] == [0, 1] and data["n_items"] == 6
    assert set(data["splits"]) == {"near", "hard"}
    assert data["decision"] in ("shown", "bounded", "inconclusive")
    records = gzip.decompress((report / "cpu_transfer_records.jsonl.gz").read_bytes()).decode().splitlines()
    types = {json.loads(x)["perturbation"] for x in records}
    assert types == {"relabel_random", "relabel_function", "lookalike_shown", "paraphrase", "reorder"}
    assert all(math.isfinite(v) for v in data["primary"]["per_seed"])
    before = (report / "cpu_transfer.md").read_text()
    assert main(["report", "study=cpu_transfer", f"report_dir={report}"]) == 0
    assert (report / "cpu_transfer.md").read_text() == before


def test_report_names_a_records_file_that_is_not_gzip_or_not_json_lines(tmp_path):
    from cipr.core.errors import DataError
    from cipr.experiments.transfer_analysis import RECORDS, recompute

    (tmp_path / "cpu_transfer.json").write_text('{"meta": {}}')
    (tmp_path / RECORDS).write_bytes(b"plain text, not gzip")
    with pytest.raises(DataError, match=f"file '{tmp_path / RECORDS}'.*not a readable gzip file"):
        recompute(tmp_path)
    (tmp_path / RECORDS).write_bytes(gzip.compress(b'{"arm": "cipr"}\n{"arm": \n'))
    with pytest.raises(DataError, match="line 2"):
        recompute(tmp_path)
