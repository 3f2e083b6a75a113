"""GPU first contact: every CUDA path a training run takes, checked in one script, in minutes, offline.

    .venv/bin/python scripts/gpu_check.py --device cpu --out gpu_check_cpu.json   # here
    .venv/bin/python scripts/gpu_check.py --device cpu --simulate-gpu-image   # in CI: only the GPU's packages
    python scripts/gpu_check.py --device cuda --out gpu_check.json   # the first command on a GPU node

It builds a real architecture from the shipped model config (configs/models/Qwen--Qwen2.5-3B-Instruct.json:
Qwen2ForCausalLM with its activation, norms, rotary base and grouped-query attention) at reduced depth and
width (`SHAPES`: on CUDA 4 layers, hidden 512, 8 query and 2 key/value heads, MLP 1408, about 11 M parameters;
on a CPU 2 layers, hidden 256, 4 and 2 heads, MLP 704, about 1.5 M) with
random weights and an offline byte-level tokenizer carrying Qwen's specials and chat template (tests/support),
so nothing is downloaded. In bf16 on CUDA (float32 on CPU) it runs, each a named check with `ok`, its numbers
and its seconds, through the code `cipr-train`, `cipr-export` and `cipr-eval` use (their engines, not copies):

- `action_reader`: `cipr.method.actions.read_actions` on the device against the same weights in float32 on the
  CPU: the largest absolute difference of the action distributions; tolerance 0.03 in bf16 (bf16 keeps 8
  significant bits, a relative error of 2^-8 per rounding; through a few layers the logits move by a few
  hundredths, and a probability moves by at most about its own size times that), 1e-5 in float32;
- `grpo_step_hf_rollouts`: one CIPR GRPO step whose rollouts HF generation samples on the device (the task
  loss; a random model writes no call, so the consistency terms have no decision to read here), with the
  attention implementation the loader chose, the step time and generation tokens per second;
- `grpo_step_consistency`: one CIPR GRPO step with replayed rollouts that make calls (`cipr.train.replay`), so
  the rescoring and rollout KLs run on the device;
- `supervised_step`: one supervised CIPR step (SFT + the rescoring KL on the reference targets), and its peak
  memory;
- `multi_turn_step`: one multi-turn ToyShop CIPR step, turns replayed from ToyShop's scripted expert;
- `memory_vs_plan`: the peak memory of the HF-rollout GRPO step (`torch.cuda.max_memory_allocated`, or the
  growth of the process's peak RSS on CPU) against `cipr-plan`'s per-GPU estimate for the same shape, batch
  and strategy (without its fixed CUDA-context allowance on CUDA): the ratio, ok within a factor of 2.5 either
  way on CUDA (an estimate that forgot the activations or took the wrong dtype is off by more), 4 on a CPU
  (peak RSS growth includes the allocator's and the process's own, 0.37-0.38 of the plan measured here);
- `supervised_memory_vs_plan`: the same for the supervised step above against the plan's supervised-regime
  estimate (`cipr.plan.plan.supervised_activations`), judged on CUDA only: on a CPU the step's growth of the
  current RSS (sampled; the process's peak was set before it) is what the allocator could not reuse of the
  earlier checks' memory, about 0.01 GB here, so the ratio is reported and only the plan checked;
- `export_and_eval`: `cipr-export` of the GRPO step's run folder and one `cipr-eval` slice of the export
  (synthetic, 2 items, original and typos, on the device);

The report is JSON: {"device": ..., "shape": ..., "checks": [{"name", "ok", "seconds", ...}], "wall_s": ...};
the exit status is 0 only if every check is ok.

Beyond torch and transformers (and what the GPU image carries with them: accelerate, peft, scipy, pandas,
pyarrow, httpx) it needs the pure-Python or small wheels in `WHEELS` (about 28 MiB together). One command, on
a machine with the package index, writes them into `.whl/` for a Python 3.12 x86-64 machine without network:

    .venv/bin/python scripts/gpu_check.py --download-wheels .whl

and on the GPU machine: `python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl` then
`PYTHONPATH=/tmp/site:. python3 scripts/gpu_check.py --device cuda --out gpu_check.json`.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the offline tokenizer, the replays
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the package, where it is not installed

import argparse
import json
import math
import os
import resource
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {"cuda": {"num_hidden_layers": 4, "hidden_size": 512, "intermediate_size": 1408,
                   "num_attention_heads": 8, "num_key_value_heads": 2, "max_window_layers": 4,
                   "max_position_embeddings": 4096},
          "cpu": {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 704,
                  "num_attention_heads": 4, "num_key_value_heads": 2, "max_window_layers": 2,
                  "max_position_embeddings": 4096}}
"""The shipped Qwen2.5-3B config with these values replaced (the vocabulary is the offline tokenizer's), by
device: on a CPU half the depth and width, so that the check fits CI's few minutes on 2 cores."""

WHEELS = ["trl", "datasets", "dill", "xxhash", "multiprocess", "hydra-core", "omegaconf",
          "antlr4-python3-runtime", "jsonschema", "jsonschema-specifications", "referencing", "rpds-py",
          "attrs", "matplotlib", "contourpy", "cycler", "fonttools", "kiwisolver", "pyparsing", "pillow"]
"""What the GPU image lacks for this script: downloaded at the versions installed here (the versions the CPU
run checked), about 28 MiB together."""

GPU_IMAGE = {"torch", "transformers", "accelerate", "peft", "scipy", "pandas", "pyarrow", "httpx", "numpy",
             "huggingface_hub", "tokenizers", "safetensors", "regex", "tqdm", "packaging", "yaml", "requests",
             "filelock", "fsspec", "jinja2", "markupsafe", "sympy", "mpmath", "networkx", "typing_extensions",
             "psutil", "certifi", "idna", "charset_normalizer", "urllib3", "anyio", "h11", "httpcore",
             "sniffio",
             "dateutil", "pytz", "tzdata", "six", "hf_xet", "triton", "nvidia", "setuptools", "pkg_resources",
             "_distutils_hack", "importlib_metadata", "zipp", "torchgen", "functorch", "_yaml", "shellingham",
             "typer", "click", "rich",
             "markdown_it", "mdurl", "pygments", "annotated_doc", "typing_inspection", "annotated_types"}
"""Top-level modules the GPU image carries (its list of 2026-11-17 and their dependencies)."""

WHEEL_MODULES = {"trl", "datasets", "dill", "xxhash", "multiprocess", "_multiprocess", "hydra", "omegaconf",
                 "antlr4",
                 "jsonschema", "jsonschema_specifications", "referencing", "rpds", "attr", "attrs",
                 "matplotlib", "contourpy", "cycler", "fontTools", "kiwisolver", "pyparsing", "PIL",
                 "mpl_toolkits", "pylab"}
"""The top-level modules `WHEELS` install."""


def rss_gb() -> float:
    """The process's peak resident set size so far, GB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


class Report:
    """Named checks, each timed, its failure (with its traceback's last line) recorded instead of raised."""

    def __init__(self, device: str) -> None:
        self.device, self.checks, self.start = device, [], time.time()

    def run(self, name: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        start = time.time()
        try:
            result = fn()
        except Exception as e:  # noqa: BLE001 - every check reports; the script never stops at the first
            result = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000],
                      "where": traceback.format_exc().strip().splitlines()[-3:]}
        rest = {k: v for k, v in result.items() if k != "ok"}
        seconds = round(time.time() - start, 2)
        result = {"name": name, "ok": bool(result.get("ok")), **rest, "seconds": seconds}
        self.checks.append(result)
        shown = {k: v for k, v in result.items() if k not in ("name", "ok", "seconds", "where")}
        print(f"{'ok  ' if result['ok'] else 'FAIL'} {name} ({result['seconds']} s): {shown}", flush=True)
        return result

    def to_json(self, extra: dict[str, Any]) -> dict[str, Any]:
        return {"device": self.device, **extra, "checks": self.checks,
                "ok": all(c["ok"] for c in self.checks), "wall_s": round(time.time() - self.start, 1)}


def build_model(folder: Path, device: str) -> tuple[Path, dict[str, Any]]:
    """The reduced Qwen2.5 (random weights) and the offline tokenizer, saved in `folder`."""
    import torch
    from support.tiny_models import tiny_tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM

    data = json.loads((ROOT / "configs" / "models" / "Qwen--Qwen2.5-3B-Instruct.json").read_text())
    data.pop("_cipr")
    tokenizer = tiny_tokenizer(vocab_size=1024)
    data.update(SHAPES[device], vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                torch_dtype="float32")
    model_type = data.pop("model_type")
    config = AutoConfig.for_model(model_type, **data)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    return folder, {"base": "Qwen/Qwen2.5-3B-Instruct config.json", "class": type(model).__name__,
                    **SHAPES[device],
                    "vocab_size": len(tokenizer), "parameters": params}


def overrides(model: Path, run_dir: Path, *extra: str) -> list[str]:
    """cipr-train overrides of a one-step run on the reduced model (precision auto: bf16 on CUDA)."""
    return ["model=tiny", f"model.name_or_path={model}", "model.short_name=qwen25-mini",
            "model.call_format=compact",
            "data.n=12", "data.eval_examples=0", "data.tools_per_example=[2,2]", "data.parallel_fraction=0.0",
            "trainer.max_steps=1", "trainer.save_steps=1", "trainer.warm_start.steps=0",
            "trainer.warm_start.eval_examples=0", "trainer.gradient_checkpointing=false",
            "logging.progress_bar=false", "rollout.num_generations=2", "rollout.max_completion_length=32",
            f"trainer.run_dir={run_dir}", *extra]


def steps(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if r.get("kind") == "step"]


def finite(line: dict[str, Any], keys: list[str]) -> bool:
    return all(isinstance(line.get(k), int | float) and math.isfinite(line[k]) for k in keys)


def check_reader(model_dir: Path, device: str) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cipr.data.synthetic import SyntheticConfig
    from cipr.formats import get_format
    from cipr.method.actions import ActionQuery, read_actions
    from cipr.runtime.model import prepare_inference_tokenizer
    from cipr.tools.canonical import canonicalize

    tokenizer = prepare_inference_tokenizer(AutoTokenizer.from_pretrained(model_dir))
    fmt = get_format("compact")
    queries = []
    for ex in SyntheticConfig(n=6, seed=3, tools_per_example=(3, 3)).generate(split="test"):
        ex, _ = canonicalize(ex)
        prompt = fmt.render_prompt(tokenizer, ex.messages, ex.interface)
        target = fmt.render_target(ex.reference, response=ex.response)
        queries.append(ActionQuery.from_format(fmt, prompt, target, ex.interface.names,
                                               tuple(range(len(ex.interface)))))
    reference = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    with torch.no_grad():
        cpu = read_actions(reference, tokenizer, queries, 3).probs.double()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=dtype).to(device).eval()
    with torch.no_grad():
        dev = read_actions(model, tokenizer, queries, 3).probs.double().cpu()
    tolerance = 0.03 if dtype == torch.bfloat16 else 1e-5
    diff = float((dev - cpu).abs().max())
    return {"ok": dev.shape == cpu.shape and diff <= tolerance, "max_abs_diff": diff, "tolerance": tolerance,
            "dtype": str(dtype), "decisions": int(cpu.shape[0]),
            "rows_sum_to_1": float((dev.sum(-1) - 1).abs().max())}


def grpo_hf(model_dir: Path, work: Path, device: str) -> dict[str, Any]:
    import torch

    from cipr.runtime.model import load_model
    from cipr.train.config import compose_train
    from cipr.train.run import run

    cfg = compose_train(overrides(model_dir, work / "grpo_hf", "algo=cipr",
                                  "trainer.per_device_train_batch_size=4"))
    probe, _ = load_model(cfg.model)  # the loader the engine uses: which attention it chose
    attention = getattr(probe.config, "_attn_implementation", None)
    del probe
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**30
    else:
        base = rss_gb()
    run_dir = run(cfg)
    peak = (torch.cuda.max_memory_allocated() / 2**30) if device == "cuda" else rss_gb() - base
    (line,) = steps(run_dir)
    tokens = line.get("completions/mean_length", 0) * 2 * 4  # G completions for each of 4 rows
    generate = line.get("time/generate") or float("nan")
    return {"ok": finite(line, ["loss", "grad_norm"]), "run_dir": str(run_dir), "loss": line["loss"],
            "attention": attention, "precision": cfg.trainer.precision,
            "step_seconds": line.get("speed/step_seconds"), "generate_seconds": generate,
            "generation_tokens_per_second": tokens / generate if generate else None, "peak_gb": peak,
            "baseline_gb": base, "mean_completion_tokens": line.get("completions/mean_length")}


def grpo_consistency(model_dir: Path, work: Path) -> dict[str, Any]:
    from cipr.train.config import compose_train
    from cipr.train.replay import replay_rollouts
    from cipr.train.run import run

    run_dir = run(compose_train(overrides(model_dir, work / "grpo_replay", "algo=cipr",
                                          "trainer.per_device_train_batch_size=4",
                                          "rollout.max_completion_length=96")),
                  rollout_source=replay_rollouts())
    (line,) = steps(run_dir)
    keys = ["loss", "consistency/rescore/kl", "consistency/rollout/kl", "actions/p_no_call"]
    return {"ok": finite(line, keys), **{k: line.get(k) for k in keys}}


SUPERVISED = ("algo=cipr_sft", "trainer.per_device_train_batch_size=2", "algo.action_weight=1.0",
              "logging.trace=true")
"""The supervised step's overrides (its check and its memory check)."""


class PeakRss:
    """The largest resident set size while in the block, sampled every 5 ms by a thread, GB; and the size when
    the block began. Unlike ru_maxrss it measures a block after a larger one."""

    def __enter__(self) -> PeakRss:
        import threading

        import psutil

        self._process, self._done = psutil.Process(), threading.Event()
        self.start = self.peak = self._process.memory_info().rss / 2**30
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, self._process.memory_info().rss / 2**30)

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss / 2**30)


def supervised(model_dir: Path, work: Path, device: str) -> dict[str, Any]:
    """One supervised CIPR step with action supervision and the trace; its peak memory (CUDA: the peak
    allocation; CPU: the growth of the resident set over the run, `PeakRss`)."""
    import torch

    from cipr.train.config import compose_train
    from cipr.train.run import run

    cfg = compose_train(overrides(model_dir, work / "supervised", *SUPERVISED))
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    with PeakRss() as rss:
        run_dir = run(cfg)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else rss.peak - rss.start
    (line,) = steps(run_dir)
    keys = ["loss", "consistency/rescore/kl", "action/nll", "trace/rescore/before", "trace/rescore/after"]
    return {"ok": finite(line, keys), **{k: line.get(k) for k in keys}, "peak_gb": peak,
            "baseline_gb": rss.start}


def multi_turn(model_dir: Path, work: Path) -> dict[str, Any]:
    from support.episode_replay import EpisodeReplay, expert_choice

    from cipr.train.config import compose_train
    from cipr.train.run import run

    def replay(trainer: Any) -> Any:
        episodes = EpisodeReplay(trainer.episodes, expert_choice(trainer.episodes))
        return lambda prompt_ids: episodes.generate(prompt_ids, step=trainer.state.global_step)

    cfg = compose_train(overrides(model_dir, work / "multi_turn", "algo=cipr", "model.call_format=hermes",
                                  "rollout.mode=multi_turn", "env=toyshop", "env.n_tasks=40",
                                  "rollout.episode_tasks=2", "rollout.max_completion_length=2048",
                                  "trainer.per_device_train_batch_size=4", "data.n=8"))
    run_dir = run(cfg, rollout_source=replay)
    (line,) = steps(run_dir)
    keys = ["loss", "consistency/rescore/kl", "consistency/rollout/kl", "turns_per_episode"]
    return {"ok": finite(line, keys) and line["turns_per_episode"] >= 2, **{k: line.get(k) for k in keys}}


def memory_vs_plan(model_dir: Path, work: Path, measured: dict[str, Any], device: str,
                   regime: tuple[str, ...] = ("algo=cipr", "trainer.per_device_train_batch_size=4"),
                   judged_on_cpu: bool = True) -> dict[str, Any]:
    """The measured step's peak against the plan of the same overrides (`regime`: the GRPO step's by
    default). `judged_on_cpu` False: on a CPU the ratio is reported, not judged (a step after others grows
    the resident set by what the allocator cannot reuse, not by what the step holds)."""
    from cipr.plan.memory import CONTEXT_GB
    from cipr.plan.plan import PlanOptions, make_plan

    plan = make_plan(overrides(model_dir, work / "plan", *regime), PlanOptions(out=""))
    mem = plan.facts["memory"]
    planned = mem["trainer_peak"] - (CONTEXT_GB if device == "cuda" else 0.0)
    peak = measured.get("peak_gb")
    judged = device == "cuda" or judged_on_cpu
    if not isinstance(peak, float) or (peak <= 0 and judged):
        return {"ok": False, "error": "no peak measured (the step failed)", "planned_gb": planned}
    ratio = peak / planned
    bound = 2.5 if device == "cuda" else 4.0
    return {"ok": 1 / bound <= ratio <= bound if judged else planned > 0, "bound": bound if judged else None,
            "measured_gb": peak,
            "measured": "torch.cuda.max_memory_allocated" if device == "cuda" else "peak RSS growth",
            "planned_gb": planned, "ratio_measured_over_planned": ratio, "plan_strategy": mem["strategy"],
            "plan_precision": mem["precision"], "plan_activations": mem["activations"]}


def export_and_eval(run_dir: str, work: Path, device: str) -> dict[str, Any]:
    from cipr.eval.config import compose_eval_config
    from cipr.eval.evaluate import evaluate
    from cipr.runtime.export import ExportConfig, export

    out = export(run_dir, work / "export", ExportConfig())
    summary = evaluate(compose_eval_config([f"model={out}", "benchmark=synthetic", "limit=2",
                                            "perturbations=[original,typos]", "names=[original]",
                                            "max_new_tokens=16", f"device={device}", "backend=hf",
                                            f"out_dir={work / 'eval'}", "progress=false"]))
    return {"ok": summary.get("n_records", 0) == 4, "export": str(out), "records": summary.get("n_records")}


def simulated_site(folder: Path) -> Path:
    """A site-packages folder holding only what the GPU image and `WHEELS` provide, as links into this
    environment's: every top-level module of `GPU_IMAGE | WHEEL_MODULES` with its distributions' metadata
    (so `importlib.metadata` finds their versions) and the shared libraries they load (`*.libs`). A run with
    only this folder in place of site-packages (`BOOTSTRAP`) imports nothing else: an import the GPU machine
    could not satisfy fails here first."""
    import importlib.metadata as md
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    folder.mkdir(parents=True, exist_ok=True)
    owners = md.packages_distributions()
    allowed = GPU_IMAGE | WHEEL_MODULES
    dists: set[str] = set()
    for entry in site.iterdir():
        top = entry.name.split(".")[0]
        if top in allowed or entry.name.endswith(".libs"):
            (folder / entry.name).symlink_to(entry)
            dists.update(owners.get(top, []))
    for dist in md.distributions():
        name = dist.metadata["Name"]
        path = getattr(dist, "_path", None)
        if name in dists and path is not None and Path(path).parent == site:
            target = folder / Path(path).name
            if not target.exists():
                target.symlink_to(path)
    return folder


BOOTSTRAP = """
import runpy, sys
site, root, script = sys.argv[1:4]
sys.path[:] = [site, root, *(p for p in sys.path if p and not p.endswith(("site-packages", "dist-packages")))]
sys.argv = [script, *sys.argv[4:]]
runpy.run_path(script, run_name="__main__")
"""
"""Runs the script with this environment's site-packages taken off sys.path (after `site` has run, so the
interpreter starts as usual) and the simulated site in their place."""


def run_simulated(args: argparse.Namespace) -> int:
    """This script again, in a process that sees only the GPU image's packages and `WHEELS`
    (`simulated_site`), the repository on sys.path in place of its installation."""
    with tempfile.TemporaryDirectory() as tmp:
        site = simulated_site(Path(tmp) / "site")
        cmd = [sys.executable, "-c", BOOTSTRAP, str(site), str(ROOT), str(Path(__file__).resolve()),
               "--device", args.device, "--out", str(args.out)]
        if args.work:
            cmd += ["--work", str(args.work)]
        print(f"gpu_check: the run sees only the GPU image's packages and the wheels ({site})", flush=True)
        return subprocess.call(cmd)


def download_wheels(folder: str) -> int:
    """`pip download` of `WHEELS` for CPython 3.12 on x86-64 Linux, binary wheels only, into `folder`; a
    package published only as source (antlr4-python3-runtime 4.9.3, pure Python) is built into a wheel here
    with `pip wheel` instead. Each at the version installed here."""
    platforms = [f"--platform=manylinux_2_{n}_x86_64" for n in (17, 27, 28, 34)]
    base = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--python-version=3.12", "--implementation=cp", *platforms, "--platform=manylinux2014_x86_64",
            "-q", "-d", folder]
    import importlib.metadata as md

    failed = []
    for name in WHEELS:
        try:
            wheel = f"{name}=={md.version(name)}"
        except md.PackageNotFoundError:
            wheel = name
        if subprocess.call([*base, wheel]) != 0:
            print(f"{wheel}: no binary wheel for CPython 3.12; building one from its source", flush=True)
            built = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", folder, wheel]
            if subprocess.call(built):
                failed.append(wheel)
    wheels = sorted(Path(folder).glob("*.whl"))
    size = sum(p.stat().st_size for p in wheels) / 2**20
    print(f"{len(wheels)} wheels, {size:.1f} MiB in {folder}" + (f"; failed: {failed}" if failed else ""))
    return 1 if failed else 0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    p.add_argument("--work", type=Path, default=None, help="working folder (default: a temporary one)")
    p.add_argument("--simulate-gpu-image", action="store_true",
                   help="run in a process that sees only the GPU image's packages and the wheels below")
    p.add_argument("--download-wheels", metavar="DIR",
                   help="only write the wheels this script needs into DIR")
    args = p.parse_args()
    if args.download_wheels:
        sys.exit(download_wheels(args.download_wheels))
    if args.simulate_gpu_image:
        sys.exit(run_simulated(args))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("WANDB_MODE", "disabled")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: --device cuda but torch sees no CUDA device (--device cpu checks the CPU path)")
    from cipr.cli.common import quiet_libraries

    quiet_libraries()
    report = Report(args.device)
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        model_dir, shape = build_model(work / "model", args.device)
        report.run("action_reader", lambda: check_reader(model_dir, args.device))
        hf = report.run("grpo_step_hf_rollouts", lambda: grpo_hf(model_dir, work, args.device))
        report.run("grpo_step_consistency", lambda: grpo_consistency(model_dir, work))
        sup = report.run("supervised_step", lambda: supervised(model_dir, work, args.device))
        report.run("multi_turn_step", lambda: multi_turn(model_dir, work))
        report.run("memory_vs_plan", lambda: memory_vs_plan(model_dir, work, hf, args.device))
        report.run("supervised_memory_vs_plan",
                   lambda: memory_vs_plan(model_dir, work, sup, args.device, SUPERVISED, judged_on_cpu=False))
        report.run("export_and_eval", lambda: export_and_eval(hf.get("run_dir", ""), work, args.device))
        result = report.to_json({"device_name": device_name, "torch": torch.__version__,
                                 "cuda": torch.version.cuda, "shape": shape})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"gpu_check: {sum(c['ok'] for c in report.checks)}/{len(report.checks)} checks ok on {device_name} "
          f"in {result['wall_s']} s; report {args.out}")
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
