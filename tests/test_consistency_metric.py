"""The held-out consistency metric: the math against hand-computed values, the action index sets built from
correspondences, the aggregation, and the item-level wiring on the tiny model (cipr-eval, report, compare)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from cipr.eval.benchmarks import build
from cipr.eval.config import BenchmarkConfig, BenchmarkReportConfig, EvalConfig
from cipr.eval.consistency_metric import (
    CONSISTENCY,
    ConsistencyConfig,
    ConsistencyPair,
    build_pairs,
    make_pair,
    measure,
    pair_consistency,
    run_consistency,
    summarize_consistency,
)
from cipr.eval.report import ReportConfig

MEAN = ["typos_distractors", "cost_latency_explicit"]


def test_pair_consistency_matches_hand_computed_values():
    # pair 0: two decisions over classes {0, 1, added 2, ∅}; pair 1: one decision, no added tool
    p_ref = torch.tensor([[0.5, 0.3, 0.0, 0.2], [0.1, 0.1, 0.0, 0.8], [0.6, 0.0, 0.0, 0.4]])
    p_pert = torch.tensor([[0.2, 0.3, 0.3, 0.2], [0.1, 0.1, 0.1, 0.7], [0.3, 0.0, 0.0, 0.7]])
    segments = torch.tensor([0, 0, 1])
    added = torch.tensor([[False, False, True, False]] * 2 + [[False] * 4])
    kl, m = pair_consistency(p_ref, p_pert, segments, added, 2, eps=0.0)
    kl0 = (0.5 * math.log(0.5 / 0.2) + 0 + 0 + 0.8 * math.log(0.8 / 0.7)) / 2
    kl1 = 0.6 * math.log(0.6 / 0.3) + 0.4 * math.log(0.4 / 0.7)
    assert kl.shape == (2,) and kl.tolist() == pytest.approx([kl0, kl1])
    assert m["argmax_agree"].tolist() == pytest.approx([0.5, 0.0])  # 0 vs 1 (tie -> first), ∅ vs ∅; 0 vs ∅
    assert m["added_mass"][0].item() == pytest.approx(0.2) and math.isnan(m["added_mass"][1].item())
    assert m["none_ref"].tolist() == pytest.approx([0.5, 0.4]) and \
        m["none_pert"].tolist() == pytest.approx([0.45, 0.7])
    assert m["decisions"].tolist() == [2, 1]


def test_pair_consistency_identical_sides_and_shape_errors():
    p = torch.softmax(torch.randn(5, 4), -1)
    kl, m = pair_consistency(p, p.clone(), torch.tensor([0, 0, 1, 2, 2]),
                             torch.zeros(5, 4, dtype=torch.bool), 4)
    assert kl[:3].abs().max() < 1e-9 and m["argmax_agree"][:3].tolist() == [1.0] * 3
    assert math.isnan(kl[3].item()) and m["decisions"][3].item() == 0  # a pair without decisions
    with pytest.raises(ValueError):
        pair_consistency(p, p[:, :3], torch.zeros(5, dtype=torch.long),
                         torch.zeros(5, 4, dtype=torch.bool), 1)
    with pytest.raises(ValueError):
        pair_consistency(p, p, torch.tensor([0, 0, 1, 2, 5]), torch.zeros(5, 4, dtype=torch.bool), 3)


def _synthetic(tmp_path, **kw) -> EvalConfig:
    bench = BenchmarkConfig(name="synthetic", format="hermes", n=4,
                            report=BenchmarkReportConfig(mean_groups=MEAN))
    defaults = {"perturbations": ["original", "typos", "distractor_similar_name", "same_name_description",
                                  "cost_tag_explicit"],
                "names": ["original", "canonical"], "out_dir": str(tmp_path), "progress": False,
                "backend": "hf", "max_new_tokens": 2, "batch_size": 8,
                "consistency": ConsistencyConfig(enabled=True, batch_size=4)}
    return EvalConfig(benchmark=bench, **{**defaults, **kw})


def _items(cfg: EvalConfig):
    from cipr.eval.benchmarks import load_examples

    items, _, _ = build(cfg)
    return items, load_examples(cfg)


def test_pairs_map_equivalents_to_one_class_and_added_tools_to_their_own(tmp_path):
    cfg = _synthetic(tmp_path, limit=2)
    items, examples = _items(cfg)
    by = {(it.id, it.names, it.perturbation, it.order): it for it in items}
    ex = next(e for e in examples if e.reference)
    n = len(ex.interface)
    typos = make_pair(ex, by[(ex.id, "original", "typos", "original")], cfg.seed)
    assert typos.ref_classes == tuple(range(n)) and typos.pert_classes == tuple(range(n)) and not typos.added
    cost = make_pair(ex, by[(ex.id, "canonical", "cost_tag_explicit", "costly_first")], cfg.seed)
    assert cost.num_actions == n + 1 and cost.added == (n,) and \
        sorted(cost.pert_classes) == list(range(n + 1))
    assert cost.reference.interface.names[0].startswith("function_")
    # the costlier equivalent carries the familiar name under original names and is an added class
    orig_cost = make_pair(ex, by[(ex.id, "original", "cost_tag_explicit", "original")], cfg.seed)
    called = ex.reference[0].name
    costly = orig_cost.perturbed.interface.names.index(called)
    assert orig_cost.pert_classes[costly] == n
    # a same-name duplicate: one class with its equivalent under original names, its own under canonical ids
    dup_o = make_pair(ex, by[(ex.id, "original", "same_name_description", "original")], cfg.seed)
    dup_c = make_pair(ex, by[(ex.id, "canonical", "same_name_description", "original")], cfg.seed)
    assert not dup_o.added and dup_o.num_actions == n
    assert dup_c.added == (n,) and dup_c.num_actions == n + 1
    pairs, skipped = build_pairs(examples, items, cfg.seed)
    assert not skipped and len(pairs) == sum(it.perturbation != "original" for it in items)


def test_identical_sides_read_zero_kl_on_the_tiny_model(tmp_path, tiny_model, tiny_tokenizer):
    from cipr.formats import get_format

    cfg = _synthetic(tmp_path, limit=2)
    items, examples = _items(cfg)
    ex = next(e for e in examples if e.reference)
    it = next(i for i in items if i.id == ex.id and i.names == "original" and i.perturbation == "typos")
    n = len(ex.interface)
    same = ConsistencyPair(it, ex, ex, tuple(range(n)), tuple(range(n)), (), n)
    rec = measure(tiny_model, tiny_tokenizer, get_format("hermes"), [same], ConsistencyConfig())[0]
    assert rec["kl"] == pytest.approx(0.0, abs=1e-6) and rec["argmax_agree"] == 1.0
    assert rec["decisions"] == len(ex.reference) + 1 and rec["added_mass"] is None


def test_run_consistency_writes_every_pair_once_and_resumes(tmp_path, tiny_model, tiny_tokenizer):
    from cipr.formats import get_format

    cfg = _synthetic(tmp_path, limit=3)
    items, examples = _items(cfg)
    fmt = get_format("hermes")
    counts = run_consistency(items, examples, tiny_model, tiny_tokenizer, fmt, tmp_path,
                             cfg.consistency, cfg.seed)
    lines = [json.loads(x) for x in (tmp_path / CONSISTENCY).read_text().splitlines()]
    expected = sum(it.perturbation != "original" for it in items)
    assert counts["read"] == len(lines) == expected
    for r in lines:
        assert r["kl"] >= -1e-9 and 0 <= r["argmax_agree"] <= 1 and r["decisions"] >= 1
        assert (r["added_mass"] is None) == (r["n_added"] == 0)
    again = run_consistency(items, examples, tiny_model, tiny_tokenizer, fmt, tmp_path,
                            cfg.consistency, cfg.seed)
    assert again == {"read": 0, "skipped": 0, "already_done": expected}
    assert len((tmp_path / CONSISTENCY).read_text().splitlines()) == expected


def _rec(item, names, pert, group, order, kl, agree, mass=None):
    return {"id": item, "partition": "p", "names": names, "perturbation": pert, "group": group,
            "order": order, "kl": kl, "argmax_agree": agree, "added_mass": mass, "decisions": 2,
            "n_added": int(mass is not None)}


def test_summary_averages_orders_then_types_then_groups():
    recs = [_rec("a", "canonical", "typos", "typos_distractors", "original", 0.2, 1.0),
            _rec("b", "canonical", "typos", "typos_distractors", "original", 0.4, 0.5),
            _rec("a", "canonical", "cost_tag_explicit", "cost_latency_explicit", "original", 1.0, 0.0, 0.6),
            _rec("a", "canonical", "cost_tag_explicit", "cost_latency_explicit", "costly_first",
                 3.0, 1.0, 0.2),
            _rec("b", "canonical", "cost_tag_explicit", "cost_latency_explicit", "original", 0.0, 1.0, 0.0),
            {**_rec("c", "canonical", "typos", "typos_distractors", "original", 0, 0), "skipped": "X: why"}]
    s = summarize_consistency(recs, ReportConfig(mean_groups=tuple(MEAN)))
    e = s["names"]["canonical"]
    assert s["n_measured"] == 5 and s["skipped"] == {"X": 1}
    assert e["types"]["typos"]["kl"]["value"] == pytest.approx(0.3)
    # a: mean of orders
    assert e["types"]["cost_tag_explicit"]["kl"]["value"] == pytest.approx((2.0 + 0.0) / 2)
    assert e["types"]["cost_tag_explicit"]["added_mass"]["value"] == pytest.approx(100 * (0.4 + 0.0) / 2)
    assert "added_mass" not in e["types"]["typos"]
    assert e["mean"]["kl"]["value"] == pytest.approx(((0.2 + 2.0) / 2 + (0.4 + 0.0) / 2) / 2)
    assert e["mean"]["argmax_agree"]["n"] == 2 and e["mean"]["argmax_agree"]["half_width"] is not None


@pytest.mark.integration
def test_cipr_eval_with_consistency_reports_and_compares(tmp_path, tiny_tokenizer):
    from support.tiny_models import tiny_model

    from cipr.eval.compare import render_comparison, write_comparison
    from cipr.eval.evaluate import evaluate

    runs = {}
    for seed in (0, 1):
        cfg = _synthetic(tmp_path / f"m{seed}", limit=2,
                         perturbations=["original", "typos", "cost_tag_explicit"])
        runs[seed] = evaluate(cfg, model=tiny_model(tiny_tokenizer, layers=1, seed=seed),
                              tokenizer=tiny_tokenizer)
    cons = runs[0]["consistency"]
    assert set(cons["names"]) == {"original", "canonical"}
    can = cons["names"]["canonical"]
    assert set(can["groups"]) == {"typos_distractors", "cost_latency_explicit"} and "kl" in can["mean"]
    assert "Held-out consistency" in (tmp_path / "m0" / "report.md").read_text()
    cmp = write_comparison(tmp_path / "m0", tmp_path / "m1", tmp_path / "cmp")
    kl = cmp["consistency"]["canonical"]["kl"]
    assert kl["mean"]["n"] == 2 and set(kl["groups"]) == {"typos_distractors", "cost_latency_explicit"}
    assert "Held-out consistency, B − A" in render_comparison(cmp)
    off = evaluate(_synthetic(tmp_path / "off", limit=1, perturbations=["original", "typos"],
                              consistency=ConsistencyConfig()), model=tiny_model(tiny_tokenizer, layers=1),
                   tokenizer=tiny_tokenizer)
    assert "consistency" not in off and not (tmp_path / "off" / CONSISTENCY).exists()


def test_the_reader_runs_on_sdpa_and_the_model_returns_to_eager(tiny_tokenizer):
    from support.tiny_models import tiny_model

    from cipr.eval.evaluate import reader_attention

    model = tiny_model(tiny_tokenizer)
    model.set_attn_implementation("eager")
    with reader_attention(model):
        assert model.config._attn_implementation == "sdpa"
    assert model.config._attn_implementation == "eager"
    model.set_attn_implementation("sdpa")
    with reader_attention(model):  # anything but eager is left as it is
        assert model.config._attn_implementation == "sdpa"


def test_action_accuracy_of_each_side_by_hand():
    # pair 0: decisions target class 0 then ∅ (column 3); pair 1: one decision targeting class 1
    p_ref = torch.tensor([[0.5, 0.3, 0.0, 0.2], [0.1, 0.1, 0.0, 0.8], [0.6, 0.3, 0.0, 0.1]])
    p_pert = torch.tensor([[0.2, 0.3, 0.3, 0.2], [0.1, 0.1, 0.1, 0.7], [0.1, 0.8, 0.0, 0.1]])
    segments = torch.tensor([0, 0, 1])
    added = torch.tensor([[False, False, True, False]] * 2 + [[False] * 4])
    targets = torch.tensor([0, 3, 1])
    _, m = pair_consistency(p_ref, p_pert, segments, added, 2, target_ref=targets, target_pert=targets)
    assert m["action_acc_ref"].tolist() == pytest.approx([1.0, 0.0])  # 0 = 0, ∅ = ∅; 0 ≠ 1
    assert m["action_acc_pert"].tolist() == pytest.approx([0.5, 1.0])  # 1 ≠ 0, ∅ = ∅; 1 = 1
    assert m["correct_ref"].tolist() == [1.0, 0.0]  # every scored choice right / the one choice wrong
    assert m["p_target_ref"].tolist() == pytest.approx([(0.5 + 0.8) / 2, 0.3])  # the reference's mass
    unscored = torch.tensor([0, -1, -1])  # the end-of-turn ∅ and a whole pair left out
    _, m = pair_consistency(p_ref, p_pert, segments, added, 2, target_ref=unscored, target_pert=unscored)
    assert m["action_acc_ref"][0].item() == 1.0 and m["action_acc_pert"][0].item() == 0.0
    assert math.isnan(m["action_acc_ref"][1].item())
    assert m["correct_ref"][0].item() == 1.0 and m["p_target_ref"][0].item() == pytest.approx(0.5)
    assert math.isnan(m["correct_ref"][1].item()) and math.isnan(m["p_target_ref"][1].item())
    with pytest.raises(ValueError, match="targets must be"):
        pair_consistency(p_ref, p_pert, segments, added, 2, target_ref=targets[:2])


def test_relabel_types_rename_after_the_adapter_and_pair_tool_by_tool(tmp_path, tiny_model, tiny_tokenizer):
    from cipr.formats import get_format

    cfg = _synthetic(tmp_path, limit=3, perturbations=["original", "relabel_function", "relabel_random"])
    items, examples = _items(cfg)
    by_id = {e.id: e for e in examples}
    for it in (i for i in items if i.perturbation.startswith("relabel_")):
        source = by_id[it.id]
        names = it.shown.interface.names
        assert len(set(names)) == len(names) == len(source.interface)
        if it.perturbation == "relabel_function":
            assert all(n.startswith("function_") for n in names)
        else:
            assert all(n.startswith("fn_") and len(n) == 9 for n in names)
        assert it.name_map is None  # scored in the names the model sees: the adapter would undo a renaming
        expected = [t.description for t in source.interface]
        assert [t.description for t in it.shown.interface] == expected
        pair = make_pair(source, it, cfg.seed)
        assert pair.pert_classes == pair.ref_classes == tuple(range(len(names))) and pair.added == ()
        for call, ref in zip(it.shown.reference, source.reference, strict=True):  # the same tool, renamed
            assert names.index(call.name) == source.interface.names.index(ref.name)
    canonical = [i for i in items if i.perturbation == "relabel_function" and i.names == "canonical"]
    recs = measure(tiny_model, tiny_tokenizer, get_format("hermes"),
                   [make_pair(by_id[i.id], i, cfg.seed) for i in canonical], ConsistencyConfig())
    assert all(0 <= r["action_acc_ref"] <= 1 and 0 <= r["action_acc_pert"] <= 1 and r["kl"] >= -1e-9
               for r in recs)


def test_generate_false_reads_consistency_only(tmp_path, tiny_tokenizer):
    from support.tiny_models import tiny_model

    from cipr.core.errors import ConfigError
    from cipr.eval.evaluate import evaluate

    cfg = _synthetic(tmp_path / "c", limit=2, perturbations=["relabel_function", "typos"], generate=False)
    summary = evaluate(cfg, model=tiny_model(tiny_tokenizer, layers=1), tokenizer=tiny_tokenizer)
    assert not (tmp_path / "c" / "results.jsonl").exists() and (tmp_path / "c" / CONSISTENCY).is_file()
    can = summary["consistency"]["names"]["canonical"]["types"]
    assert set(can) == {"relabel_function", "typos"} and "action_acc_ref" in can["typos"]
    assert "Held-out consistency" in (tmp_path / "c" / "report.md").read_text()
    with pytest.raises(ConfigError, match="consistency.enabled=true"):
        _synthetic(tmp_path / "d", generate=False, consistency=ConsistencyConfig())
