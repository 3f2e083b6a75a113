"""cipr-plan: every GPU command the experiment configs name, planned on this CPU without weights or network.

- Every `cipr-train` command under a "one GPU", "several GPUs" or "Slurm" label in the headers of
  configs/train/experiment/*.yaml and configs/train/distributed/*.yaml (so every strategy they name) is
  planned; it must pass, or fail with exactly the defects `known_defects` derives from its composed config
  independently of the plan (a template-following call format the family's chat template contradicts; a
  billion-parameter policy without gradient checkpointing on one card). A fixed config then passes.
- Memory: ZeRO-2/3 model states agree with DeepSpeed's own estimators on the Qwen2.5-3B shape within
  DS_MARGIN (the formulas follow DeepSpeed's accounting; the margin covers rounding), and the model
  states of the embedded SmolLM2 agree with a measured optimizer step on CPU within 10 % (RSS growth).
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import re
import shlex
from pathlib import Path

import pytest

from cipr.core.config import ConfigError
from cipr.plan import PlanOptions, make_plan, memory
from cipr.plan.model import architecture, meta_model, shape, template_text
from cipr.train.preflight import Findings, batch_plan, length_stats, preflight

ROOT = Path(__file__).resolve().parents[1]
HEADERS = sorted((ROOT / "configs/train/experiment").glob("*.yaml")) + sorted(
    (ROOT / "configs/train/distributed").glob("*.yaml"))
LABEL = re.compile(r"\b(one CPU|one GPU|several GPUs|Slurm|then)\b", re.I)
GPU_LABELS = {"one gpu", "several gpus", "slurm"}
DS_MARGIN = 0.01
QUICK = PlanOptions(out="", rows=16)


def gpu_commands(paths: list[Path] = HEADERS) -> list[tuple[str, ...]]:
    """The overrides of every cipr-train command the headers of `paths` give for GPUs (deduplicated)."""
    found: dict[tuple[str, ...], None] = {}
    for path in paths:
        lines = [line[1:].strip() if line.startswith("#") else None for line in path.read_text().splitlines()]
        label, i = None, 0
        while i < len(lines):
            line = lines[i]
            if line is not None:
                head = re.split(r"cipr-train |slurm/train\.sbatch ", line)[0]
                if (m := LABEL.search(head)) is not None:
                    label = m.group(1).lower()
                if re.search(r"cipr-train |slurm/train\.sbatch ", line):
                    text = line
                    while text.endswith("\\") and i + 1 < len(lines) and lines[i + 1] is not None:
                        i += 1
                        text = text[:-1] + " " + lines[i]
                    args = re.split(r"cipr-train |slurm/train\.sbatch ", text, maxsplit=1)[1].split("#")[0]
                    if label in GPU_LABELS:
                        words = shlex.split(args)
                        found[tuple(a for a in words if "=" in a and not a.startswith("-"))] = None
            i += 1
    return list(found)


COMMANDS = gpu_commands()


def test_the_commands_cover_every_experiment_and_strategy():
    named = {a.split("=")[1] for c in COMMANDS for a in c if a.startswith("experiment=")}
    assert {p.stem for p in (ROOT / "configs/train/experiment").glob("qwen*.yaml")} <= named
    strategies = {a.split("=")[1] for c in COMMANDS for a in c if a.startswith("distributed=")}
    assert strategies == {"ddp", "fsdp", "zero2", "zero3"}
    assert any(not any(a.startswith("launcher.num_processes") for a in c) for c in COMMANDS)  # one GPU


def known_defects(cfg) -> list[tuple[str, ...]]:
    """The defects a composed config holds, derived without the plan: each the words its error must name."""
    from cipr.formats import FORMATS, detect_format

    defects = []
    arch = architecture(cfg.model)
    template = cfg.model.chat_template or arch.chat_template
    fmt = cfg.model.call_format
    if template and fmt in FORMATS and FORMATS[fmt].uses_native_tools:
        family = detect_format(template_text(template))
        if family != fmt:
            defects.append((f"model.call_format={fmt}", family, "contradicts"))
    params = shape(meta_model(arch), cfg.model).params
    if (not cfg.trainer.gradient_checkpointing and params > 1e9 and cfg.launcher.num_processes == 1
            and cfg.algo.name != "distill"):
        defects.append(("trainer.gradient_checkpointing=true", "GB per GPU"))
    return defects


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


@pytest.mark.parametrize("overrides", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
@pytest.mark.integration
def test_every_gpu_command_plans_or_names_its_defect(overrides):
    plan = make_plan(list(overrides), QUICK)
    expected = known_defects(plan.config)
    errors = list(plan.findings.errors)
    for words in expected:
        hits = [e for e in errors if all(w in e for w in words)]
        assert hits, f"the plan missed a defect naming {words}; it found: {errors}"
        errors.remove(hits[0])
    assert not errors, "defects in " + " ".join(overrides) + ":\n" + "\n".join(errors)
    assert plan.facts["memory"]["verdict"] in ("fits", "does not fit")
    assert plan.preflight is not None and plan.preflight.batch is not None


def test_the_qwen35_call_format_contradiction_is_caught_and_the_fix_passes():
    wrong = make_plan(["experiment=qwen35_4b_cipr", "model.call_format=hermes"], QUICK)
    (error,) = [e for e in wrong.findings.errors if "contradicts" in e]
    assert "model.call_format=hermes" in error and "qwen35_xml" in error and "qwen3_5_think" in error
    assert "<function=get_weather>" in error  # what the template renders, shown
    fixed = make_plan(["experiment=qwen35_4b_cipr", "model.call_format=qwen35_xml"], QUICK)
    assert fixed.ok, fixed.findings.errors
    assert fixed.preflight.lengths["prompt"].count > 0


def test_a_prompt_format_never_contradicts_the_template():
    plan = make_plan(["experiment=qwen25_3b_cipr"], QUICK)
    assert plan.ok, plan.findings.errors
    assert any("toolrl writes the tools" in n and "hermes" in n for n in plan.findings.notes)


# -- memory ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def qwen25_3b():
    from cipr.runtime.model import ModelConfig

    cfg = ModelConfig(name_or_path="Qwen/Qwen2.5-3B-Instruct", gguf_package=None, gguf_file=None)
    model = meta_model(architecture(cfg))
    return model, shape(model, cfg)


def test_the_qwen25_3b_shape_has_its_published_size(qwen25_3b):
    _, s = qwen25_3b
    assert s.params == 3_085_938_688 and s.tied and s.largest_module == 151_936 * 2048


@pytest.mark.parametrize("world", [1, 2, 8])
def test_zero_model_states_agree_with_deepspeeds_estimators(qwen25_3b, world):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs, model_to_params
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    model, s = qwen25_3b
    # `_all_live` counts shared tensors by data_ptr(), 0 for every meta tensor; the largest layer it reads
    # from numel() alone, so that part of its count is taken from the meta model as it is.
    _, largest = model_to_params(model)
    assert largest == s.largest_module
    _, ds2 = estimate_zero2_model_states_mem_needs(s.params, world, 1, cpu_offload=False)
    _, ds3, _ = estimate_zero3_model_states_mem_needs(s.params, largest, world, 1, cpu_offload=False,
                                                      cpu_offload_params=False)
    ours2 = memory.model_states("zero2", world, s.params, s.params, 2).total
    ours3 = memory.model_states("zero3", world, s.params, s.params, 2, largest_module=s.largest_module).total
    assert abs(ours2 - ds2) / ds2 < DS_MARGIN and abs(ours3 - ds3) / ds3 < DS_MARGIN


def test_all_live_estimators_count_a_live_model_as_the_plan_does(monkeypatch):
    """DeepSpeed's `_all_live` estimators on a real (small) Qwen2: the counts they derive are the plan's."""
    import torch
    from deepspeed.runtime.zero import stage3, stage_1_and_2
    from transformers import AutoModelForCausalLM, Qwen2Config

    from cipr.runtime.model import ModelConfig

    seen = {}
    for module, name in ((stage_1_and_2, "estimate_zero2_model_states_mem_needs"),
                         (stage3, "estimate_zero3_model_states_mem_needs")):
        original = getattr(module, name)

        def record(*args, _original=original, _name=name, **kwargs):
            result = _original(*args, **kwargs)
            if kwargs.get("cpu_offload") is False and kwargs.get("cpu_offload_params", False) is False:
                seen[_name] = (kwargs, result[1])
            return result

        monkeypatch.setattr(module, name, record)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(
        hidden_size=128, intermediate_size=352, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=3000, tie_word_embeddings=True))
    with contextlib.redirect_stdout(None):
        stage_1_and_2.estimate_zero2_model_states_mem_needs_all_live(model, num_gpus_per_node=4)
        stage3.estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=4)
    s = shape(model, ModelConfig(gguf_package=None, gguf_file=None, name_or_path="x"))
    kw2, ds2 = seen["estimate_zero2_model_states_mem_needs"]
    kw3, ds3 = seen["estimate_zero3_model_states_mem_needs"]
    assert kw2["total_params"] == kw3["total_params"] == s.params
    assert kw3["largest_layer_params"] == s.largest_module
    assert abs(memory.model_states("zero2", 4, s.params, s.params, 2).total - ds2) / ds2 < DS_MARGIN
    ours3 = memory.model_states("zero3", 4, s.params, s.params, 2, largest_module=s.largest_module).total
    assert abs(ours3 - ds3) / ds3 < DS_MARGIN


@pytest.mark.parametrize("strategy", ["zero2", "zero3"])
def test_the_plan_of_qwen25_3b_on_8_gpus_carries_deepspeeds_figure(strategy, qwen25_3b):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    _, s = qwen25_3b
    plan = make_plan(["experiment=qwen25_3b_cipr", "launcher.num_processes=8", f"distributed={strategy}"],
                     QUICK)
    if strategy == "zero2":
        _, ds = estimate_zero2_model_states_mem_needs(s.params, 8, 1, cpu_offload=False)
    else:
        _, ds, _ = estimate_zero3_model_states_mem_needs(s.params, s.largest_module, 8, 1, cpu_offload=False,
                                                         cpu_offload_params=False)
    total = plan.facts["memory"]["model_states"]["total"]
    assert abs(total - ds / memory.GB) / (ds / memory.GB) < DS_MARGIN


def measure_embedded_step() -> dict[str, float]:
    """The default run's model (embedded SmolLM2-135M, float32, top 10 of 30 layers trained) through one
    AdamW step on CPU: the plan's model states, the bytes of the tensors the step holds, and how much the
    process grew from before the gradients to after the step (a warm-up step first, so that the
    libraries' one-time buffers are not counted). Run in a fresh process (`python tests/test_plan.py`)."""
    import psutil
    import torch

    from cipr.runtime.model import load_model
    from cipr.train.config import compose_train

    logging.disable(logging.WARNING)
    cfg = compose_train([])
    s = shape(meta_model(architecture(cfg.model)), cfg.model)
    predicted = memory.model_states("none", 1, s.params, s.trainable, memory.DTYPE_BYTES[cfg.model.dtype])
    model, tokenizer = load_model(cfg.model)
    trained = [p for p in model.parameters() if p.requires_grad]
    ids = torch.tensor([tokenizer("Which tool tells the weather in Paris?")["input_ids"]])
    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)
    gc.collect()
    before = psutil.Process().memory_info().rss
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer = torch.optim.AdamW(trained, lr=1e-5)  # the Trainer's adamw_torch
    optimizer.step()
    gc.collect()
    grown = psutil.Process().memory_info().rss - before
    weights = sum(p.nbytes for p in {id(p): p for p in model.parameters()}.values())
    grads = sum(p.grad.nbytes for p in trained)
    states = sum(v.nbytes for st in optimizer.state.values() for v in st.values() if torch.is_tensor(v))
    return {"predicted_total": predicted.total, "predicted_growth": predicted.gradients + predicted.optimizer,
            "tensors": weights + grads + states, "grown": grown}


@pytest.mark.integration
def test_model_states_match_a_measured_step_of_the_embedded_model():
    """The tensors the step holds equal the plan's model states; the process grows by the gradients and
    AdamW state the plan predicts within 10 %. glibc's mmap threshold is fixed at 64 KiB in the measuring
    process, so that every tensor is its own mapping, returned on free: its resident size then counts the
    live tensors, not memory an earlier free left in the heap (with the default, adaptive threshold the
    warm-up's freed gradients are reused and the growth reads ~30 % low)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    m = json.loads(done.stdout.strip().splitlines()[-1])
    assert abs(m["tensors"] - m["predicted_total"]) / m["predicted_total"] < 0.01, m
    assert abs(m["grown"] - m["predicted_growth"]) / m["predicted_growth"] < 0.10, m


def test_a_vllm_share_too_small_for_one_sequence_is_refused():
    plan = make_plan(["experiment=qwen25_3b_cipr", "rollout.gpu_memory_utilization=0.08"], QUICK)
    assert any("vLLM refuses to start" in e and "rollout.gpu_memory_utilization" in e
               for e in plan.findings.errors), plan.findings.errors


def test_a_model_that_does_not_fit_names_the_fixes():
    plan = make_plan(["experiment=qwen35_4b_cipr", "model.call_format=qwen35_xml"],
                     PlanOptions(out="", rows=8, gpu_memory_gb=40))
    (error,) = [e for e in plan.findings.errors if "GB per GPU" in e]
    assert "distributed=zero2" in error and "plan.gpu_memory_gb" in error


# -- batches and lengths ------------------------------------------------------------------------------------


def test_the_batch_arithmetic_of_qwen25_3b_cipr_on_8_gpus():
    plan = make_plan(["experiment=qwen25_3b_cipr", "launcher.num_processes=8", "distributed=zero2"], QUICK)
    b = plan.preflight.batch
    assert (b.grpo.completions_per_step, b.grpo.completions_per_update, b.grpo.gradient_accumulation_steps,
            b.grpo.steps_per_generation) == (4096, 1024, 16, 64)
    assert (b.pairs_per_step, b.pairs_per_update, b.pairs_per_micro_batch) == (512, 128, 1)
    assert b.rounds_per_epoch == b.train_units // 512 and b.optimizer_steps == 15 * b.rounds_per_epoch * 4
    assert b.rollouts == b.rounds * 4096 and b.estimated


@pytest.mark.parametrize("overrides, words", [
    (["launcher.num_processes=3"], ("per_device_train_batch_size", "3 process")),
    (["trainer.per_device_train_batch_size=6"], ("per_device_train_batch_size=6", "multiple of 8")),
    (["data=synthetic", "data.n=40", "data.path=null"], ("one generation batch takes 512", "data.n")),
    (["rollout.tensor_parallel_size=3", "launcher.num_processes=8", "distributed=zero2"],
     ("rollout.tensor_parallel_size=3",)),
    (["distributed=zero3"], ("distributed=zero3", "launcher.num_processes")),
])
def test_every_indivisibility_is_an_error_naming_the_option(overrides, words):
    plan = make_plan(["experiment=qwen25_3b_cipr", *overrides], QUICK)
    assert any(all(w in e for w in words) for e in plan.findings.errors), plan.findings.errors


def test_prompts_over_the_limit_are_a_warning_then_an_error():
    strict = make_plan(["experiment=qwen25_3b_cipr", "trainer.max_prompt_length=1000"], QUICK)
    assert any("trainer.max_prompt_length=1000" in e and "plan.max_left_out" in e
               for e in strict.findings.errors), strict.findings.errors
    lenient = make_plan(["experiment=qwen25_3b_cipr", "trainer.max_prompt_length=1000"],
                        PlanOptions(out="", rows=16, max_left_out=1.0))
    assert lenient.ok, lenient.findings.errors
    assert any("trainer.max_prompt_length=1000" in w for w in lenient.findings.warnings)


def test_length_stats():
    s = length_stats([5, 1, 3, 9, 7], 6)
    assert (s.count, s.p50, s.p95, s.max, s.over) == (5, 5, 9, 9, 2) and s.share == pytest.approx(0.4)
    assert length_stats([], None).count == 0


def test_batch_plan_counts_sft_like_stages():
    from cipr.train.config import compose_train

    cfg = compose_train(["algo=sft", "trainer.max_steps=10", "trainer.per_device_train_batch_size=4",
                         "trainer.gradient_accumulation_steps=2"])
    findings = Findings()
    b = batch_plan(cfg, 100, 2, findings)
    assert (b.stage, b.rows_per_step, b.rounds_per_epoch, b.optimizer_steps) == ("sft", 16, 6, 10)
    assert not findings.errors and b.grpo is None


def test_preflight_refuses_what_cipr_train_would_run_wrong(tiny_tokenizer):
    """cipr-train's own check: the tokenizer in hand, a Qwen3.5 template and hermes calls."""
    import copy

    from cipr.data.synthetic import SyntheticConfig
    from cipr.train.config import compose_train

    examples = SyntheticConfig(n=12, seed=0).generate()
    tok = copy.deepcopy(tiny_tokenizer)
    cfg = compose_train(["model.call_format=hermes", "data.n=12", "data.eval_examples=2"])
    assert not preflight(cfg, tok, examples, world=1, max_left_out=1.0).findings.errors
    tok.chat_template = template_text("qwen3_5_think")
    result = preflight(cfg, tok, examples, world=1, max_left_out=1.0)
    with pytest.raises(ConfigError, match="qwen35_xml"):
        result.findings.check()


def test_cli_prints_the_table_and_writes_plan_json(tmp_path, capsys):
    from cipr.cli.plan import main

    out = tmp_path / "plan.json"
    code = main(["experiment=qwen25_3b_cipr", "launcher.num_processes=8", "distributed=zero2",
                 "plan.rows=8", f"plan.out={out}"])
    printed = capsys.readouterr().out
    assert code == 0 and "FITS" in printed and "ESTIMATE" in printed
    data = json.loads(out.read_text())
    assert data["ok"] and data["memory"]["strategy"] == "zero2" and data["time"]["estimate"]
    code = main(["experiment=qwen35_4b_cipr", "model.call_format=hermes", "plan.rows=8", "plan.out="])
    assert code == 2 and "contradicts" in capsys.readouterr().out
    assert main(["plan.nope=1"]) == 2 and "nope" in capsys.readouterr().err


if __name__ == "__main__":  # the embedded model's measured step, in a fresh process
    print(json.dumps(measure_embedded_step()))
