"""The study engine: the statistics by hand, the spec's checks, the analysis and decision rule on planted
effects, the report rewritten byte for byte from its records, and a user's own spec with a user's term run
end to end through `cipr-study` on the tiny model (integration)."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest
from support.tiny_models import save_tiny

from cipr.core.errors import ConfigError
from cipr.experiments.spec import Condition, StudySpec, load_options
from cipr.experiments.stats import (
    detectable,
    iqm,
    item_adjusted_sd,
    paired_t,
    probability_of_improvement,
    two_way_bootstrap,
)
from cipr.experiments.study_report import analyze, compare, condition_holds, recompute, write_report

SPEC = {"name": "planted", "arms": {"control": [], "good": [], "costly": []}, "control": "control",
        "contrasts": [["good", "costly"]], "seeds": [0, 1, 2, 3], "read_at": [10, 20],
        "measures": ["heldin_kl", "action_accuracy", "p_reference"], "trace_term": "rescore",
        "bootstrap": {"draws": 500, "seed": 0},
        "decision": {"step": 20, "arms": ["good", "costly"], "conditions": [
            {"measure": "heldin_kl", "stat": "relative", "op": "<=", "value": -0.3},
            {"measure": "heldin_kl", "stat": "high", "interval": "two_way", "op": "<", "value": 0},
            {"measure": "action_accuracy", "stat": "low", "interval": "two_way", "op": ">=", "value": -5}]}}
ITEMS = [f"i{k}" for k in range(40)]


def _records() -> list[dict]:
    """KL 0.2 with item and seed spread; `good` halves it at step 20 and keeps accuracy; `costly` halves it
    and loses every fifth item."""
    out = []
    for arm in ("control", "good", "costly"):
        for step in (10, 20):
            for seed in range(4):
                for k, item in enumerate(ITEMS):
                    kl = 0.2 + 0.002 * k + 0.01 * seed
                    if arm != "control" and step == 20:
                        kl *= 0.5
                    correct = 0.0 if (arm == "costly" and k % 5 == 0) or k % 7 == 3 else 1.0
                    out.append({"arm": arm, "seed": seed, "step": step, "item": item, "kl": kl,
                                "correct": correct, "p_ref": 0.8 * correct + 0.1})
    return out


def _traces() -> list[dict]:
    return [{"arm": arm, "seed": seed, "step": step, "trace/rescore/before": 0.3,
             "trace/rescore/after": 0.3 - (0.05 + 0.01 * seed if arm != "control" else 0.001 * (seed - 1.5))}
            for arm in ("control", "good", "costly") for seed in range(4) for step in range(20)]


def test_stats_by_hand():
    t = paired_t([1.0, 2.0, 3.0, 4.0])  # mean 2.5, sd 1.2910, t(0.975, 3) = 3.1824
    assert t["mean"] == 2.5 and t["low"] == pytest.approx(2.5 - 3.1824 * 1.2910 / 2, abs=1e-3)
    # at the detectable difference a two-sided paired t over 8 units has 80% power (noncentral t, by hand)
    from scipy import stats

    d = detectable(2.0, 8) / 2.0
    crit = stats.t.ppf(0.975, 7)
    power = stats.nct.sf(crit, 7, d * math.sqrt(8)) + stats.nct.cdf(-crit, 7, d * math.sqrt(8))
    assert power == pytest.approx(0.8, abs=1e-4) and 1.0 < d < 1.3
    assert math.isnan(detectable(2.0, 1)) and math.isnan(detectable(float("nan"), 8))
    assert iqm([1, 2, 3, 4, 100, -100, 5, 6]) == pytest.approx(3.5)  # the middle four: 2, 3, 4, 5
    assert probability_of_improvement([3, 4], [1, 3]) == pytest.approx((1 + 0.5 + 1 + 1) / 4)
    assert item_adjusted_sd(5.0, 3.0, 64, 128) == pytest.approx(math.sqrt(16 + 9 / 2))


def test_two_way_bootstrap_widens_with_item_noise():
    rng = np.random.default_rng(1)
    seeds_only = rng.normal(0, 1, (6, 1)) + np.zeros((6, 50))
    with_items = seeds_only + rng.normal(0, 3, (1, 50))
    a, b = two_way_bootstrap(seeds_only, draws=400), two_way_bootstrap(with_items, draws=400)
    assert b["high"] - b["low"] > 1.5 * (a["high"] - a["low"])
    assert a["low"] < seeds_only.mean() < a["high"]


def test_compare_by_hand_and_conditions():
    control = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    arm = control - np.array([[0.5], [1.0], [1.5]])  # per seed -0.5, -1, -1.5
    c = compare(arm, control, lower_is_better=True, draws=200, seed=0)
    assert c["mean"] == pytest.approx(-1.0) and c["n"] == 3
    assert c["relative"] == pytest.approx(-1.0 / 3.5) and c["p_improve"] > 0.5
    assert c["seeds_better"] == 3 and c["lo"] < -1.0 < c["hi"]
    assert condition_holds(Condition("heldin_kl", "relative", "<=", -0.25), c)
    assert not condition_holds(Condition("heldin_kl", "high", "<", -2.0, interval="t"), c)
    assert condition_holds(Condition("heldin_kl", "high", "<", 0.0), c)  # two-way: every resample below 0
    assert not condition_holds(Condition("heldin_kl", "mean", ">", 0.0), None)
    assert compare(arm[:1], control[:1], lower_is_better=True, draws=10, seed=0) is None  # one seed: none


def test_the_analysis_finds_the_planted_arm_and_refuses_the_costly_one():
    meta = {"spec": SPEC, "items": ITEMS, "timings": {}}
    report = analyze(_records(), _traces(), meta)
    assert report["measures"]["heldin_kl"]["good"]["20"][0] == pytest.approx(
        np.mean([(0.2 + 0.002 * k) * 0.5 for k in range(40)]))
    assert len(report["measures"]["action_accuracy"]["costly"]["10"]) == 4
    d = report["decision"]
    assert d["chosen"] == "good" and d["arms"]["good"]["conditions"] == [True, True, True]
    assert d["arms"]["costly"]["conditions"] == [True, True, False]  # -20 points: the bound fails
    acc = report["comparisons"]["action_accuracy"]["costly"]["20"]
    # every fifth item lost (8 of 40), one of which (k = 10) the control already gets wrong: -7/40
    assert acc["mean"] == pytest.approx(-100 * 7 / 40)
    assert report["contrasts"]["good-costly"]["action_accuracy"]["20"]["mean"] == pytest.approx(17.5)
    traces = report["traces"]
    assert traces["good"]["change_t"]["hi"] < 0 and traces["control"]["change_t"]["lo"] < 0 < \
        traces["control"]["change_t"]["hi"]
    assert traces["good"]["change_vs_control_t"]["mean"] == pytest.approx(-0.065)


def test_the_report_is_rewritten_byte_identical_and_is_strict_json(tmp_path):
    records = _records()
    records = [r for r in records if not (r["arm"] == "costly" and r["seed"] == 3)]  # a seed unfinished
    meta = {"spec": SPEC, "items": ITEMS, "timings": {"control_s0": {"train_s": 1.0, "eval_s": 2.0,
                                                                    "threads": 1, "commit": "abc"}},
            "wall_s": 3.0}
    write_report(records, _traces(), meta, tmp_path)
    names = ["planted.json", "planted.md", "planted.png", "planted_frontier.png", "planted_trace.png",
             "planted_records.jsonl.gz", "planted_trace.jsonl.gz"]
    before = {n: (tmp_path / n).read_bytes() for n in names}
    recompute(tmp_path, "planted")
    assert {n: (tmp_path / n).read_bytes() for n in names} == before
    data = json.loads(before["planted.json"], parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    assert data["seeds_finished"] == [0, 1, 2] and data["measures"]["heldin_kl"]["costly"]["20"][3] is None
    text = before["planted.md"].decode()
    assert text.index("Incomplete run") < text.index("Positive control") < text.index("Decision")
    assert "threads per point: 1" in text


def _spec(**changes) -> StudySpec:
    data = {"name": "x", "arms": {"a": [], "b": []}, "control": "a", "seeds": [0, 1], "read_at": [2]}
    return StudySpec(**{**data, **changes})


@pytest.mark.parametrize(("changes", "message"), [
    ({"control": "z"}, "study.control='z' must be one of"),
    ({"seeds": [0, 0]}, "distinct seeds"),
    ({"read_at": [4, 2]}, "ascending positive steps"),
    ({"measures": ["accuracy"]}, "choose from heldin_kl"),
    ({"contrasts": [["a", "a"]]}, "study.contrasts"),
    ({"threads": 0}, "study.threads=0"),
])
def test_a_bad_spec_is_one_clear_error(changes, message):
    with pytest.raises(ConfigError, match=message):
        _spec(**changes)


def test_a_decision_is_checked_against_the_design():
    from cipr.experiments.spec import DecisionSpec

    with pytest.raises(ConfigError, match="decision.step=3 is not in study.read_at"):
        _spec(decision=DecisionSpec(step=3))
    with pytest.raises(ConfigError, match=r"add \[\['b', 'c'\]\] to study.contrasts"):
        _spec(arms={"a": [], "b": [], "c": []},
              decision=DecisionSpec(conditions=[Condition("heldin_kl", "mean", "<", 0, against="c")],
                                    arms=["b"]))


def test_specs_load_from_the_package_and_from_a_users_folder(tmp_path):
    frontier = load_options(["study=cpu_frontier"]).study
    assert frontier.control == "control" and len(frontier.seeds) == 8 and frontier.read_at == [40]
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "mine.yaml").write_text(textwrap.dedent("""
        name: mine
        arms: {a: [], b: ["algo.terms.rescore.weight=1"]}
        control: a
        seeds: [3, 4]
        read_at: [2]
    """))
    opts = load_options(["study=mine", f"hydra.searchpath=[file://{tmp_path}]", "study.seeds=[5,6]",
                         "run_seeds=[5]", "train.model=tiny"])
    assert opts.study.seeds == [5, 6] and opts.run_seeds == [5] and opts.train == {"model": "tiny"}
    assert opts.out == "runs/study/mine"
    with pytest.raises(ConfigError, match="run_seeds"):
        load_options(["study=mine", f"hydra.searchpath=[file://{tmp_path}]", "run_seeds=[9]"])
    with pytest.raises(ConfigError, match="no study given"):
        load_options([])
    with pytest.raises(ConfigError, match="unknown study 'frontiers'"):
        load_options(["study=frontiers"])


USER_SPEC = """
name: mine
base: ["+sweep=cpu_dose", "algo=cipr_sft", "algo.terms.rescore.weight=0", "trainer.save_steps=1",
       "trainer.warm_start.steps=2", "logging.progress_bar=false"]
arms:
  control: []
  js: ["algo.terms.js.fn=my_terms:js_divergence", "algo.terms.js.weight=3"]
control: control
seeds: [0, 1]
read_at: [1, 2]
items: {n: 3, seed: 11}
pythonpath: [PY]
decision:
  conditions:
    - {measure: heldin_kl, stat: relative, op: "<=", value: -0.3}
    - {measure: action_accuracy, stat: low, op: ">=", value: -5}
"""


@pytest.mark.integration
def test_a_users_spec_with_a_users_term_runs_reports_and_recomputes(tmp_path, one_thread):
    from support.recipes import recipe_file

    from cipr.cli.study import main

    tiny = save_tiny(tmp_path / "tiny")
    py = tmp_path / "py"
    recipe_file("my_terms.py", py)  # docs/extending.md's Jensen-Shannon term, as written there
    (tmp_path / "cfg" / "study").mkdir(parents=True)
    (tmp_path / "cfg" / "study" / "mine.yaml").write_text(USER_SPEC.replace("PY", str(py)))
    out, report = tmp_path / "out", tmp_path / "report"
    args = ["study=mine", "--config-dir", str(tmp_path / "cfg"), f"out_dir={out}", f"report_dir={report}",
            "train.model=tiny", f"train.model.name_or_path={tiny}"]
    assert main(["run", *args, "run_seeds=[0]", "report=false"]) == 0 and not report.exists()
    assert sorted(p.name for p in (out / "records").iterdir()) == [
        "control_s0.json", "control_s0.jsonl", "control_s0.trace.jsonl",
        "js_s0.json", "js_s0.jsonl", "js_s0.trace.jsonl"]
    timing = json.loads((out / "records" / "js_s0.json").read_text())
    assert timing["threads"] == 1 and timing["reads"] == 6
    assert not list((out / "points" / "js_s0" / "supervised").glob("checkpoint-*"))  # dropped once read
    assert main(["run", *args]) == 0
    data = json.loads((report / "mine.json").read_text())
    assert data["arms"] == ["control", "js"] and data["seeds"] == [0, 1] and data["n_items"] == 3
    assert set(data["measures"]) == {"heldin_kl", "action_accuracy", "p_reference"}
    assert len(data["measures"]["heldin_kl"]["js"]["2"]) == 2
    assert set(data["comparisons"]["heldin_kl"]["js"]["2"]) >= {"mean", "lo", "hi", "two_way"}
    assert "chosen" in data["decision"] and data["wall_s"] > 0
    rows = [json.loads(line) for line in __import__("gzip").open(report / "mine_records.jsonl.gz", "rt")]
    assert len(rows) == 2 * 2 * 2 * 3
    assert {"arm", "seed", "step", "item", "kl", "correct", "p_ref"} <= set(rows[0])
    traces = [json.loads(line) for line in __import__("gzip").open(report / "mine_trace.jsonl.gz", "rt")]
    assert {"trace/js/before", "trace/js/after", "trace/rescore/before"} <= set(traces[-1])
    files = sorted(Path(report).iterdir())
    before = {p.name: p.read_bytes() for p in files}
    assert main(["report", "study=mine", "--config-dir", str(tmp_path / "cfg"), f"report_dir={report}"]) == 0
    assert {p.name: p.read_bytes() for p in sorted(Path(report).iterdir())} == before
