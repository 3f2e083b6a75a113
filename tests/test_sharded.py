"""The `distributed` tier: every strategy (DDP, FSDP2, ZeRO-2, ZeRO-3) on two CPU processes (gloo), every
algorithm, against one process on the same global batch.

One `accelerate launch` per strategy runs every algorithm in turn (tests/sharded_worker.py); FSDP2 and ZeRO go
through the test-only shim that finishes what accelerate 1.15 skips on CPU (tests/support/cpu_sharding.py), so
the code that runs is accelerate's, TRL's, transformers' and DeepSpeed's own. GRPO rollouts are replayed per
prompt (a random tiny model writes no call; one process and two then draw the same completions). The optimizer
is SGD with momentum (state to checkpoint and restore): Adam turns a float32 rounding difference in a
near-zero gradient component into a step of up to the learning rate, which would hide the agreement this tier
checks.

Tolerance (float32): after two optimizer steps every trained weight agrees with the one-process run to
`WEIGHT_TOL` absolute, and each step's loss to `LOSS_RTOL` relative; the measured worst differences are
printed (`-s`) and recorded in the closing note of the change that added this tier.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file
from support.launch import accelerate_launch, free_port

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[1]
STRATEGIES = ("ddp", "fsdp", "zero2", "zero3")
WEIGHT_TOL = 1e-5
LOSS_RTOL = 1e-4
G = 4  # completions per prompt
LR = 0.05

# algorithm -> (algo config, global batch per step, replayed rollouts, stage whose final/ holds the result)
ALGOS: dict[str, tuple[dict[str, Any], int, bool, str]] = {
    "sft": ({"name": "sft"}, 4, False, "sft"),
    "grpo": ({"name": "grpo"}, 4 * G, True, "grpo"),
    "multi_interface": ({"name": "multi_interface"}, 4 * G, True, "grpo"),
    "masking": ({"name": "masking"}, 4 * G, True, "grpo"),
    # + a warm start
    "cipr": ({"name": "cipr", "terms": {"rescore": {"weight": 0.5}, "rollout": {"weight": 0.5}}},
             4 * G, True, "grpo"),
    "cipr_supervised": ({"name": "cipr", "regime": "supervised", "action_weight": 1.0,
                         "terms": {"rescore": {"weight": 1.0}, "rollout": {"weight": 0.0}}},
                        8, False, "supervised"),
    "distill": ({"name": "distill", "eval": {"namings": ["canonical"]}}, 4, False, "distill"),
}


def _config(tiny: Path, run_dir: Path, algo: str, strategy: str, processes: int) -> dict[str, Any]:
    algo_cfg, global_batch, _, _ = ALGOS[algo]
    distributed = yaml.safe_load((ROOT / "configs/train/distributed" / f"{strategy}.yaml").read_text())
    data = {"source": "synthetic", "n": 24, "seed": 0, "eval_examples": 0, "tools_per_example": [2, 2]}
    rollout = {"backend": "hf", "num_generations": G, "max_completion_length": 128}
    if algo == "distill":  # ToyShop trajectories from the data root, teacher = the start model; no rollouts
        data, rollout = {"n": 10, "eval_examples": 2, "max_observation_chars": 60, "max_turns": 2}, {}
    return {
        "model": {"name_or_path": str(tiny), "gguf_package": None, "gguf_file": None, "short_name": "tiny",
                  "dtype": "float32", "call_format": "compact" if algo != "distill" else "hermes"},
        "data": data,
        "algo": algo_cfg,
        "rollout": rollout,
        "trainer": {"run_dir": str(run_dir), "max_steps": 2, "save_steps": 1, "optim": "sgd",
                    "optim_args": "momentum=0.9", "learning_rate": LR,
                    "per_device_train_batch_size":
                        global_batch // processes // (2 if algo == "cipr_supervised" else 1),
                    "torch_threads": 1, "max_grad_norm": 1e6},
        "distributed": distributed,
        "logging": {"progress_bar": False},
    }


def _launch(out: Path, strategy: str, processes: int, tiny: Path) -> Path:
    runs = [{"name": algo, "replay": ALGOS[algo][2],
             "config": _config(tiny, out / algo, algo, strategy if processes > 1 else "none", processes)}
            for algo in ALGOS]
    # CIPR after a warm start in the same process: two Trainers, the stage hand-over under sharding
    for run in runs:
        if run["name"] == "cipr":
            run["config"]["trainer"]["warm_start"] = {"steps": 2, "learning_rate": LR,
                                                      "per_device_train_batch_size": 4 // processes,
                                                      "eval_examples": 2}
            # the held-out probes run (rank 0), skipped under sharding
            run["config"]["data"]["eval_examples"] = 2
    plan = out / "plan.json"
    plan.write_text(json.dumps({"shim": processes > 1, "runs": runs}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    worker = [str(ROOT / "tests/sharded_worker.py"), str(plan)]
    if processes == 1:
        cmd = [sys.executable, *worker]
    else:
        cmd = accelerate_launch(*worker, processes=processes)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return out


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """The start of every run: the tiny model after 12 SFT steps (one process), so that it writes tool calls
    and the consistency terms have something to compare (a random tiny model puts no mass on a call)."""
    from support.tiny_models import save_tiny

    from cipr.train.run import config_from_dict, run

    out = tmp_path_factory.mktemp("sharded")
    cfg = _config(save_tiny(out / "random"), out / "warm", "sft", "none", 1)
    cfg["trainer"].update(max_steps=12, optim="adamw_torch", learning_rate=0.03, save_steps=12)
    run(config_from_dict(cfg))
    return out / "warm" / "sft" / "final"


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, tiny) -> Path:
    return _launch(tmp_path_factory.mktemp("one"), "none", 1, tiny)


@pytest.fixture(scope="module", params=STRATEGIES)
def two_processes(request, tmp_path_factory, tiny) -> tuple[str, Path]:
    return request.param, _launch(tmp_path_factory.mktemp(request.param), request.param, 2, tiny)


def _weights(run_dir: Path, stage: str) -> dict[str, torch.Tensor]:
    """The saved weights; a full FSDP state dict also writes the tied output head, which must equal the
    embedding."""
    weights = load_file(str(run_dir / stage / "final" / "model.safetensors"))
    head = weights.pop("lm_head.weight", None)
    if head is not None:
        assert torch.equal(head, weights["model.embed_tokens.weight"]), \
            "the tied head was saved apart from the embedding"
    return weights


def _steps(run_dir: Path, stage: str) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r.get("stage") == stage and r.get("kind") == "step"]


@pytest.mark.parametrize("algo", list(ALGOS))
def test_two_processes_train_like_one(two_processes, one_process, tiny, algo):
    strategy, out = two_processes
    stage = ALGOS[algo][3]
    for rank in (0, 1):
        built = json.loads((out / algo / f"ran_rank{rank}.json").read_text())
        assert built and all(b == {"strategy": strategy, "processes": 2} for b in built), built
    start = _weights(tiny.parent.parent, "sft")
    a, b = _weights(one_process / algo, stage), _weights(out / algo, stage)
    assert a.keys() == b.keys()
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    moved = max((a[k] - start[k]).abs().max().item() for k in a if k in start)
    print(f"{strategy} {algo}: max |w_2proc - w_1proc| = {worst:.2e} (weights moved up to {moved:.2e})")
    assert moved > 100 * WEIGHT_TOL  # the steps trained: agreement is not that of two unchanged models
    assert worst <= WEIGHT_TOL, (strategy, algo, worst)
    one, two = _steps(one_process / algo, stage), _steps(out / algo, stage)
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2]
    keys = {"cipr": ("consistency/rescore/kl", "consistency/rollout/kl"),
            "cipr_supervised": ("consistency/rescore/kl",)}.get(algo, ())
    # the terms ran (on the tiny model they are small: it puts almost all its mass on answering without a
    # call; their gradient path is checked with a real signal by the reader test below)
    assert all(r[k] > 0 for r in one for k in keys), one
    for x, y in zip(one, two, strict=True):
        assert y["loss"] == pytest.approx(x["loss"], rel=LOSS_RTOL, abs=1e-7), (x, y)
        for key in keys:
                assert y[key] == pytest.approx(x[key], rel=LOSS_RTOL, abs=1e-7), (key, x, y)


@pytest.fixture(scope="module")
def reader_one(tmp_path_factory, tiny) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("reader")
    _run_plan(out, {"reader": {"model": str(tiny), "strategy": "none", "out": str(out)}}, 1)
    return torch.load(out / "reader_none_rank0.pt")


def _run_plan(out: Path, plan: dict[str, Any], processes: int) -> None:
    (out / "plan.json").write_text(json.dumps({"shim": processes > 1, **plan}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    worker = [str(ROOT / "tests/sharded_worker.py"), str(out / "plan.json")]
    cmd = [sys.executable, *worker] if processes == 1 else accelerate_launch(*worker, processes=processes)
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.mark.parametrize("strategy", ["fsdp", "zero3"])
def test_action_reader_reads_gathered_weights_and_its_gradients_reach_the_shards(tmp_path, tiny,
                                                                                 reader_one, strategy):
    """The reader through the root forward of an FSDP2 / ZeRO-3 model on two processes: the same action
    distributions as one process, and the full gradient of -Σ log p(reference) on every parameter (gathered
    from the shards: DTensor.full_tensor, deepspeed's safe_get_full_grad) equal to one process's."""
    _run_plan(tmp_path, {"reader": {"model": str(tiny), "strategy": strategy, "out": str(tmp_path)}}, 2)
    expect = {"fsdp": "FSDPQwen2ForCausalLM", "zero3": "DeepSpeedEngine"}[strategy]
    for rank in (0, 1):
        got = torch.load(tmp_path / f"reader_{strategy}_rank{rank}.pt")
        assert got["wrapped"] == expect
        torch.testing.assert_close(got["probs"], reader_one["probs"], rtol=1e-5, atol=1e-7)
        assert got["grads"].keys() == reader_one["grads"].keys()
        worst = max((got["grads"][k] - reader_one["grads"][k]).abs().max().item() for k in got["grads"])
        scale = max(v.abs().max().item() for v in reader_one["grads"].values())
        print(f"{strategy} rank {rank}: reader gradient max |2proc - 1proc| = {worst:.2e} (largest "
              f"{scale:.2e})")
        assert scale > 1e-3 and worst <= 1e-5 * scale, (worst, scale)


@pytest.mark.parametrize("two_processes", ["fsdp", "zero3"], indirect=True)
def test_a_killed_job_resumes_to_the_uninterrupted_weights(tmp_path, tiny, two_processes):
    """Supervised CIPR (the reader, the paired sampler's state, the optimizer) under the two strategies that
    shard the weights: SIGKILL on every rank right after the step-1 save, the same launch again, and the final
    weights equal the uninterrupted run's. Not repeated for DDP, whose checkpoint is the Trainer's plain one
    (its resume is checked in one process by tests/test_train_pipeline.py), nor for ZeRO-2, which saves and
    loads through the same DeepSpeed engine calls as ZeRO-3: each case is two launches, and CI has a time
    budget."""
    strategy, uninterrupted = two_processes
    algo = "cipr_supervised"
    run = {"name": algo, "config": _config(tiny, tmp_path / algo, algo, strategy, 2)}
    plan = tmp_path / "plan.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    cmd = accelerate_launch(str(ROOT / "tests/sharded_worker.py"), str(plan))
    plan.write_text(json.dumps({"shim": True, "runs": [{**run, "die_after_step": 1}]}))
    killed = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode != 0 and "SIGKILL" in killed.stdout + killed.stderr, killed.stderr[-3000:]
    stage_dir = tmp_path / algo / ALGOS[algo][3]
    assert json.loads((stage_dir / "latest.json").read_text())["step"] == 1 and \
        not (stage_dir / "final").exists()
    plan.write_text(json.dumps({"shim": True, "runs": [run]}))
    cmd[cmd.index("--main_process_port") + 1] = str(free_port())
    resumed = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-6000:]
    assert "resuming supervised from" in resumed.stdout + resumed.stderr
    a, b = _weights(uninterrupted / algo, "supervised"), _weights(tmp_path / algo, "supervised")
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"{strategy}: resumed vs uninterrupted max |dw| = {worst:.2e}")
    assert worst <= WEIGHT_TOL


MULTI_TURN_STRATEGIES = ("ddp", "zero3")


def _multi_turn_run(tiny: Path, run_dir: Path, strategy: str, processes: int) -> dict[str, Any]:
    """CIPR on ToyShop episodes (rollout.mode=multi_turn), turns replayed from the expert: 2 pairs x G=2 a
    step, split over the processes."""
    config = _config(tiny, run_dir, "cipr", strategy, processes)
    config["model"]["call_format"] = "hermes"
    config["rollout"] = {"backend": "hf", "num_generations": 2, "max_completion_length": 1024,
                         "mode": "multi_turn", "episode_tasks": 4}
    config["env"] = {"name": "toyshop", "n_tasks": 40, "max_turns": 6}
    config["trainer"]["per_device_train_batch_size"] = 8 // processes
    config["trainer"]["learning_rate"] = 20 * LR  # most groups score alike: small advantages, small steps
    return {"name": "multi_turn", "episodes": True, "config": config}


@pytest.fixture(scope="module")
def multi_turn_one(tmp_path_factory, tiny) -> Path:
    out = tmp_path_factory.mktemp("multi_turn_one")
    _run_plan(out, {"runs": [_multi_turn_run(tiny, out / "multi_turn", "none", 1)]}, 1)
    return out / "multi_turn"


@pytest.mark.parametrize("strategy", MULTI_TURN_STRATEGIES)
def test_multi_turn_two_processes_train_like_one(tmp_path, tiny, multi_turn_one, strategy):
    """Multi-turn CIPR (episodes in lock step across the processes, both consistency terms over the turns)
    under DDP and ZeRO-3 on two processes: the weights and each step's loss and terms of one process."""
    _run_plan(tmp_path, {"runs": [_multi_turn_run(tiny, tmp_path / "multi_turn", strategy, 2)]}, 2)
    for rank in (0, 1):
        built = json.loads((tmp_path / "multi_turn" / f"ran_rank{rank}.json").read_text())
        assert built and all(b == {"strategy": strategy, "processes": 2} for b in built), built
    start = _weights(tiny.parent.parent, "sft")
    a, b = _weights(multi_turn_one, "grpo"), _weights(tmp_path / "multi_turn", "grpo")
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    moved = max((a[k] - start[k]).abs().max().item() for k in a if k in start)
    print(f"{strategy} multi-turn: max |w_2proc - w_1proc| = {worst:.2e} (weights moved up to {moved:.2e})")
    assert moved > 100 * WEIGHT_TOL and worst <= WEIGHT_TOL, (strategy, worst, moved)
    one, two = _steps(multi_turn_one, "grpo"), _steps(tmp_path / "multi_turn", "grpo")
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2]
    assert all(r["turns_per_episode"] >= 2 for r in one)
    for x, y in zip(one, two, strict=True):
        for key in ("loss", "consistency/rescore/kl", "consistency/rollout/kl", "turns_per_episode"):
            assert y[key] == pytest.approx(x[key], rel=LOSS_RTOL, abs=1e-7), (key, x, y)


def _cli(tiny: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["-m", "cipr.cli.train", "model=tiny", f"model.name_or_path={tiny}", "algo=sft", "trainer=smoke",
            "data.n=16", "trainer.per_device_train_batch_size=2", "trainer.learning_rate=0.01",
            f"trainer.run_dir={run_dir}", "logging.progress_bar=false", *extra]


@pytest.mark.parametrize("strategy", ["fsdp", "zero2", "zero3"])
def test_from_the_command_line_a_strategy_runs_as_asked_or_stops(tmp_path, tiny, strategy):
    """No shim: `cipr-train distributed=<strategy> launcher.num_processes=2` on CPU. DeepSpeed ZeRO runs as
    asked (the Trainer's accelerator builds it on CPU processes); FSDP, which accelerate 1.15 builds only for
    GPU process types, stops before any step with one line naming what was asked and what accelerate built
    (not a DDP run under an FSDP label). DDP from the command line is the one-node run of the two-nodes test
    below."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    cmd = [sys.executable, *_cli(tiny, tmp_path / "run", f"distributed={strategy}",
                                 "launcher.num_processes=2", f"launcher.main_process_port={free_port()}")]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if strategy == "fsdp":
        assert proc.returncode != 0
        line = "configuration error: asked for distributed=fsdp on 2 processes, but accelerate built ddp"
        assert line in proc.stderr, proc.stderr[-4000:]
        assert not list((tmp_path / "run").glob("*/checkpoint-*"))
    else:
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert f"distributed={strategy}: accelerate built {strategy} over 2 processes" in \
            proc.stdout + proc.stderr
        assert (tmp_path / "run" / "sft" / "stage.json").is_file()


def test_two_nodes_on_loopback_train_like_two_processes_on_one(tmp_path, tiny):
    """The launch slurm/train_multinode.sbatch builds (one `accelerate launch` per node, machine_rank 0 and 1,
    one rendezvous address), as two "nodes" of one process each on 127.0.0.1, against `cipr-train
    distributed=ddp launcher.num_processes=2` on one node (DDP from the command line, as asked): the same
    weights."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    one = subprocess.run([sys.executable, *_cli(tiny, tmp_path / "one_node", "distributed=ddp",
                                                "launcher.num_processes=2",
                                                f"launcher.main_process_port={free_port()}")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert one.returncode == 0, one.stderr[-4000:]
    assert "distributed=ddp: accelerate built ddp over 2 processes" in one.stdout + one.stderr
    assert (tmp_path / "one_node" / "sft" / "stage.json").is_file()
    port = free_port()
    nodes = [subprocess.Popen(
        accelerate_launch(*_cli(tiny, tmp_path / "two_nodes", "distributed=ddp", "trainer.resume=auto"),
                          port=port, extra=("--num_machines", "2", "--machine_rank", str(rank),
                                            "--main_process_ip", "127.0.0.1")),
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    outputs = [node.communicate(timeout=600) for node in nodes]
    for node, (_, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, err[-4000:]
    a, b = _weights(tmp_path / "one_node", "sft"), _weights(tmp_path / "two_nodes", "sft")
    start = _weights(tiny.parent.parent, "sft")
    assert max((a[k] - start[k]).abs().max().item() for k in a) > 1e-3
    worst = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"two nodes vs one node: max |dw| = {worst:.2e}")
    assert worst <= WEIGHT_TOL


def test_export_of_a_sharded_run_gives_the_one_process_logits(tmp_path, two_processes, one_process):
    """`cipr-export` of the CIPR run (warm start + GRPO) trained under each strategy: a transformers folder
    whose logits equal those of the same run trained by one process (the checkpoints hold whole tensors:
    FSDP's full state dict, ZeRO-3's gathered weights)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cipr.cli.export import main as export_main

    strategy, out = two_processes
    logits = {}
    for name, run_dir in (("one", one_process / "cipr"), ("two", out / "cipr")):
        assert export_main([f"run_dir={run_dir}", f"out_dir={tmp_path / name}"]) == 0
        model = AutoModelForCausalLM.from_pretrained(tmp_path / name, dtype=torch.float32).eval()
        ids = AutoTokenizer.from_pretrained(tmp_path / name)("find a flight to Oslo",
                                                             return_tensors="pt").input_ids
        with torch.no_grad():
            logits[name] = model(ids).logits
    worst = (logits["one"] - logits["two"]).abs().max().item()
    print(f"{strategy}: exported logits max |2proc - 1proc| = {worst:.2e}")
    assert worst <= 1e-4


def test_fsdp_sharded_state_dict_checkpoints_resume_and_export(tmp_path, tiny, one_process):
    """FSDP with `state_dict_type: SHARDED_STATE_DICT` (small step checkpoints, the large-model setting):
    SIGKILL after the step-1 save, rerun, and the final weights equal one process's; the sharded step-1
    checkpoint (pytorch_model_fsdp_0/) exports, merged on CPU, to the logits of one process's step-1
    checkpoint."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cipr.cli.export import main as export_main

    config = _config(tiny, tmp_path / "sft", "sft", "fsdp", 2)
    config["distributed"]["fsdp"]["state_dict_type"] = "SHARDED_STATE_DICT"
    run = {"name": "sft", "config": config}
    _run_plan_expecting(tmp_path, {"runs": [{**run, "die_after_step": 1}]}, killed=True)
    assert (tmp_path / "sft" / "sft" / "checkpoint-1" / "pytorch_model_fsdp_0").is_dir()
    _run_plan_expecting(tmp_path, {"runs": [run]}, killed=False)
    a, b = _weights(one_process / "sft", "sft"), _weights(tmp_path / "sft", "sft")
    assert max((a[k] - b[k]).abs().max().item() for k in a) <= WEIGHT_TOL
    logits = {}
    for name, folder in (("one", one_process / "sft" / "sft" / "checkpoint-1"),
                         ("sharded", tmp_path / "sft" / "sft" / "checkpoint-1")):
        assert export_main([f"run_dir={folder}", f"out_dir={tmp_path / f'export_{name}'}"]) == 0
        model = AutoModelForCausalLM.from_pretrained(tmp_path / f"export_{name}", dtype=torch.float32).eval()
        ids = AutoTokenizer.from_pretrained(tmp_path / f"export_{name}")("find a flight",
                                                                         return_tensors="pt").input_ids
        with torch.no_grad():
            logits[name] = model(ids).logits
    worst = (logits["one"] - logits["sharded"]).abs().max().item()
    print(f"fsdp sharded checkpoint-1 export: max |logits - one process| = {worst:.2e}")
    assert worst <= 1e-4


def _run_plan_expecting(out: Path, plan: dict[str, Any], killed: bool) -> None:
    (out / "plan.json").write_text(json.dumps({"shim": True, **plan}))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    cmd = accelerate_launch(str(ROOT / "tests/sharded_worker.py"), str(out / "plan.json"))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if killed:
        assert proc.returncode != 0 and "SIGKILL" in proc.stdout + proc.stderr, proc.stderr[-3000:]
    else:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
