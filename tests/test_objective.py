"""The consistency objective (`cipr.method.objective`): the relabel seed, the terms' math by hand and against
the earlier per-engine functions, the checks of a user's term, and a term from a file outside the package
training through `cipr-train`'s contract (supervised regime via the command line, GRPO in process)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from support.recipes import recipe
from support.reference_kl import rescoring_kl, rollout_kl

from cipr.core.config import ConfigError
from cipr.method.consistency import kl_rows, mean_kl, renormalized
from cipr.method.objective import (
    Objective,
    Pairs,
    TermConfig,
    rescore_pairs,
    resolve_terms,
    rollout_pairs,
    weighted_sum,
)
from cipr.method.pairing import rollout_index
from cipr.method.relabel import relabel_seed

BAD = '''
import torch


def returns_a_float(p_ref, p_other, segments):
    return 0.5


def no_gradient(p_ref, p_other, segments):
    return torch.tensor(0.0), {}


def two_arguments(p_ref, p_other):
    return p_other.sum(), {}


def text_metrics(p_ref, p_other, segments):
    return p_other.sum(), {"note": "fine"}


NOT_CALLABLE = 3
'''

BAD_GATES = '''


def a_float_mask(pairs):
    return pairs.p_ref.max(dim=-1).values


def out_of_range(pairs):
    import torch

    return torch.tensor([0, 7])


def short_mask(pairs):
    return pairs.segments[:1] >= 0


def nothing(pairs):
    return pairs.segments < 0
'''


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory) -> Path:
    """A folder outside the package with the user's own term file (`my_terms.py`): docs/extending.md's recipe
    as written, then functions that break the contract."""
    folder = tmp_path_factory.mktemp("user")
    (folder / "my_terms.py").write_text(recipe("my_terms.py") + textwrap.dedent(BAD))
    (folder / "my_gates.py").write_text(recipe("my_gates.py") + textwrap.dedent(BAD_GATES))
    (folder / "my_context_terms.py").write_text(recipe("my_context_terms.py"))
    return folder


@pytest.fixture
def on_path(user_dir, monkeypatch) -> Path:
    monkeypatch.syspath_prepend(str(user_dir))
    for name in ("my_terms", "my_gates", "my_context_terms"):
        sys.modules.pop(name, None)
    return user_dir


def T(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# -- the relabel seed ----------------------------------------------------------------------------------------
def test_relabel_seed_is_the_documented_hash_and_separates_every_argument():
    digest = hashlib.sha256(b"7\x1f3\x1fbfcl/simple_1\x1f2").digest()
    assert relabel_seed(7, 3, "bfcl/simple_1", 2) == int.from_bytes(digest[:8], "big") >> 1
    base = relabel_seed(0, 0, "x", 0)
    assert 0 <= base < 2 ** 63 and base == relabel_seed(0, 0, "x")
    assert len({base, relabel_seed(1, 0, "x"), relabel_seed(0, 1, "x"), relabel_seed(0, 0, "y"),
                relabel_seed(0, 0, "x", 1)}) == 5


# -- the math ------------------------------------------------------------------------------------------------
def test_mean_kl_by_hand_and_against_a_loop():
    p = T([[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]])
    q = T([[0.25, 0.75], [0.9, 0.1], [0.5, 0.5]])
    value, m = mean_kl(p, q, torch.tensor([0, 0, 1]), eps=0.0)
    kl0 = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    kl2 = 0.2 * math.log(0.2 / 0.5) + 0.8 * math.log(0.8 / 0.5)
    assert value.item() == pytest.approx(((kl0 + 0.0) / 2 + kl2) / 2, rel=1e-12)
    assert m["rows"] == 3 and m["segments"] == 2 and m["max"] == pytest.approx(kl2)
    torch.manual_seed(0)
    a = torch.softmax(torch.randn(9, 4, dtype=torch.float64), -1)
    b = torch.softmax(torch.randn(9, 4, dtype=torch.float64), -1)
    seg = torch.tensor([0, 0, 1, 2, 2, 2, 3, 4, 4])
    loop = torch.stack([kl_rows(a[seg == s], b[seg == s]).mean() for s in seg.unique()]).mean()
    assert mean_kl(a, b, seg)[0].item() == pytest.approx(loop.item(), rel=1e-12)
    with pytest.raises(ValueError, match=r"p_ref \[N, A\]"):
        mean_kl(a, b[:, :3], seg)
    empty, _ = mean_kl(a[:0], b[:0], seg[:0])
    assert empty.item() == 0.0


def test_the_rescoring_pairs_give_rescoring_kl_bit_for_bit():
    torch.manual_seed(1)
    p, q = torch.softmax(torch.randn(6, 5), -1), torch.softmax(torch.randn(6, 5), -1)
    seg = torch.tensor([0, 0, 1, 1, 1, 2])
    value, metrics = Objective.builtin(rescore=1.0)(q, rescore=rescore_pairs(p, q, seg))
    expected, _ = rescoring_kl(p.double() / p.double().sum(-1, keepdim=True),
                               q.double() / q.double().sum(-1, keepdim=True), seg)
    assert torch.equal(value, expected)
    assert metrics["consistency/rescore/kl"] == metrics["consistency/rescore/value"] == float(expected)
    assert metrics["consistency/rescore/decisions"] == 6 and metrics["consistency/rescore/responses"] == 3


def test_the_rollout_pairs_give_rollout_kl_bit_for_bit():
    """(The turn-aligned pairs: tests/test_train_multi_turn.py, by hand and against a loop.)"""
    torch.manual_seed(2)
    pair_ids = [0, 0, 0, 0, 1, 1, 1, 1]
    sides = ["canonical", "canonical", "perturbed", "perturbed"] * 2
    sequence = [0, 0, 1, 2, 3, 3, 4, 5, 6, 7, 7]
    probs = renormalized(torch.softmax(torch.randn(len(sequence), 4, dtype=torch.float64), -1))  # as read
    index, _ = rollout_index(pair_ids, sides, sequence, [0] * len(sequence))
    c, p = index.canonical, index.perturbed
    pairs = rollout_pairs(probs[c.decisions], c.units, c.unit_groups, probs[p.decisions], p.units,
                          p.unit_groups, index.group_pairs)
    value, _ = Objective.builtin(rollout=1.0)(probs, rollout=pairs)
    single, _ = rollout_kl(probs[c.decisions], c.units, probs[p.decisions], p.units,
                           canon_groups=c.unit_groups, pert_groups=p.unit_groups)
    assert torch.equal(value, single)


def test_weights_sum_zero_weights_are_logged_only_and_the_reference_is_detached():
    logits = torch.zeros(3, 3, dtype=torch.float64, requires_grad=True)
    p_ref = torch.softmax(logits, -1)
    p_other = T([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.5, 0.25, 0.25]]).requires_grad_(True)
    pairs = Pairs(p_ref, p_other, torch.tensor([0, 1, 1]))
    one, _ = Objective.builtin(rescore=1.0)(p_other, rescore=pairs)
    both, metrics = Objective.builtin(rescore=2.0, rollout=3.0)(p_other, rescore=pairs, rollout=pairs)
    assert both.item() == pytest.approx(5 * one.item(), rel=1e-12)
    zero, metrics = Objective.builtin(rescore=0.0)(p_other, rescore=pairs)
    assert zero.item() == 0.0 and metrics["consistency/rescore/kl"] == pytest.approx(one.item())
    one.backward()
    assert logits.grad is None and p_other.grad.abs().sum() > 0  # detached reference: no gradient through it
    free, _ = Objective.builtin(rescore=1.0, detach_reference=False)(p_other, rescore=pairs)
    free.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0


def test_weighted_sum_leaves_zero_weights_out_and_keeps_the_graph_when_empty():
    a = torch.tensor(2.0, requires_grad=True)
    b = torch.tensor(5.0, requires_grad=True)
    total = weighted_sum([(0.5, a), (0.0, b), (3.0, b)], a)
    assert total.item() == 16.0
    total.backward()
    assert a.grad.item() == 0.5 and b.grad.item() == 3.0
    none = weighted_sum([(0.0, a)], b)
    assert none.item() == 0.0 and none.requires_grad


# -- terms from the user's file: the checks ------------------------------------------------------------------
def test_a_users_term_resolves_and_computes_like_written(on_path):
    (term,) = resolve_terms({"js": TermConfig(0.5, "my_terms:js_divergence", options={"eps": 1e-9})})
    assert term.kind == "rescore" and term.weight == 0.5 and term.options == {"eps": 1e-9}
    p, q = T([[0.6, 0.4]]), T([[0.4, 0.6]])
    value, metrics = Objective([term])(q, rescore=Pairs(p, q, torch.tensor([0])))
    m = torch.tensor([0.5, 0.5], dtype=torch.float64)
    by_hand = 0.5 * float((p[0] * (p[0] / m).log()).sum() + (q[0] * (q[0] / m).log()).sum())
    assert value.item() == pytest.approx(0.5 * by_hand, rel=1e-6)
    assert metrics["consistency/js/js"] == pytest.approx(by_hand, rel=1e-6)
    assert "consistency/js/max" in metrics


@pytest.mark.parametrize("fn, message", [
    ("nowhere_cipr_test:js", r"algo.terms.js.fn='nowhere_cipr_test:js': cannot import module"),
    ("my_terms:absent", r"module 'my_terms' has no 'absent'"),
    ("my_terms", r"write it as module:function"),
    ("my_terms:NOT_CALLABLE", r"'NOT_CALLABLE' is not callable"),
    ("my_terms:two_arguments", r"must take \(p_ref, p_other, segments, \*\*options\)"),
    ("my_terms:returns_a_float", r"must return \(scalar tensor, dict of floats\)"),
    ("my_terms:no_gradient", r"carries no gradient"),
    ("my_terms:text_metrics", r"must be a dict of str to float"),
])
def test_a_bad_users_term_is_one_clear_error(on_path, fn, message):
    with pytest.raises(ConfigError, match=message):
        resolve_terms({"js": TermConfig(1.0, fn)})


def test_a_users_gate_chooses_the_rows_a_term_compares(on_path):
    """`algo.terms.NAME.pairs`: the term sees the rows the gate keeps (mask or indices), the targets filled
    with -1 where unknown; with none kept it adds 0 and is not called."""
    (gated,) = resolve_terms({"rescore": TermConfig(1.0, pairs="my_gates:correct")})
    (plain,) = resolve_terms({"rescore": TermConfig(1.0)})
    p = T([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4], [0.2, 0.5, 0.3]])
    q = T([[0.5, 0.3, 0.2], [0.3, 0.4, 0.3], [0.2, 0.2, 0.6], [0.6, 0.2, 0.2]]).requires_grad_(True)
    segments, targets = torch.tensor([0, 0, 1, 1]), torch.tensor([0, 0, -1, 1])  # row 1: canonical side wrong
    pairs = Pairs(p, q, segments, {}, targets)
    value, metrics = Objective([gated])(q, rescore=pairs)
    rows = torch.tensor([0, 2, 3])
    expected, _ = mean_kl(p[rows], q[rows], segments[rows])
    assert torch.equal(value, expected) and metrics["consistency/rescore/rows_kept"] == 3.0
    assert metrics["consistency/rescore/rows"] == 3.0
    assert Objective([plain])(q, rescore=pairs)[1]["consistency/rescore/rows"] == 4.0
    (confident,) = resolve_terms({"rescore": TermConfig(1.0, pairs="my_gates:confident")})
    value, metrics = Objective([confident])(q, rescore=Pairs(p, q, segments))  # targets unknown: filled
    assert metrics["consistency/rescore/rows_kept"] == 3.0  # row 2 is not confident
    nothing = Pairs(p * 0 + 1 / 3, q, segments)
    value, metrics = Objective([confident])(q, rescore=nothing)
    assert value.item() == 0.0 and value.requires_grad and metrics["consistency/rescore/rows_kept"] == 0.0
    with pytest.raises(ConfigError, match=r"algo.terms.rescore.pairs=my_gates:a_float_mask: the function "
                                          r"must take the term's Pairs and return the rows"):
        resolve_terms({"rescore": TermConfig(1.0, pairs="my_gates:a_float_mask")})
    with pytest.raises(ConfigError, match=r"row indices must be in \[0, 3\)"):
        resolve_terms({"rescore": TermConfig(1.0, pairs="my_gates:out_of_range")})
    with pytest.raises(ConfigError, match=r"one entry per row \(3\), got 1"):
        resolve_terms({"rescore": TermConfig(1.0, pairs="my_gates:short_mask")})
    with pytest.raises(ConfigError, match=r"algo.terms.rescore.pairs='nowhere_cipr_test:g': cannot import"):
        resolve_terms({"rescore": TermConfig(1.0, pairs="nowhere_cipr_test:g")})


def test_a_sweep_over_a_known_term_key_replaces_the_sweep_files_values():
    """cipr-train adds (++) only a term key the config lacks: a sweep over `algo.terms.rescore.weight` on the
    command line replaces sweep=consistency's values (2 x 1 x 2 jobs), as its header says, while a new term
    is added."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from cipr.cli.common import hydra_overrides
    from cipr.train.config import term_overrides

    argv = ["-m", "algo.terms.rescore.weight=0,0.1", "algo.terms.rollout.weight=0.1", "trainer.seed=0,1",
            "algo.terms.js.fn=my_terms:js_divergence"]
    out = term_overrides(argv, hydra_overrides(argv)[0])
    assert out == [*argv[:4], "++algo.terms.js.fn=my_terms:js_divergence"]
    sweep_file = ["algo.terms.rescore.weight=0.0,0.05,0.1,0.2", "algo.terms.rollout.weight=0.0,0.1",
                  "trainer.seed=0,1,2"]
    jobs = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides([*sweep_file, *out[1:]]),
                                        None)[0]
    assert len(jobs) == 4
    expected = {(f"algo.terms.rescore.weight={w}", "algo.terms.rollout.weight=0.1", f"trainer.seed={s}")
                for w in (0, 0.1) for s in (0, 1)}
    assert {tuple(j[:3]) for j in jobs} == expected


@pytest.mark.integration
def test_a_former_weight_key_is_refused_in_one_line_naming_the_terms_key(tmp_path):
    """`algo.rescore_weight` / `algo.rollout_weight` (once aliases of the terms' weights) are refused
    wherever they are given: on the command line (with +, ++ or as a sweep), in a YAML file, among a sweep
    file's points; one line naming `algo.terms.NAME.weight`, exit status 2. The term's own key passes."""
    argv = ["-m", "+sweep=consistency", "algo.rescore_weight=0.1", "trainer.seed=0"]
    bad = subprocess.run([sys.executable, "-m", "cipr.cli.train", *argv], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "algo.rescore_weight is now algo.terms.rescore.weight: set algo.terms.rescore.weight=0.1" in \
        bad.stderr
    from cipr.train.config import compose_train, config_from_dict, refuse_renamed, sweep_params

    with pytest.raises(ConfigError, match=r"^algo.rollout_weight is now algo.terms.rollout.weight: set "
                                          r"algo.terms.rollout.weight=0,0.1$"):
        refuse_renamed(["-m", "++algo.rollout_weight=0,0.1"])
    with pytest.raises(ConfigError, match=r"set algo.terms.rescore.weight=0.3$"):
        compose_train(["algo.rescore_weight=0.3"])  # as cipr-plan and the study engine compose
    with pytest.raises(ConfigError, match=r"^algo.rescore_weight is now .*: set algo.terms.rescore.weight=1"):
        config_from_dict({"algo": {"name": "distill", "rescore_weight": 1.0}})  # from a YAML file
    with pytest.raises(ConfigError, match=r"is now algo.terms.rollout.weight: remove algo.rollout_weight"):
        config_from_dict({"algo": {"name": "cipr", "rollout_weight": None}})
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "old.yaml").write_text(
        "# @package _global_\nhydra:\n  sweeper:\n    params:\n      algo.rescore_weight: 0,0.1\n")
    old = sweep_params([f"hydra.searchpath=[file://{tmp_path}]", "+sweep=old"])
    with pytest.raises(ConfigError, match=r"set algo.terms.rescore.weight=0,0.1$"):
        refuse_renamed(["-m", "+sweep=old"], old)
    refuse_renamed(["-m", "algo.terms.rescore.weight=0.1"], sweep_params(["+sweep=consistency"]))


def test_the_planner_composes_a_users_term_as_cipr_train_does(on_path):
    from cipr.train.config import compose_train

    cfg = compose_train(["algo.terms.js.fn=my_terms:js_divergence", "algo.terms.js.weight=0.5"])
    assert cfg.algo.terms["js"].fn == "my_terms:js_divergence" and cfg.algo.terms["js"].weight == 0.5
    assert cfg.algo.terms["rescore"].weight == 0.1


def test_term_config_errors_name_the_option():
    with pytest.raises(ConfigError, match=r"algo.terms.kl2: no built-in term is named 'kl2'"):
        resolve_terms({"kl2": TermConfig(1.0)})
    with pytest.raises(ConfigError, match=r"algo.terms.rescore.weight=-1.0 must be >= 0"):
        resolve_terms({"rescore": TermConfig(-1.0)})
    with pytest.raises(ConfigError, match=r"algo.terms.rollout: a rollout term needs pairs"):
        resolve_terms({"rollout": TermConfig(0.5)}, allowed=("rescore",))
    off = {"rollout": TermConfig(0.0), "rescore": TermConfig(None)}  # nothing to compute here, and off
    assert resolve_terms(off, allowed=("rescore",)) == []


# -- terms from the user's file: training through cipr-train's contract --------------------------------------
@pytest.fixture(scope="module")
def warm_dir(tmp_path_factory) -> Path:
    """The tiny model after 24 SFT steps in the compact format: it puts mass on opening a call."""
    from support.tiny_models import save_tiny

    from cipr.core.config import from_dict
    from cipr.train.run import TrainConfig, run

    base = save_tiny(tmp_path_factory.mktemp("tiny") / "model")
    cfg = from_dict(TrainConfig, {
        "model": {"name_or_path": str(base), "gguf_package": None, "gguf_file": None, "short_name": "tiny",
                  "call_format": "compact"},
        "data": {"source": "synthetic", "n": 14, "eval_examples": 2, "tools_per_example": [2, 3], "seed": 0,
                 "parallel_fraction": 0.0, "no_call_fraction": 0.0, "same_domain_distractors": 0.0},
        "algo": {"name": "sft"},
        "trainer": {"run_dir": str(tmp_path_factory.mktemp("sft") / "run"), "max_steps": 24, "save_steps": 24,
                    "per_device_train_batch_size": 2, "learning_rate": 1e-2, "seed": 0,
                    "gradient_checkpointing": False, "warm_start": {"steps": 0, "eval_examples": 0}},
        "logging": {"progress_bar": False}})
    return run(cfg) / "sft" / "final"


def _overrides(model: Path, run_dir: Path, regime: str) -> list[str]:
    common = [f"model.name_or_path={model}", "model=tiny", "model.call_format=compact", "data.n=14",
              "data.eval_examples=2", "data.tools_per_example=[2,3]", "data.parallel_fraction=0.0",
              "data.no_call_fraction=0.0", "trainer.max_steps=2", "trainer.save_steps=2",
              "trainer.learning_rate=1e-3", "trainer.warm_start.steps=0",
              "trainer.warm_start.eval_examples=0", "trainer.gradient_checkpointing=false",
              "logging.progress_bar=false", f"trainer.run_dir={run_dir}"]
    if regime == "supervised":
        return ["algo=cipr_sft", "algo.terms.rescore.weight=null", "trainer.per_device_train_batch_size=2",
                *common]
    return ["algo=cipr", "algo.terms.rescore.weight=null", "algo.terms.rollout.weight=null",
            "rollout.num_generations=2", "rollout.max_completion_length=64",
            "trainer.per_device_train_batch_size=4", *common]


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if r.get("kind") == "step"]


def _moved(a: Path, b: Path, stage: str) -> bool:
    x = load_file(str(a / stage / "final" / "model.safetensors"))
    y = load_file(str(b / stage / "final" / "model.safetensors"))
    return any(not torch.equal(x[k], y[k]) for k in x)


@pytest.mark.integration
def test_a_users_term_trains_the_supervised_regime_from_the_command_line(warm_dir, user_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(user_dir), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1"}
    term = ["algo.terms.js.fn=my_terms:js_divergence", "algo.terms.js.weight=2.0"]
    runs = {}
    for name, extra in (("with", term), ("without", [])):
        runs[name] = tmp_path / name
        proc = subprocess.run([sys.executable, "-m", "cipr.cli.train",
                               *_overrides(warm_dir, runs[name], "supervised"), *extra],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
    lines = _steps(runs["with"])
    assert len(lines) == 2 and all(r["consistency/js/js"] > 0 and "consistency/js/max" in r for r in lines)
    assert all(r["consistency/js/value"] == r["consistency/js/js"] for r in lines)
    assert not any(k.startswith("consistency/js") for r in _steps(runs["without"]) for k in r)
    assert _moved(runs["with"], runs["without"], "supervised")  # the term changed the update
    bad = subprocess.run([sys.executable, "-m", "cipr.cli.train", *_overrides(warm_dir, tmp_path / "bad",
                                                                              "supervised"),
                          "algo.terms.js.fn=my_terms:returns_a_float"], env=env, capture_output=True,
                         text=True, timeout=300)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "algo.terms.js.fn=my_terms:returns_a_float" in bad.stderr


@pytest.mark.integration
def test_a_users_term_trains_single_turn_grpo(warm_dir, on_path, tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from cipr.core.config import TRAIN_CONFIG_DIR
    from cipr.train.config import term_overrides
    from cipr.train.replay import replay_rollouts
    from cipr.train.run import config_from_dict, run

    runs = {}
    for name, extra in (("with", ["algo.terms.js.fn=my_terms:js_divergence", "algo.terms.js.weight=2.0"]),
                        ("without", [])):
        argv = term_overrides([*_overrides(warm_dir, tmp_path / name, "rl"), *extra])
        with initialize_config_dir(config_dir=str(TRAIN_CONFIG_DIR), version_base="1.3"):
            composed = OmegaConf.to_container(compose("train", overrides=argv), resolve=True)
        torch.manual_seed(0)
        runs[name] = run(config_from_dict(composed), rollout_source=replay_rollouts())
    lines = _steps(runs["with"])
    assert len(lines) == 2 and all(r["consistency/js/js"] > 0 for r in lines)
    assert all(r["consistency/rescore/decisions"] > 0 for r in lines)  # the rescoring pairs the term saw
    assert _moved(runs["with"], runs["without"], "grpo")


def _gated(overrides: list[str], weight: float) -> list[str]:
    """`overrides` with the built-in rescoring term on at `weight` (the user-term runs turn it off)."""
    return [o for o in overrides if not o.startswith("algo.terms.rescore.weight=")] + \
        [f"algo.terms.rescore.weight={weight}"]


def _user_env(user_dir: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(user_dir), os.environ.get("PYTHONPATH", "")]),
            "HF_HUB_OFFLINE": "1"}


@pytest.mark.integration
def test_a_users_gate_trains_the_supervised_regime_from_the_command_line(warm_dir, user_dir, tmp_path):
    """docs/extending.md's `my_gates.py` as written, through `cipr-train`: the rescoring term compares only
    the decisions the canonical side gets right, and a gate that returns no rows is one line, exit 2."""
    runs = {}
    for name, extra in (("gated", ["algo.terms.rescore.pairs=my_gates:correct"]), ("all", [])):
        runs[name] = tmp_path / name
        proc = subprocess.run([sys.executable, "-m", "cipr.cli.train",
                               *_gated(_overrides(warm_dir, runs[name], "supervised"), 2.0), *extra],
                              env=_user_env(user_dir), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
    gated, everything = _steps(runs["gated"]), _steps(runs["all"])
    assert len(gated) == 2 and all("consistency/rescore/rows_kept" not in r for r in everything)
    for r in gated:  # the term saw the kept rows only, of all the pairs' decisions
        assert r["consistency/rescore/rows"] == r["consistency/rescore/rows_kept"]
        assert r["consistency/rescore/rows_kept"] <= r["consistency/rescore/decisions"]
    assert any(r["consistency/rescore/rows_kept"] < r["consistency/rescore/decisions"] for r in gated)
    assert _moved(runs["gated"], runs["all"], "supervised")  # the gate changed the update
    bad = subprocess.run([sys.executable, "-m", "cipr.cli.train",
                          *_gated(_overrides(warm_dir, tmp_path / "bad", "supervised"), 1.0),
                          "algo.terms.rescore.pairs=my_gates:a_float_mask"], env=_user_env(user_dir),
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "algo.terms.rescore.pairs=my_gates:a_float_mask" in bad.stderr


def _train_in_process(overrides: list[str], rollouts: bool) -> Path:
    """`cipr-train overrides` in this process (composed as its command line is), rollouts replayed."""
    from cipr.train.config import compose_train
    from cipr.train.replay import replay_rollouts
    from cipr.train.run import run

    torch.manual_seed(0)
    return run(compose_train(overrides), rollout_source=replay_rollouts() if rollouts else None)


@pytest.mark.integration
def test_a_users_gate_trains_single_turn_grpo(warm_dir, on_path, tmp_path):
    """`my_gates:confident` on GRPO's rescoring term (the warm model is confident at every decision of these
    rollouts, so it keeps them all and trains); a gate that keeps no row trains as the term at weight 0."""
    runs = {name: _train_in_process(_gated(_overrides(warm_dir, tmp_path / name, "rl"), weight) + extra,
                                    rollouts=True)
            for name, weight, extra in (("confident", 2.0, ["algo.terms.rescore.pairs=my_gates:confident"]),
                                        ("nothing", 2.0, ["algo.terms.rescore.pairs=my_gates:nothing"]),
                                        ("off", 0.0, []))}
    lines = _steps(runs["confident"])
    assert len(lines) == 2
    for r in lines:
        assert 0 < r["consistency/rescore/rows_kept"] <= r["consistency/rescore/decisions"]
        assert r["consistency/rescore/rows"] == r["consistency/rescore/rows_kept"]
    assert _moved(runs["confident"], runs["off"], "grpo")  # the kept rows trained
    assert all(r["consistency/rescore/rows_kept"] == 0 == r["consistency/rescore/value"]
               for r in _steps(runs["nothing"]))
    assert not _moved(runs["nothing"], runs["off"], "grpo")  # no row kept: nothing added to the update


@pytest.mark.integration
def test_the_context_recipes_train_with_the_step_and_the_reference_actions(warm_dir, on_path, tmp_path):
    """docs/extending.md's `my_context_terms.py` as written, in the supervised regime: the schedule gets each
    step and the stage's steps (warm-up over the whole run: 1/2, then 1), the correctness gate the reference
    actions (the share it keeps is the share `my_gates:correct` keeps of the same pairs)."""
    overrides = _gated(_overrides(warm_dir, tmp_path / "context", "supervised"), 0.0) + [
        "algo.terms.rescore.pairs=my_gates:correct",
        "algo.terms.ramp.fn=my_context_terms:ramped_kl", "algo.terms.ramp.weight=1",
        "algo.terms.ramp.options.warmup=1.0",
        "algo.terms.gate.fn=my_context_terms:gated_kl", "algo.terms.gate.weight=1"]
    lines = _steps(_train_in_process(overrides, rollouts=False))
    assert [r["consistency/ramp/scale"] for r in lines] == [0.5, 1.0]
    for r in lines:
        ramp = r["consistency/ramp/scale"] * r["consistency/ramp/kl"]
        assert r["consistency/ramp/value"] == pytest.approx(ramp)
        kept = r["consistency/gate/kept"] * r["consistency/rescore/decisions"]
        assert kept == pytest.approx(r["consistency/rescore/rows_kept"])


def _recording_term(log: list):
    def term(p_ref, p_other, segments, *, step, max_steps, targets, scale=1.0):
        log.append((step, max_steps, targets.tolist()))
        value, _ = mean_kl(p_ref, p_other, segments)
        return value * scale, {"seen": float(len(targets))}
    return term


def test_a_term_receives_the_context_it_declares_and_only_that():
    import sys
    import types

    from cipr.method.objective import Objective, TermConfig, rescore_pairs, resolve_terms

    seen: list = []
    module = types.ModuleType("context_terms")
    module.term = _recording_term(seen)
    module.plain = lambda p_ref, p_other, segments: mean_kl(p_ref, p_other, segments)
    sys.modules["context_terms"] = module
    try:
        terms = resolve_terms({"ctx": TermConfig(weight=1.0, fn="context_terms:term", options={"scale": 2.0}),
                               "plain": TermConfig(weight=0.0, fn="context_terms:plain")})
    finally:
        del sys.modules["context_terms"]
    assert [t.context for t in terms] == [("step", "max_steps", "targets"), ()]
    assert seen == [(0, 10, [0, 1, -1])]  # the probe call: a small example with every context value
    p = torch.tensor([[0.7, 0.3], [0.4, 0.6]], dtype=torch.float64)
    q = torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64, requires_grad=True)
    pairs = rescore_pairs(p, q, torch.tensor([0, 1]), targets=torch.tensor([1, -1]))
    value, metrics = Objective(terms)(q, rescore=pairs, step=7, max_steps=40)
    assert seen[-1] == (7, 40, [1, -1]) and metrics["consistency/ctx/seen"] == 2.0
    assert float(value) == pytest.approx(2.0 * float(mean_kl(p, q, torch.tensor([0, 1]))[0]))
    Objective(terms)(q, rescore=rescore_pairs(p, q, torch.tensor([0, 1])), step=1, max_steps=2)
    assert seen[-1] == (1, 2, [-1, -1])  # no reference actions known: -1 everywhere
    with pytest.raises(ValueError, match="targets"):
        rescore_pairs(p, q, torch.tensor([0, 1]), targets=torch.tensor([1]))
