"""The dose study (Stage A): the decision rule by hand, the analysis on planted effects, the calibration
items, the training traces on the tiny model (λ = 0 still trains exactly like multi-interface), and the
command end to end (integration)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from safetensors.torch import load_file
from support.tiny_models import save_tiny

from cipr.experiments.dose_analysis import analyze, compare, decide, key, recompute, render, write_report
from cipr.train.config import compose_train

META = {"design": {"lambdas": [0.0, 1.0, 3.0], "steps": [10, 20], "seeds": [0, 1, 2, 3],
                   "heldin": "relabel_function", "items": ["a", "b", "c"]}}


def _records(effect: dict[tuple[float, int], float], acc_cost: float = 0.0) -> list[dict]:
    """KL 0.2 + item and seed spread at λ = 0; λ's effect added at each step; accuracy 1 or 1 - cost."""
    out = []
    for lam in (0.0, 1.0, 3.0):
        for step in (10, 20):
            for seed in range(4):
                for i, item in enumerate("abc"):
                    kl = (0.2 + 0.01 * i + 0.003 * seed + effect.get((lam, step), 0.0)
                          + 0.001 * (seed % 2) * lam)
                    out.append({"lambda": lam, "step": step, "seed": seed, "id": item, "kl": kl,
                                "action_acc_ref": 1.0 - (acc_cost if lam == 3.0 else 0.0),
                                "action_acc_pert": 1.0})
    return out


def test_compare_and_decide_by_hand():
    kl = {key(0.0): {"10": [0.2, 0.2, 0.2]}, key(1.0): {"10": [0.13, 0.12, 0.14]}}
    acc = {key(0.0): {"10": [90.0, 90.0, 90.0]}, key(1.0): {"10": [89.0, 88.0, 90.0]}}
    c = compare(kl, acc, 1.0, 10)
    assert c["kl_difference"]["mean"] == pytest.approx(-0.07)
    assert c["relative_reduction"] == pytest.approx(0.35)
    assert c["accuracy_difference"]["mean"] == pytest.approx(-1.0) and c["qualifies"] and c["seeds"] == 3
    weak = compare({**kl, key(1.0): {"10": [0.15, 0.14, 0.16]}}, acc, 1.0, 10)  # 25%: too small
    assert weak["relative_reduction"] == pytest.approx(0.25) and not weak["qualifies"]
    costly = compare(kl, {**acc, key(1.0): {"10": [87.0, 88.0, 87.0]}}, 1.0, 10)  # -2.33 points
    assert not costly["qualifies"]
    noisy = compare({**kl, key(1.0): {"10": [0.02, 0.35, 0.05]}}, acc, 1.0, 10)  # interval reaches 0
    assert noisy["kl_difference"]["high"] > 0 and not noisy["qualifies"]
    comparisons = {key(1.0): {"10": {"qualifies": False}, "20": {"qualifies": True}},
                   key(3.0): {"10": {"qualifies": True}, "20": {"qualifies": True}}}
    assert decide(comparisons, [0.0, 1.0, 3.0], [10, 20]) == {"lambda": 1.0, "step": 20}  # smallest λ first
    assert decide({key(1.0): {"10": None, "20": {"qualifies": False}}}, [0.0, 1.0], [10, 20]) is None


def test_the_analysis_finds_a_planted_dose_and_refuses_a_costly_one():
    planted = {(1.0, 20): -0.03, (3.0, 10): -0.09, (3.0, 20): -0.12}
    report = analyze(_records(planted), [], META)
    assert report["decision"]["dose"] == {"lambda": 3.0, "step": 10}  # λ = 1's 14% at step 20 is too small
    expected = [0.2 + 0.01 - 0.09 + 0.003 * s + 0.003 * (s % 2) for s in range(4)]  # mean over 3 items
    assert report["heldin_kl"][key(3.0)]["10"] == pytest.approx(expected)
    assert report["n_items"] == 3 and report["seeds"] == [0, 1, 2, 3] and report["steps"] == [10, 20]
    costly = analyze(_records(planted, acc_cost=1 / 3), [], META)  # λ = 3 loses 33 points
    assert costly["decision"]["dose"] is None
    assert "Decision: no dose qualifies" in render(costly)
    assert "Decision: the dose is λ = 3 at step 10" in render(report)
    assert "Stage B (the transfer comparison at the dose) does not run" in render(costly)


def test_traces_are_summarized_per_lambda_and_the_report_recomputes_byte_identical(tmp_path):
    traces = [{"point": f"lambda{lam:g}_s{s}", "lambda": lam, "seed": s, "step": st,
               "before": 0.5 - 0.01 * st,
               "after": 0.5 - 0.01 * st - 0.02 * lam, "loss": 1.0}
              for lam in (0.0, 1.0, 3.0) for s in range(4) for st in range(1, 21)]
    report = write_report(_records({(3.0, 20): -0.1}), traces, {**META, "wall_s": 12.0}, tmp_path)
    t = report["traces"]
    assert t[key(3.0)]["change"] == pytest.approx([-0.06] * 4)
    assert t[key(0.0)]["change"] == pytest.approx([0.0] * 4)
    assert t[key(1.0)]["by_step"]["1"] == pytest.approx(0.49)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert {"cpu_dose.json", "cpu_dose.md", "cpu_dose.png", "cpu_dose_trace.png",
            "cpu_dose_records.jsonl.gz", "cpu_dose_trace.jsonl.gz"} <= set(files)
    recompute(tmp_path)
    for name in ("cpu_dose.json", "cpu_dose.md", "cpu_dose_records.jsonl.gz", "cpu_dose_trace.jsonl.gz"):
        assert (tmp_path / name).read_bytes() == files[name], name
    data = json.loads(files["cpu_dose.json"])
    assert set(data["heldin_kl"]) == {"0", "1", "3"} and len(data["accuracy"]["3"]["20"]) == 4
    assert data["decision"]["dose"] == {"lambda": 3.0, "step": 20} and "rule" in data["decision"]
    text = files["cpu_dose.md"].decode()
    assert "It held (interval below 0) at λ = 1, 3." in text
    assert "Decision: the dose is λ = 3 at step 20" in text
    assert "no change from the task loss alone is resolved" in text
    assert data["traces"]["3"]["change_vs_control_t"]["mean"] == pytest.approx(-0.06)


def test_the_result_paragraph_puts_a_failed_positive_control_first():
    """λ = 1's update raises the term on its own pairs (after > before): its control fails, and the paragraph
    says so before the decision; λ = 0's change is resolved from 0 (the task loss moves the term)."""
    traces = [{"lambda": lam, "seed": s, "step": st, "before": 0.4,
               "after": 0.4 + {0.0: -0.01, 1.0: 0.01, 3.0: -0.05}[lam] + 0.001 * s, "loss": 1.0}
              for lam in (0.0, 1.0, 3.0) for s in range(4) for st in range(1, 11)]
    text = render(analyze(_records({}), traces, META))
    control = text.index("Positive control")
    assert control < text.index("Decision: no dose qualifies")
    assert ("It held (interval below 0) at λ = 3; not at λ = 1, where, as pre-registered, the held-in result "
            "is not read as a dose-response.") in text
    assert "the task loss alone moves the term on its pairs" in text


def test_a_report_over_finished_seeds_only_says_so_and_stays_finite(recwarn):
    """Seeds 1 and 3 not run (a cut-short run): the comparisons rest on seeds 0 and 2, the paragraph opens
    with what is missing and marks the decision provisional, and no mean is taken over nothing."""
    planted = {(3.0, 10): -0.09, (3.0, 20): -0.12}
    records = [r for r in _records(planted) if r["seed"] in (0, 2)]
    traces = [{"lambda": lam, "seed": s, "step": st, "before": 0.4, "after": 0.38 - 0.01 * s, "loss": 1.0}
              for lam in (0.0, 1.0, 3.0) for s in (0, 2) for st in range(1, 11)]
    report = analyze(records, traces, META)
    assert report["seeds"] == [0, 2] and report["seeds_planned"] == [0, 1, 2, 3]
    assert len(report["heldin_kl"]["3"]["10"]) == 2
    assert "NaN" not in json.dumps({k: report[k] for k in ("heldin_kl", "accuracy")})
    assert report["comparisons"]["3"]["10"]["seeds"] == 2
    assert report["traces"]["3"]["change_t"]["n"] == 2
    assert report["traces"]["3"]["change_t"]["mean"] == pytest.approx(-0.03)
    text = render(report)
    opening = text.index("Incomplete run: 2 of the 4 pre-registered seeds finished")
    assert opening < text.index("Positive control")
    assert "(seeds 0, 2 of 0, 1, 2, 3)" in text and "(1 degrees of freedom)" in text
    assert "Decision (provisional):" in text and "nan" not in text.split("## Held-in KL")[0]
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def _point(study: str, arm: str, seed: int, out) -> tuple:
    from cipr.experiments.spec import load_options
    from cipr.experiments.study import Point, point_overrides

    options = load_options([f"study={study}", f"out_dir={out}"])
    return options, compose_train(point_overrides(options, Point(arm, seed)))


@pytest.mark.integration
def test_the_spec_trains_the_pre_registered_points_and_draws_the_committed_items(tmp_path):
    from cipr.experiments.items import draw_items

    options, cfg = _point("cpu_dose", "lambda3", 2, tmp_path)
    assert cfg.algo.name == "cipr" and cfg.algo.regime == "supervised"
    assert cfg.algo.terms["rescore"].weight == 3
    assert cfg.trainer.seed == cfg.perturb.seed == 2 and cfg.trainer.max_steps == 40
    assert cfg.trainer.save_steps == 10 and cfg.trainer.save_total_limit is None and cfg.logging.trace
    assert cfg.trainer.per_device_train_batch_size == 2 and cfg.algo.action_weight == 1.0
    assert cfg.trainer.warm_start.shared_dir == str(tmp_path / "warm_start")
    committed = json.loads(open("docs/results/cpu_dose.json").read())["meta"]["design"]["items"]
    assert [e.id for e in draw_items(options.study, cfg.data)["near"]] == committed


@pytest.mark.integration
def test_traces_show_each_step_before_and_after_and_lambda_zero_still_trains_like_multi_interface(tmp_path):
    """The trace reads change no weight: CIPR at λ = 0 with traces gives multi-interface's weights bit for
    bit; the logged before-value is the step's own term, and the after-value differs once weights moved."""
    from cipr.train.run import run

    tiny = save_tiny(tmp_path / "tiny")
    common = ["+sweep=cpu_dose", "model=tiny", f"model.name_or_path={tiny}", "trainer.max_steps=3",
              "trainer.save_steps=3", "trainer.warm_start.steps=0", "data.n=16",
              "logging.progress_bar=false", "trainer.learning_rate=1e-2",
              f"trainer.warm_start.shared_dir={tmp_path / 'warm_start'}"]  # never the study's own folder
    mi = run(compose_train([*common, "algo=multi_interface", f"trainer.run_dir={tmp_path / 'mi'}",
                            "logging.trace=false"]))
    runs = {lam: run(compose_train([*common, "algo=cipr_sft", f"algo.terms.rescore.weight={lam}",
                                    f"trainer.run_dir={tmp_path / str(lam)}"])) for lam in (0.0, 10.0)}
    a = load_file(str(mi / "supervised" / "final" / "model.safetensors"))
    b = load_file(str(runs[0.0] / "supervised" / "final" / "model.safetensors"))
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)
    for lam, run_dir in runs.items():
        lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in lines if r.get("kind") == "step"]
        assert len(steps) == 3, lam
        for r in steps:
            assert r["trace/rescore/before"] == pytest.approx(r["consistency/rescore/value"], rel=1e-12)
            after = r["trace/rescore/after"]
            assert math.isfinite(after) and after != r["trace/rescore/before"]


@pytest.mark.integration
def test_the_spec_trains_reads_traces_reports_and_recomputes(tmp_path, one_thread):
    """The dose study as the study engine runs it (a quick version on the tiny model), reported by its
    pre-registered analysis and recomputed byte for byte."""
    from cipr.cli.study import main

    tiny = save_tiny(tmp_path / "tiny")
    out, report = tmp_path / "out", tmp_path / "report"
    args = ["study=cpu_dose", "study.seeds=[0,1]", "study.read_at=[1,2]", "study.items.n=3",
            "study.items.seed=11", "study.arms={lambda0:['algo.terms.rescore.weight=0'],"
            "lambda3:['algo.terms.rescore.weight=3']}",
            "study.labels={lambda0:{lambda:0.0},lambda3:{lambda:3.0}}",
            f"out_dir={out}", f"report_dir={report}",
            "train.model=tiny", f"train.model.name_or_path={tiny}", "train.trainer.save_steps=1",
            "train.trainer.warm_start.steps=2", "train.logging.progress_bar=false"]
    assert main(["run", *args, "run_seeds=[0]", "report=false"]) == 0 and not report.exists()
    assert sorted(p.name for p in (out / "records").iterdir()) == [
        "lambda0_s0.json", "lambda0_s0.jsonl", "lambda0_s0.trace.jsonl",
        "lambda3_s0.json", "lambda3_s0.jsonl", "lambda3_s0.trace.jsonl"]
    assert not list((out / "points" / "lambda3_s0" / "supervised").glob("checkpoint-*"))  # dropped once read
    assert main(["run", *args]) == 0
    data = json.loads((report / "cpu_dose.json").read_text())
    assert data["seeds"] == [0, 1] and data["n_items"] == 3 and data["steps"] == [1, 2]
    assert data["lambdas"] == [0.0, 3.0]
    assert len(data["heldin_kl"]["3"]["2"]) == 2 and "dose" in data["decision"]
    traces = data["traces"]["3"]
    assert len(traces["change"]) == 2 and set(traces["by_step"]) == {"1", "2"}
    before = (report / "cpu_dose.json").read_bytes()
    assert main(["report", "study=cpu_dose", f"report_dir={report}"]) == 0
    assert (report / "cpu_dose.json").read_bytes() == before
