"""The ladder: the sweep config, row labels and names, the report from evaluation folders (fast tier), and
end to end on the tiny model: a two-algorithm sweep from one shared warm start, cipr-ladder's report with
the consistency metric, and a rerun that exports and evaluates nothing again (integration tier)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cipr.experiments.ladder import GRPO, MI, Point, build_report, eval_names, method_label, render_ladder

PERTS = ("original", "typos", "cost_tag_explicit")


def test_labels_and_names_follow_the_paper():
    assert method_label({"name": "grpo"}) == GRPO and eval_names({"name": "grpo", "names": "original"}) == \
        ("original", "canonical")
    assert method_label({"name": "multi_interface"}) == MI and \
        eval_names({"name": "cipr", "names": "canonical"}) == ("canonical",)
    assert eval_names({"name": "masking", "names": "masked"}) == ("original",)
    assert method_label({"name": "cipr", "rescore_weight": 0.1, "rollout_weight": 0.1}) == "+ CIPR"
    assert method_label({"name": "cipr", "rescore_weight": 0.0, "rollout_weight": 0.1}) == \
        "+ CIPR w/o rescoring KL"
    assert method_label({"name": "cipr", "rescore_weight": 0.1, "rollout_weight": 0.0}) == \
        "+ CIPR w/o rollout KL"


def _compose(*overrides: str) -> tuple[Any, str, str]:
    """The composed train config of one sweep point, with its run folder and shared warm start resolved."""
    from hydra import compose, initialize_config_dir
    from hydra.core.hydra_config import HydraConfig

    from cipr.cli.train import CONFIG_DIR

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    try:
        return cfg, cfg.trainer.run_dir, cfg.trainer.warm_start.shared_dir
    finally:
        HydraConfig.instance().cfg = None


def test_sweep_config_lists_every_algorithm_and_shares_one_warm_start():
    cfg, run_dir, shared = _compose("+sweep=ladder", "algo=cipr_no_rollout", "trainer.seed=2")
    assert run_dir == "runs/ladder/smollm2-135m/cipr_rs0.1_ro0.0_s2"
    assert shared == "runs/ladder/smollm2-135m/warm_start"
    assert cfg.algo.name == "cipr" and cfg.algo.terms["rollout"].weight is None and \
        cfg.trainer.warm_start.names == "mixed"
    assert str(cfg.hydra.sweeper.params["algo"]).split(",") == \
        ["grpo", "multi_interface", "masking", "cipr", "cipr_no_rescore", "cipr_no_rollout"]


def test_cpu_ladder_config_narrows_the_ladder_and_keeps_its_folders():
    cfg, run_dir, shared = _compose("+sweep=ladder_cpu", "algo=grpo", "trainer.seed=0")
    assert run_dir == "runs/ladder_cpu/smollm2-135m/grpo_rs0.0_ro0.0_s0"
    assert shared == "runs/ladder_cpu/smollm2-135m/warm_start"
    assert str(cfg.hydra.sweeper.params["algo"]).split(",") == ["grpo", "multi_interface", "cipr"]
    assert (cfg.trainer.warm_start.steps, cfg.trainer.max_steps, cfg.rollout.max_completion_length) == \
        (40, 8, 96)
    assert (cfg.trainer.gradient_accumulation_steps, cfg.rollout.temperature) == (1, 0.7)  # as the report ran
    assert cfg.trainer.warm_start.names == "mixed" and list(cfg.data.tools_per_example) == [1, 2]


def _write_eval(folder: Path, names: str, correct: dict[tuple[str, str, str], bool],
                kl: dict[tuple[str, str], float]):
    folder.mkdir(parents=True)
    groups = {"original": "original", "typos": "typos_distractors",
              "cost_tag_explicit": "cost_latency_explicit"}
    with (folder / "results.jsonl").open("w") as f:
        for (item, pert, order), ok in correct.items():
            f.write(json.dumps({"id": item, "partition": "p", "names": names, "perturbation": pert,
                                "group": groups[pert], "order": order, "correct": ok,
                                "taxonomy": "x"}) + "\n")
    with (folder / "consistency.jsonl").open("w") as f:
        for (item, pert), v in kl.items():
            f.write(json.dumps({"id": item, "partition": "p", "names": names, "perturbation": pert,
                                "group": groups[pert], "order": "original", "kl": v, "argmax_agree": 1.0,
                                "added_mass": None, "decisions": 2, "n_added": 0}) + "\n")
    (folder / "run.json").write_text(json.dumps({"perturbations": list(PERTS), "report": {
        "original": "original", "group_mode": "item_mean",
        "mean_groups": ["typos_distractors", "cost_latency_explicit"]}}))


def test_report_pairs_rows_over_items_and_averages_seeds(tmp_path):
    def run(name, names, scores, kl):
        correct = {(i, p, "original"): bool(s) for i, row in scores.items()
                   for p, s in zip(PERTS, row, strict=True)}
        _write_eval(tmp_path / name, names, correct, {(i, p): kl for i in scores for p in PERTS[1:]})

    run("grpo_s0", "original", {"a": (1, 1, 0), "b": (1, 0, 0)}, 0.5)
    run("mi_s0", "canonical", {"a": (1, 1, 1), "b": (1, 0, 1)}, 0.2)
    run("mi_s1", "canonical", {"a": (1, 1, 1), "b": (1, 1, 1)}, 0.4)
    points = [Point("grpo_s0", tmp_path, GRPO, ("original",), True, 0),
              Point("mi_s0", tmp_path, MI, ("canonical",), True, 0),
              Point("mi_s1", tmp_path, MI, ("canonical",), True, 1)]
    rep = build_report(tmp_path, points, [Point("x", tmp_path, "+ CIPR", ("canonical",), False, 0)])
    assert rep["columns"] == ["original", "typos_distractors", "cost_latency_explicit", "mean", "gap"]
    grpo, mi = rep["rows"][f"{GRPO} (original names)"], rep["rows"][f"{MI} (canonical names)"]
    assert grpo["accuracy"]["mean"]["value"] == pytest.approx(25.0) and \
        grpo["accuracy"]["gap"]["value"] == 75.0
    assert mi["points"] == ["mi_s0", "mi_s1"]
    assert mi["accuracy"]["typos_distractors"]["value"] == pytest.approx(75.0)  # b: seeds 0 and 1 averaged
    assert mi["consistency"]["kl"]["mean"]["value"] == pytest.approx(0.3)
    d = rep["differences"]["grpo"]["rows"][f"{MI} (canonical names)"]
    assert d["accuracy"]["mean"]["value"] == pytest.approx(100 * ((1.0 - 0.5) + (0.75 - 0.0)) / 2)
    assert d["accuracy"]["mean"]["n"] == 2 and d["consistency"]["kl"]["mean"]["value"] == pytest.approx(-0.2)
    assert set(rep["differences"]) == {"grpo", "multi_interface"}
    md = render_ladder(rep)
    assert "## Table 1 layout" in md and "Not finished (not evaluated): x." in md and "| Mean | Gap |" in md


@pytest.mark.integration
def test_sweep_then_ladder_end_to_end_and_rerun_skips_finished_work(tmp_path):
    from support.tiny_models import save_tiny

    from cipr.cli.ladder import main as ladder_main

    tiny = save_tiny(tmp_path / "tiny")
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "cipr.cli.train", "-m", "+sweep=ladder", "model=tiny",
           f"model.name_or_path={tiny}", "algo=grpo,cipr", "trainer.seed=0", "data.n=6",
           "data.tools_per_example=[1,1]", "data.eval_examples=2", "rollout.num_generations=2",
           "rollout.max_completion_length=16", "trainer=smoke", "trainer.resume=auto", "trainer.max_steps=1",
           "trainer.save_steps=1", "trainer.per_device_train_batch_size=4", "trainer.warm_start.steps=2",
           "++trainer.torch_threads=1", "logging.progress_bar=false", f"hydra.sweep.dir={sweep}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    points = {"grpo": sweep / "grpo_rs0.0_ro0.0_s0", "cipr": sweep / "cipr_rs0.1_ro0.1_s0"}
    warm = json.loads((sweep / "warm_start" / "stage.json").read_text())
    for run_dir in points.values():  # one warm start, trained once, loaded by both points
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["warm_start_dir"] == str(sweep / "warm_start") and \
            summary["stages"]["warm_start"] == warm
        assert not (run_dir / "warm_start").exists() and (run_dir / "grpo" / "stage.json").is_file()
    ws_lines = [json.loads(x) for x in (sweep / "warm_start" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in ws_lines if r.get("kind") == "step"] == [1, 2]

    args = [f"sweep_dir={sweep}", "eval.limit=2", "eval.max_new_tokens=8", "eval.threads=1",
            "eval.batch_size=4", f"eval.perturbations=[{','.join(PERTS)}]"]
    assert ladder_main(args) == 0
    out = sweep / "ladder"
    report = json.loads((out / "ladder.json").read_text())
    assert sorted(report["work"]["evaluated"]) == ["eval:cipr_rs0.1_ro0.1_s0", "eval:grpo_rs0.0_ro0.0_s0",
                                                   "eval:warm_start"]
    assert set(report["rows"]) == {"Base (shared warm start) (original names)",
                                   "Base (shared warm start) (canonical names)", f"{GRPO} (original names)",
                                   f"{GRPO} (canonical names)", "+ CIPR (canonical names)"}
    cipr_row = report["rows"]["+ CIPR (canonical names)"]
    assert {"original", "mean", "gap"} <= set(cipr_row["accuracy"]) and \
        "mean" in cipr_row["consistency"]["kl"]
    assert "+ CIPR (canonical names)" in report["differences"]["grpo"]["rows"]
    assert (out / "ladder.png").stat().st_size > 0 and \
        "Held-out consistency: kl" in (out / "ladder.md").read_text()
    orders = {json.loads(x)["order"] for x in (out / "evals" / "cipr_rs0.1_ro0.1_s0" / "results.jsonl")
              .read_text().splitlines()}
    assert orders == {"original", "costly_first"}  # both tool orders for the cost type under canonical names

    watched = [p for p in out.rglob("*") if p.is_file() and p.name in ("results.jsonl", "consistency.jsonl",
                                                                          "model.safetensors", "done.json")]
    before = {p: p.stat().st_mtime_ns for p in watched}
    assert ladder_main(args) == 0
    again = json.loads((out / "ladder.json").read_text())
    assert again["work"]["evaluated"] == [] and again["work"]["exported"] == [] and \
        len(again["work"]["skipped"]) == 6
    assert {p: p.stat().st_mtime_ns for p in watched} == before
    assert again["rows"] == report["rows"]


def test_command_line_options_and_the_cipr_eval_options_they_pass_on(capsys):
    from cipr.cli.ladder import main
    from cipr.core.config import from_overrides
    from cipr.experiments.ladder import LadderConfig

    config = from_overrides(LadderConfig, [
        "sweep_dir=runs/l", "base=false", "eval.limit=3", "consistency=false", "eval.benchmark=bfcl",
        "eval.benchmark.format=compact", "eval.perturbations=[original,typos]", "eval.vllm.extra={a:1}",
        "eval.data_root='a b'"])
    assert (config.sweep_dir, config.base, config.consistency) == ("runs/l", False, False)
    assert config.eval_overrides == ["limit=3", "benchmark=bfcl", "benchmark.format=compact",
                                     "perturbations=[original,typos]", "vllm.extra={a:1}", "data_root='a b'"]
    for argv, message in ((["sweep_dir=x", "eval.model=m"], "cipr-ladder sets model, out_dir and names"),
                          (["sweep_dir=x", "bse=false"], "Did you mean 'base'?"),
                          ([], "'sweep_dir' is required"),
                          (["sweep_dir=/nonexistent/sweep"], "not a folder")):
        assert main(argv) == 2 and message in capsys.readouterr().err
