"""The evidence experiment's command end to end on the tiny offline model (every point trained in a
subprocess, exported, evaluated twice, reported), its resume, and the report's arithmetic by hand. The
end-to-end run uses one seed (three points): pairing across seeds is the report's arithmetic, checked by hand
below."""

from __future__ import annotations

import json
import math

import pytest

from cipr.experiments.evidence import EvidenceConfig, build_report

TYPES = ("relabel_function", "relabel_random", "typos")


def _metrics(heldin: float, acc: float) -> dict:
    return {"original_accuracy": acc, "kl": {t: heldin + i for i, t in enumerate(TYPES)},
            "heldin_kl_unseen": 2 * heldin, "accuracy": {t: acc - 0.1 * i for i, t in enumerate(TYPES)},
            "items": 4, "full_call_accuracy": 0.5}


def test_report_pairs_cipr_with_multi_interface_by_seed_by_hand():
    config = EvidenceConfig(types=TYPES, seeds=(0, 1, 2))
    metrics = {"multi_interface": {s: _metrics(0.5 + 0.1 * s, 0.6) for s in (0, 1, 2)},
               "cipr": {s: _metrics(0.2 + 0.1 * s + 0.01 * s * s, 0.62) for s in (0, 1, 2)}}
    report = build_report(config, metrics, {"P0": "p0", "P1": "p1", "P2": "p2"})
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
    one = build_report(config, metrics, {})["paired"]
    assert one["seeds"] == [0] and math.isnan(one["heldin_kl"]["high"])  # one seed: no interval


def test_command_line_options_become_the_plan(capsys, monkeypatch):
    from cipr.cli.evidence import main
    from cipr.core.config import from_overrides
    from cipr.experiments import evidence
    from cipr.experiments.evidence import train_command
    from cipr.experiments.study import Point

    monkeypatch.setattr(evidence, "run_evidence", lambda *a: pytest.fail("bad input reached the experiment"))

    config = from_overrides(EvidenceConfig, ["seeds=[0]", "lambdas=[0.1,10]", "train.model=tiny",
                                             "train.model.name_or_path=/m/x", "train.hydra.sweep.dir=/s"])
    arms = config.all_arms
    assert [a.name for a in arms] == \
        ["baseline", "multi_interface", "cipr", "cipr_lambda0.1", "cipr_lambda10"]
    command = train_command(config, Point(arms[4].name, 0))
    assert command[-6:] == ["algo=cipr_sft", "algo.rescore_weight=10.0", "trainer.seed=0", "model=tiny",
                            "model.name_or_path=/m/x", "hydra.sweep.dir=/s"]
    for argv, message in ((["limit=0"], "limit=0 must be >= 1"), (["seed=[0]"], "Did you mean 'seeds'?"),
                          (["lambdas=x"], "'lambdas' must be a list")):
        assert main(argv) == 2 and message in capsys.readouterr().err


def test_a_point_is_found_by_its_resolved_weight_not_the_alias_it_was_launched_with(tmp_path):
    """cipr-train writes `algo.rescore_weight=1.0` into `terms.rescore.weight` and nulls the alias: the
    point's folder is found by the term's weight (it was not, after the objective refactor)."""
    from cipr.experiments.evidence import run_dir_of
    from cipr.experiments.study import Point

    config = EvidenceConfig(sweep_dir=str(tmp_path), seeds=(0,))
    folders = (("cipr", "cipr", 1.0), ("lam10", "cipr", 10.0), ("mi", "multi_interface", 0.0))
    for name, algo, weight in folders:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(
            {"trainer": {"seed": 0}, "algo": {"name": algo, "rescore_weight": None,
                                              "terms": {"rescore": {"weight": weight}}}}))
    assert run_dir_of(config, Point("cipr", 0)) == tmp_path / "cipr"
    assert run_dir_of(config, Point("multi_interface", 0)) == tmp_path / "mi"


@pytest.mark.integration
def test_cipr_evidence_runs_every_point_and_resumes(tmp_path):
    import subprocess
    import sys

    from support.tiny_models import save_tiny

    model = save_tiny(tmp_path / "tiny")
    sweep = tmp_path / "sweep"
    out = tmp_path / "out"
    train = [f"model.name_or_path={model}", "model.gguf_package=null", "model.gguf_file=null",
             "model.short_name=tiny", "model.freeze_bottom_layers=0", f"hydra.sweep.dir={sweep}", "data.n=40",
             "trainer.max_steps=1", "trainer.save_steps=1", "trainer.warm_start.steps=2",
             "trainer.warm_start.per_device_train_batch_size=2", "logging.progress_bar=false"]
    command = [sys.executable, "-m", "cipr.cli.evidence", f"out_dir={out}", f"sweep_dir={sweep}", "seeds=[0]",
               "limit=2", "generation_limit=1", *(f"train.{o}" for o in train)]
    first = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.stdout.count("trained (") == 3 and first.stdout.count("min elapsed") == 6
    report = json.loads((out / "cpu_evidence.json").read_text())
    assert set(report["arms"]) == {"baseline", "multi_interface", "cipr"}
    for arm in report["arms"].values():
        assert arm["seeds"] == [0] and len(arm["heldin_kl"]) == 1 and arm["items"] == [2]
        assert set(arm["heldout_kl"]) == {"relabel_random", "typos", "distractor_similar_name"}
        assert all(0 <= a <= 1 for a in arm["original_accuracy"])
    assert report["paired"]["seeds"] == [0] and \
        set(report["outcome"]) == {"P0", "P0_unseen_items", "P1", "P2"}
    assert report["wall_s"] > 0 and (out / "cpu_evidence.png").stat().st_size > 0
    assert "CIPR − multi-interface" in (out / "cpu_evidence_tables.md").read_text()
    again = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "cpu_evidence.json").read_text())["arms"] == report["arms"]
    assert json.loads((out / "cpu_evidence.json").read_text())["wall_s"] == report["wall_s"]  # nothing redone
