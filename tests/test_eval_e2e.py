"""End to end on the real data: the tiny model under every perturbation type, the replay invariants on a
BFCL slice, RoTBench pairing, the Hydra entry point with a saved tiny model, and cipr-eval-compare."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from cipr.eval.benchmarks import build
from cipr.eval.config import BenchmarkConfig, BenchmarkReportConfig, EvalConfig
from cipr.eval.evaluate import evaluate
from cipr.eval.report import read_results

BFCL_MEAN = ["typos_distractors", "cost_latency_explicit", "cost_latency_implicit"]


def bfcl_cfg(tmp, **kw) -> EvalConfig:
    bench = BenchmarkConfig(report=BenchmarkReportConfig(mean_groups=BFCL_MEAN))
    return EvalConfig(benchmark=bench, out_dir=str(tmp), progress=False, **kw)


def test_tiny_model_on_bfcl_under_every_perturbation(tmp_path, shared_data, tiny_tokenizer):
    from support.tiny_models import tiny_model

    from cipr.perturb import list_perturbations

    # One item (its prompts run to ~1,500 tokens of the tiny tokenizer), a one-layer model: ~60 generations.
    cfg = bfcl_cfg(tmp_path, backend="hf", limit=1, partitions=["simple_python"],
                   perturbations=["original", "held_out", "in_distribution"], names=["original", "canonical"],
                   batch_size=16, max_new_tokens=4, chunk_size=64)
    items, perts, report = build(cfg)
    summary = evaluate(cfg, model=tiny_model(tiny_tokenizer, layers=1), tokenizer=tiny_tokenizer)
    recs, torn = read_results(tmp_path / "results.jsonl")
    assert torn == 0 and len(recs) == len(items) == summary["n_records"]
    every = {"original"} | {n for n, _, _ in list_perturbations()} - {"reorder"}  # one tool: nothing to move
    assert {r["perturbation"] for r in recs} == every
    assert {r["perturbation"] for r in recs if r["names"] == "original"} == every - {"in_distribution"}
    assert report.not_applicable and set(report.skipped) == {"reorder/original", "reorder/canonical"}
    orders = Counter((r["perturbation"], r["order"]) for r in recs if r["names"] == "canonical")
    assert orders[("cost_tag_explicit", "costly_first")] == 1 and orders[("typos", "costly_first")] == 0
    for r in recs:
        assert isinstance(r["raw"], str) and r["taxonomy"] and isinstance(r["correct"], bool)
    for names in ("original", "canonical"):
        e = summary["names"][names]
        assert set(e["groups"]) >= {"original", *BFCL_MEAN, "drift"}
        assert 0 <= e["mean"]["accuracy"]["value"] <= 100 and "gap" in e
    assert "in_distribution" in summary["names"]["canonical"]["groups"]
    assert (tmp_path / "plots" / "taxonomy.png").exists() and (tmp_path / "report.md").exists()


@pytest.mark.integration
def test_replay_invariants_on_bfcl_slice(tmp_path, shared_data):
    from cipr.eval.benchmarks import load_examples
    from cipr.scoring.bfcl import score_bfcl

    common = {"limit": 10, "names": ["original", "canonical"], "backend": "replay"}
    ref = evaluate(bfcl_cfg(tmp_path / "ref", **common))
    fam = evaluate(bfcl_cfg(tmp_path / "fam", replay="familiar", **common))
    accepted = {e.id for e in load_examples(bfcl_cfg(tmp_path, limit=10))
                if score_bfcl(e.reference, e).correct}
    assert len(accepted) >= 9
    recs, _ = read_results(tmp_path / "ref" / "results.jsonl")
    assert len({r["partition"] for r in recs}) == 10
    wrong = [(r["id"], r["names"], r["perturbation"], r["detail"]) for r in recs
             if r["id"] in accepted and not r["correct"]]
    assert not wrong
    frecs, _ = read_results(tmp_path / "fam" / "results.jsonl")
    cost = [r for r in frecs if r["group"].startswith("cost_latency")]
    assert cost and not any(r["correct"] for r in cost)
    assert Counter(r["taxonomy"] for r in cost if r["id"] in accepted) == {
        "equivalent_tool": sum(r["id"] in accepted for r in cost)}
    assert all(r["correct"] for r in frecs
               if r["id"] in accepted and r["perturbation"] in ("original", "typos"))
    for s in (ref, fam):
        assert s["names"]["original"]["types"]["original"]["accuracy"]["n"] == 10
    assert fam["names"]["canonical"]["types"]["cost_tag_explicit"]["orders"]["costly_first"]["value"] == 0.0

    from cipr.cli.eval import compare_main

    runs = [f"run_a={tmp_path / 'ref'}", f"run_b={tmp_path / 'fam'}"]
    assert compare_main([*runs, f"out={tmp_path / 'cmp'}"]) == 0
    cmp = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    d = cmp["names"]["canonical"]
    assert d["groups"]["cost_latency_explicit"]["value"] < -90 and d["types"]["original"]["value"] == 0.0
    assert (tmp_path / "cmp" / "compare.png").exists() and \
        "B − A" in (tmp_path / "cmp" / "compare.md").read_text()


def test_rotbench_levels_pair_original_and_canonical(tmp_path, shared_data):
    bench = BenchmarkConfig(name="rotbench", format="react", scorer="rotbench",
                            perturbations=["clean", "slight", "medium", "heavy", "union"],
                            names=["original", "canonical"], strict_parse=False,
                            report=BenchmarkReportConfig(original="clean", group_mode="pool"))
    cfg = EvalConfig(benchmark=bench, backend="replay", limit=6, out_dir=str(tmp_path), progress=False)
    s = evaluate(cfg)
    recs, _ = read_results(tmp_path / "results.jsonl")
    assert len(recs) == 5 * 6 * 2
    can = [r for r in recs if r["names"] == "canonical"]
    assert all(c["name"].startswith("function_") or c["name"] != "" for r in can for c in r["calls"])
    by_key = {(r["names"], r["perturbation"], r["id"]): r["correct"] for r in recs}
    assert all(by_key[("canonical", p, i)] == v for (n, p, i), v in by_key.items() if n == "original")
    assert s["names"]["original"]["groups"]["corrupted"]["accuracy"]["n"] == 24
    diff = s["canonical_minus_original"]["groups"]["corrupted"]
    assert diff["n"] == 24 and diff["unpaired"] == 0
    md = (tmp_path / "report.md").read_text()
    assert "Table 10 shape" in md and "corrupted (pooled)" in md


def test_hydra_entry_point_with_saved_tiny_model(tmp_path, shared_data, capsys):
    from hydra import compose, initialize_config_dir
    from support.tiny_models import save_tiny

    from cipr.cli.eval import CONFIG_DIR, run, to_eval_config

    model_dir = save_tiny(tmp_path / "tiny")
    overrides = [f"model={model_dir}", "limit=2", "partitions=[simple_python]",
                 "perturbations=[original,cost_tag_explicit]", "names=[original,canonical]",
                 "max_new_tokens=4", f"out_dir={tmp_path / 'run'}", "progress=false", "device=cpu"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="eval", overrides=overrides)
        bad = compose(config_name="eval", overrides=["+limt=3"])
    assert to_eval_config(cfg).benchmark.report.mean_groups == BFCL_MEAN
    with pytest.raises(Exception, match="limt"):
        to_eval_config(bad)
    summary = run(cfg)
    assert summary["n_records"] == 2 * (2 + 1 + 2)  # original x2 names, cost: 1 order original + 2 canonical
    again = run(cfg)
    assert again["run_stats"]["evaluated"] == 0 and again["run_stats"]["skipped"] == 10
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        other = compose(config_name="eval", overrides=[*overrides, "seed=1"])
    with pytest.raises(SystemExit) as stop:  # one line on stderr, exit status 2 (cipr.core.errors)
        run(other)
    assert stop.value.code == 2 and "another configuration" in capsys.readouterr().err
