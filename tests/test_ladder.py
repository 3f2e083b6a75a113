"""The ladder: the sweep config, row labels and names, the report from evaluation folders (fast tier), and
end to end on the tiny model: a two-algorithm study from one shared warm start through cipr-study, its report
with the consistency metric, recomputed byte for byte (integration tier)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cipr.experiments.ladder import GRPO, MI, build_report, render_ladder

PERTS = ("original", "typos", "cost_tag_explicit")


def test_the_specs_label_the_rows_as_the_paper_and_evaluate_grpo_through_the_adapter_too():
    from cipr.experiments.spec import load_options

    ladder = load_options(["study=ladder"]).study
    assert list(ladder.arms) == ["grpo", "masking", "multi_interface", "cipr", "cipr_no_rescore",
                                 "cipr_no_rollout"]
    assert ladder.labels["grpo"] == {"method": GRPO, "names": "original,canonical"}
    assert ladder.labels["multi_interface"] == {"method": MI, "names": "canonical"}
    assert ladder.labels["masking"]["names"] == "original"
    assert ladder.arms["cipr_no_rollout"] == ["algo=cipr", "algo.terms.rollout.weight=null"]
    assert "names=[{names}]" in ladder.evaluations["ladder"] and ladder.read_at == []
    cpu = load_options(["study=cpu_ladder"]).study
    assert list(cpu.arms) == ["grpo", "multi_interface", "cipr"] and cpu.base == ["+sweep=ladder_cpu"]


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
    assert run_dir == "runs/ladder/smollm2-135m/cipr_rs0.1_roNone_s2"  # a term switched off (null)
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
    from cipr.eval.consistency_metric import read_records
    from cipr.eval.report import read_results

    def run(name, method, names, scores, kl):
        correct = {(i, p, "original"): bool(s) for i, row in scores.items()
                   for p, s in zip(PERTS, row, strict=True)}
        _write_eval(tmp_path / name, names, correct, {(i, p): kl for i in scores for p in PERTS[1:]})
        return (name, method, read_results(tmp_path / name / "results.jsonl")[0],
                read_records(tmp_path / name), json.loads((tmp_path / name / "run.json").read_text()))

    runs = [run("grpo_s0", GRPO, "original", {"a": (1, 1, 0), "b": (1, 0, 0)}, 0.5),
            run("mi_s0", MI, "canonical", {"a": (1, 1, 1), "b": (1, 0, 1)}, 0.2),
            run("mi_s1", MI, "canonical", {"a": (1, 1, 1), "b": (1, 1, 1)}, 0.4)]
    rep = build_report(runs, ["x"])
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
def test_the_ladder_study_trains_evaluates_reports_and_recomputes(tmp_path, one_thread):
    from support.tiny_models import save_tiny

    from cipr.cli.study import main

    tiny = save_tiny(tmp_path / "tiny")
    out, report = tmp_path / "out", tmp_path / "report"
    args = ["study=ladder", "study.arms={grpo:['algo=grpo'],cipr:['algo=cipr']}", f"out_dir={out}",
            f"report_dir={report}", "train.model=tiny", f"train.model.name_or_path={tiny}",
            "train.model.freeze_bottom_layers=0", "train.data.n=6",
            "train.data.tools_per_example=[1,1]", "train.data.eval_examples=2",
            "train.rollout.num_generations=2", "train.rollout.max_completion_length=16",
            "train.trainer=smoke",
            "train.trainer.max_steps=1", "train.trainer.save_steps=1",
            "train.trainer.per_device_train_batch_size=4", "train.trainer.warm_start.steps=2",
            "train.logging.progress_bar=false", "eval.limit=2", "eval.max_new_tokens=8", "eval.batch_size=4",
            f"eval.perturbations=[{','.join(PERTS)}]"]
    assert main(["run", *args]) == 0
    data = json.loads((report / "ladder.json").read_text())
    rows = data["comparison"]["rows"]
    assert set(rows) == {f"{GRPO} (original names)", f"{GRPO} (canonical names)",
                         "+ CIPR (canonical names)"}
    cipr_row = rows["+ CIPR (canonical names)"]
    assert {"original", "mean", "gap"} <= set(cipr_row["accuracy"])
    assert "mean" in cipr_row["consistency"]["kl"]
    assert "+ CIPR (canonical names)" in data["comparison"]["differences"]["grpo"]["rows"]
    assert (report / "ladder.png").stat().st_size > 0 and \
        "Held-out consistency: kl" in (report / "ladder_tables.md").read_text()
    orders = {json.loads(x)["order"] for x in (out / "evals" / "cipr_s0" / "ladder" / "results.jsonl")
              .read_text().splitlines()}
    assert orders == {"original", "costly_first"}  # both tool orders for the cost type under canonical names
    before = {p.name: p.read_bytes() for p in report.iterdir()}
    assert main(["report", "study=ladder", f"report_dir={report}"]) == 0
    assert {p.name: p.read_bytes() for p in report.iterdir()} == before


def test_the_committed_cpu_ladder_plot_recomputes_byte_identical(tmp_path):
    import shutil

    from cipr.cli.study import main

    for name in ("cpu_ladder.json", "cpu_ladder.png"):
        shutil.copy(f"docs/results/{name}", tmp_path / name)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert main(["report", "study=cpu_ladder", f"report_dir={tmp_path}"]) == 0
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
