"""The evidence experiment as a study (configs/study/cpu_evidence.yaml) end to end on the tiny offline model
(every point trained, exported, evaluated twice by cipr-eval, reported by its analysis), its resume, its
report recomputed from the committed JSON, and the report's arithmetic by hand. The end-to-end run uses one
seed (three points): pairing across seeds is the report's arithmetic, checked by hand below."""

from __future__ import annotations

import json
import math

import pytest

from cipr.experiments.evidence import build_report

TYPES = ("relabel_function", "relabel_random", "typos")


def _metrics(heldin: float, acc: float) -> dict:
    return {"original_accuracy": acc, "kl": {t: heldin + i for i, t in enumerate(TYPES)},
            "heldin_kl_unseen": 2 * heldin, "accuracy": {t: acc - 0.1 * i for i, t in enumerate(TYPES)},
            "items": 4, "full_call_accuracy": 0.5}


def test_report_pairs_cipr_with_multi_interface_by_seed_by_hand():
    metrics = {"multi_interface": {s: _metrics(0.5 + 0.1 * s, 0.6) for s in (0, 1, 2)},
               "cipr": {s: _metrics(0.2 + 0.1 * s + 0.01 * s * s, 0.62) for s in (0, 1, 2)}}
    report = build_report(TYPES, "relabel_function", metrics, {"P0": "p0", "P1": "p1", "P2": "p2"})
    p = report["paired"]
    diffs = [(0.2 + 0.1 * s + 0.01 * s * s) - (0.5 + 0.1 * s) for s in (0, 1, 2)]
    assert p["heldin_kl"]["per_seed"] == pytest.approx(diffs)
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)  # t(0.975, 2 df)
    assert p["heldin_kl"]["mean"] == pytest.approx(mean)
    assert p["heldin_kl"]["high"] == pytest.approx(mean + half)
    assert report["outcome"]["P0"] is True and report["outcome"]["P2"] is True
    assert p["heldin_kl_unseen"]["per_seed"] == pytest.approx([2 * d for d in diffs])
    assert report["outcome"]["P0_unseen_items"] is True
    assert report["arms"]["cipr"]["heldout_kl"].keys() == {"relabel_random", "typos"}
    assert p["heldout_accuracy_drop"]["typos"]["per_seed"] == pytest.approx([0.0, 0.0, 0.0], abs=1e-12)
    metrics["multi_interface"] = {0: metrics["multi_interface"][0]}
    one = build_report(TYPES, "relabel_function", metrics, {})["paired"]
    assert one["seeds"] == [0] and math.isnan(one["heldin_kl"]["high"])  # one seed: no interval


def test_the_spec_trains_the_committed_arms_and_a_lambda_sweep_is_an_arm(tmp_path):
    from cipr.experiments.spec import load_options
    from cipr.experiments.study import Point, point_overrides
    from cipr.train.config import compose_train

    options = load_options(["study=cpu_evidence", f"out_dir={tmp_path}",
                            "study.arms.cipr_lambda10=['algo=cipr_sft','algo.terms.rescore.weight=10.0']",
                            "study.labels.cipr_lambda10={names:canonical}"])
    assert list(options.study.arms) == ["baseline", "multi_interface", "cipr", "cipr_lambda10"]
    cfg = compose_train(point_overrides(options, Point("cipr_lambda10", 2)))
    assert cfg.algo.name == "cipr" and cfg.algo.terms["rescore"].weight == 10.0 and cfg.trainer.seed == 2
    assert cfg.trainer.max_steps == 10 and cfg.algo.action_weight == 1.0  # the sweep's, not the engine's
    baseline = compose_train(point_overrides(options, Point("baseline", 0)))
    assert baseline.algo.name == "grpo" and baseline.algo.regime == "supervised"


def test_the_committed_report_recomputes_byte_identical(tmp_path):
    import shutil

    from cipr.cli.study import main

    for name in ("cpu_evidence.json", "cpu_evidence_tables.md", "cpu_evidence.png"):
        shutil.copy(f"docs/results/{name}", tmp_path / name)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert main(["report", "study=cpu_evidence", f"report_dir={tmp_path}"]) == 0
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.integration
def test_the_study_trains_evaluates_reports_and_resumes(tmp_path, one_thread):
    from support.tiny_models import save_tiny

    from cipr.cli.study import main

    model = save_tiny(tmp_path / "tiny")
    out, report = tmp_path / "out", tmp_path / "report"
    evaluation = ["benchmark=synthetic", "benchmark.format=compact", "benchmark.tools_per_example=[3,3]",
                  "names=[{names}]", "generate=false", "consistency.enabled=true", "limit=2",
                  "perturbations=[relabel_function,relabel_random,typos,distractor_similar_name]"]
    args = ["study=cpu_evidence", "study.seeds=[0]", f"out_dir={out}", f"report_dir={report}",
            "study.evaluations.consistency=[" + ",".join(f"'{o}'" for o in evaluation) + "]",
            "study.evaluations.generation=['benchmark=synthetic','benchmark.format=compact',"
            "'names=[{names}]','perturbations=[original]','limit=1','max_new_tokens=16']",
            "train.model=tiny", f"train.model.name_or_path={model}", "train.model.freeze_bottom_layers=0",
            "train.data.n=40", "train.trainer.max_steps=1", "train.trainer.save_steps=1",
            "train.trainer.warm_start.steps=2", "train.trainer.warm_start.per_device_train_batch_size=2",
            "train.logging.progress_bar=false"]
    assert main(["run", *args]) == 0
    data = json.loads((report / "cpu_evidence.json").read_text())
    assert set(data["arms"]) == {"baseline", "multi_interface", "cipr"}
    for arm in data["arms"].values():
        assert arm["seeds"] == [0] and len(arm["heldin_kl"]) == 1 and arm["items"] == [2]
        assert set(arm["heldout_kl"]) == {"relabel_random", "typos", "distractor_similar_name"}
        assert all(0 <= a <= 1 for a in arm["original_accuracy"])
    assert data["paired"]["seeds"] == [0] and set(data["outcome"]) == {"P0", "P0_unseen_items", "P1", "P2"}
    assert data["wall_s"] > 0 and (report / "cpu_evidence.png").stat().st_size > 0
    assert "CIPR − multi-interface" in (report / "cpu_evidence_tables.md").read_text()
    assert not (out / "exports" / "cipr_s0").exists()  # the export is dropped once evaluated
    assert main(["run", *args]) == 0  # nothing left to train or evaluate: the same report
    assert json.loads((report / "cpu_evidence.json").read_text())["arms"] == data["arms"]
    assert json.loads((report / "cpu_evidence.json").read_text())["wall_s"] == data["wall_s"]
