"""The TRL surface CIPR relies on, pinned: a TRL upgrade that moves any of it fails here, naming what and
where.

CIPR overrides TRL methods (an override must keep TRL's parameters, or TRL's callers break it),
calls TRL helpers, and reads attributes TRL sets in `GRPOTrainer.__init__`. Each entry lists where
CIPR uses it; when this test fails, read TRL's new code at that point before updating the pin.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable
from typing import Any

import pytest
import torch
import trl

TRL_VERSION = "1.16.0"

_GRPO = "cipr/train/grpo.py"
_FAST = "cipr/train/grpo_fast.py"
_EPISODES = "cipr/train/grpo.py _rollout_episodes / _sample_turn (multi-turn episodes)"
_CKPT = "cipr/train/checkpoint.py"
_ROLLOUT = "cipr/train/rollout.py"

# (owner, method, parameters, where CIPR relies on it)
METHODS: list[tuple[str, str, list[str], str]] = [
    ("GRPOTrainer", "__init__",
     ["self", "model", "reward_funcs", "args", "train_dataset", "eval_dataset", "processing_class",
      "reward_processing_classes", "callbacks", "optimizers", "quantization_config", "peft_config", "tools",
      "rollout_func", "environment_factory"],
     f"{_GRPO} CIPRGRPOTrainer._init_trl (reward_funcs=[scorer], the rest by keyword)"),
    ("GRPOTrainer", "_get_train_sampler", ["self", "dataset"], f"{_GRPO} override (PairedRepeatSampler)"),
    ("GRPOTrainer", "_prepare_inputs", ["self", "generation_batch"],
     f"{_GRPO} override (unit shuffle, reads _step / _buffered_inputs)"),
    ("GRPOTrainer", "_generate_and_score_completions", ["self", "inputs"],
     f"{_GRPO} override (attaches cipr_rows: each row's record and rollout)"),
    ("GRPOTrainer", "_generate_single_turn",
     ["self", "prompt_ids", "images", "multimodal_fields", "num_generations", "has_tool_images"],
     f"{_GRPO} override (the rollout source) and {_FAST} GRPOFastPaths override (shared prompt prefill)"),
    ("GRPOTrainer", "_get_per_token_logps_and_entropies",
     ["self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy",
      "compute_aux_loss", "pixel_values", "image_grid_thw", "num_images", "pixel_attention_mask",
      "spatial_shapes", "num_tiles", "image_sizes", "token_type_ids", "mm_token_type_ids",
      "image_position_ids"],
     f"{_FAST} GRPOFastPaths override (folded log-probabilities, completion-only scoring) and _task_logps"),
    ("GRPOTrainer", "compute_loss", ["self", "model", "inputs", "return_outputs", "num_items_in_batch"],
     f"{_GRPO} override, public (TRL's task loss + the consistency objective)"),
    ("GRPOTrainer", "_compute_loss", ["self", "model", "inputs"],
     f"{_GRPO} not overridden: TRL's compute_loss calls it for the task loss"),
    ("GRPOTrainer", "training_step", ["self", "model", "inputs", "num_items_in_batch"],
     f"{_GRPO} relies on it advancing _step once per micro-batch"),
    ("GRPOTrainer", "log", ["self", "logs", "start_time"], f"{_GRPO} override (drops all-NaN metrics)"),
    ("GRPOTrainer", "_save_checkpoint", ["self", "model", "trial"], f"{_CKPT} CheckpointMixin override"),
    ("GRPOTrainer", "_load_optimizer_and_scheduler", ["self", "checkpoint"],
     f"{_CKPT} CheckpointMixin override"),
    ("GRPOTrainer", "_get_output_dir", ["self", "trial"], f"{_CKPT} CheckpointMixin._save_checkpoint"),
    ("SFTTrainer", "compute_loss", ["self", "model", "inputs", "return_outputs", "num_items_in_batch"],
     "cipr/train/sft.py WarmStartTrainer.compute_loss"),
    ("SFTTrainer", "_get_train_sampler", ["self", "train_dataset"],
     "cipr/train/supervised.py SupervisedTrainer override (PairedRepeatSampler; takes the dataset "
     "positionally, as Trainer._get_dataloader passes it)"),
    ("SFTTrainer", "_save_checkpoint", ["self", "model", "trial"], f"{_CKPT} CheckpointMixin override"),
    ("SFTTrainer", "_load_optimizer_and_scheduler", ["self", "checkpoint"],
     f"{_CKPT} CheckpointMixin override"),
    ("GRPOTrainer", "create_model_card", ["self", "model_name", "dataset_name", "tags"],
     f"{_CKPT} CheckpointMixin override (TRL's _save_checkpoint calls it with model_name)"),
    ("SFTTrainer", "create_model_card", ["self", "model_name", "dataset_name", "tags"],
     f"{_CKPT} CheckpointMixin override (TRL's _save_checkpoint calls it with model_name)"),
]

# CheckpointMixin's hooks on transformers' Trainer: DistillTrainer's (cipr/train/distill.py) directly, and the
# GRPO and SFT trainers' where TRL does not override them (_save, _load_from_checkpoint, _run_epoch)
TRAINER_METHODS: list[tuple[str, list[str]]] = [
    ("_save_checkpoint", ["self", "model", "trial"]),
    ("_load_optimizer_and_scheduler", ["self", "checkpoint"]),
    ("_get_output_dir", ["self", "trial"]),
    # every save (step folders, a stage's final/ under FSDP): the override leaves out frozen parameters
    ("_save", ["self", "output_dir", "state_dict"]),
    # a resume's weights: the override puts a checkpoint without its frozen tensors over the base
    ("_load_from_checkpoint", ["self", "resume_from_checkpoint", "model"]),
    # called once per epoch by _inner_training_loop; the override trains nothing past max_steps on a resume
    ("_run_epoch", ["self", "model", "epoch", "train_dataloader", "steps_in_epoch",
                    "num_update_steps_per_epoch", "trial", "ignore_keys_for_eval", "start_time",
                    "resume_from_checkpoint", "epochs_trained", "steps_trained_in_current_epoch"]),
]

# TRL's colocated vLLM generation (trl.generation.vllm_generation.VLLMGeneration), used by
# rollout=vllm_colocate
VLLM_METHODS: list[tuple[str, list[str], str]] = [
    ("sync_weights", ["self"], f"{_ROLLOUT} use_reload_weights replaces it on the instance"),
    ("_iter_named_params", ["self"], f"{_ROLLOUT} push_weights (TRL's gathered, vLLM-named parameters)"),
]
VLLM_ATTRIBUTES: dict[str, str] = {  # set in VLLMGeneration.__init__
    "llm": "push_weights (wake_up, llm_engine, reset_prefix_cache)",
    "mode": "use_reload_weights (colocate vs server)",
    "enable_sleep_mode": "push_weights",
    "_llm_weights_sleeping": "push_weights (cleared after waking the weights)",
    "generation_kwargs": "stop_token_ids",
}


def _functions() -> list[tuple[str, Callable[..., Any], list[str], str]]:
    from trl.kernels.chunked_logprob import _use_triton
    from trl.models import unwrap_model_for_generation
    from trl.trainer.utils import entropy_from_logits, pad, selective_log_softmax, split_tensor_dict

    return [
        ("trl.kernels.chunked_logprob._use_triton", _use_triton, ["device"],
         f"{_FAST} GRPOFastPaths._score_completions_only (where TRL's fused head scores every position)"),
        ("trl.trainer.utils.selective_log_softmax", selective_log_softmax,
         ["logits", "index", "temperature", "row_mask"], f"{_FAST} completion_logps"),
        ("trl.trainer.utils.entropy_from_logits", entropy_from_logits, ["logits", "chunk_size"],
         f"{_FAST} completion_logps"),
        ("trl.models.unwrap_model_for_generation", unwrap_model_for_generation,
         ["model", "accelerator", "gather_deepspeed3_params", "generation_kwargs",
          "gradient_checkpointing_kwargs"],
         f"{_FAST} GRPOFastPaths._generate_single_turn"),
        ("trl.trainer.utils.pad", pad, ["tensors", "padding_value", "padding_side", "pad_to_multiple_of"],
         "cipr/runtime/generation.py sample_shared_prefill"),
        ("trl.trainer.utils.split_tensor_dict", split_tensor_dict, ["tensor_dict", "num_chunks"],
         f"{_GRPO} CIPRGRPOTrainer._prepare_inputs"),
    ]


# attributes GRPOTrainer.__init__ sets that CIPR reads (in cipr/train/grpo.py and grpo_fast.py)
ATTRIBUTES: dict[str, str] = {
    "_step": "_prepare_inputs, extra_state / load_extra_state (micro-step counter)",
    "_buffered_inputs": "_prepare_inputs, extra_state / load_extra_state (the generation batch's "
                        "micro-batches)",
    "_metrics": "_log_rollouts, compute_loss, log (metric lists by mode)",
    "_entropy_bonus_enabled": "_fold_rows (folding needs no entropy term)",
    "_dist": "GRPOFastPaths._generate_single_turn (summon_full_params)",
    "_tokenizer": "GRPOFastPaths._generate_single_turn (pad id)",
    "eos_token_ids": "_generate_single_turn, _init_trl",
    "num_generations": "__init__, _get_train_sampler",
    "num_iterations": "_get_train_sampler, _prepare_inputs, extra_state",
    "shuffle_dataset": "_get_train_sampler",
    "top_entropy_quantile": "_fold_rows",
    "aux_loss_enabled": "_fold_rows (TRL adds the MoE load-balancing loss from its own forward)",
    "temperature": "compute_loss (temperature of the folded read's token log-probabilities)",
    "use_vllm": "_init_trl, _generate_single_turn",
    "use_transformers_continuous_batching": "_generate_single_turn",
    "generation_config": "_generate_single_turn, _sample_turn (a turn's max_new_tokens)",
    "generation_kwargs": "_generate_single_turn, _sample_turn (a turn's max_new_tokens)",
    "rollout_func": "__init__ (rollout.mode=multi_turn passes _rollout_episodes)",
    "accelerator": "_sync_max (the episode rounds' lock step)",
}

# GRPOConfig fields CIPR reads through self.args
CONFIG_FIELDS: dict[str, str] = {
    "steps_per_generation": "_prepare_inputs, extra_state",
    "generation_batch_size": "__init__, _get_train_sampler",
    "per_device_train_batch_size": "__init__",
    "seed": "_get_train_sampler, Relabeling.of (the relabel seed when perturb.relabel.seed is null)",
    "ds3_gather_for_generation": "_generate_single_turn",
    "gradient_checkpointing_kwargs": "_generate_single_turn",
    "use_vllm": "_init_trl",
    "vllm_mode": "_init_trl",
}


def _moved(what: str, where: str, detail: str) -> str:
    return f"TRL {trl.__version__} moved {what} ({detail}); CIPR relies on it in {where}"


def test_trl_version_is_the_pinned_one():
    assert trl.__version__ == TRL_VERSION, (
        f"TRL is {trl.__version__}, the seam was checked against {TRL_VERSION}: run this file, read TRL's "
        "changes at every entry it names, then update TRL_VERSION")


@pytest.mark.parametrize(("owner", "name", "params", "where"), METHODS,
                         ids=[f"{o}.{n}" for o, n, _, _ in METHODS])
def test_trl_method_signature(owner, name, params, where):
    cls = getattr(trl, owner)
    method = getattr(cls, name, None)
    assert callable(method), _moved(f"{owner}.{name}", where, "it no longer exists")
    found = list(inspect.signature(method).parameters)
    assert found == params, _moved(f"{owner}.{name}", where, f"parameters {found}, pinned {params}")


def test_trl_function_signatures():
    for qualname, fn, params, where in _functions():
        found = list(inspect.signature(fn).parameters)
        assert found == params, _moved(qualname, where, f"parameters {found}, pinned {params}")


def test_compute_loss_gets_log_probs_through_the_overridden_hook():
    from trl import GRPOTrainer

    assert "self._compute_loss(model, inputs)" in inspect.getsource(GRPOTrainer.compute_loss), _moved(
        "GRPOTrainer.compute_loss", f"{_GRPO} CIPRGRPOTrainer.compute_loss",
        "it no longer computes the task loss through self._compute_loss")
    source = inspect.getsource(GRPOTrainer._compute_loss)
    assert "self._get_per_token_logps_and_entropies(" in source and "compute_entropy=" in source, _moved(
        "GRPOTrainer._compute_loss", f"{_GRPO} CIPRGRPOTrainer._get_per_token_logps_and_entropies",
        "it no longer scores tokens through "
        "self._get_per_token_logps_and_entropies(..., compute_entropy=...), so folded log-probabilities "
        "would be ignored")


def test_training_step_advances_the_micro_step():
    from trl import GRPOTrainer

    assert "self._step += 1" in inspect.getsource(GRPOTrainer.training_step), _moved(
        "GRPOTrainer.training_step", f"{_GRPO} _prepare_inputs / extra_state",
        "it no longer advances self._step")


def test_vllm_generation_is_set_by_the_constructor():
    from trl import GRPOTrainer

    assert "self.vllm_generation = " in inspect.getsource(GRPOTrainer.__init__), _moved(
        "GRPOTrainer.vllm_generation", f"{_GRPO} _init_trl", "GRPOTrainer.__init__ no longer sets it")


def test_config_fields():
    from trl import GRPOConfig

    fields = GRPOConfig.__dataclass_fields__
    missing = [f"{name} (used in {_GRPO} {where})"
               for name, where in CONFIG_FIELDS.items() if name not in fields]
    assert not missing, f"TRL {trl.__version__} GRPOConfig lost fields CIPR reads: {missing}"


def test_constructed_trainer_has_the_attributes_cipr_reads(tiny_model, tiny_tokenizer, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=4, report_to="none", use_cpu=True, bf16=False, disable_tqdm=True)
    trainer = GRPOTrainer(model=tiny_model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                          args=args, train_dataset=Dataset.from_list([{"prompt": "a b"}] * 4),
                          processing_class=tiny_tokenizer)
    missing = [f"{name} (used in {_GRPO} {where})"
               for name, where in ATTRIBUTES.items() if not hasattr(trainer, name)]
    assert not missing, f"TRL {trl.__version__} GRPOTrainer no longer sets attributes CIPR reads: {missing}"
    assert callable(getattr(trainer._dist, "summon_full_params", None)), _moved(
        "GRPOTrainer._dist.summon_full_params", f"{_GRPO} _generate_single_turn", "it no longer exists")
    assert trainer._step == 0 and trainer._buffered_inputs is None
    assert set(trainer._metrics) == {"train", "eval"} and \
        isinstance(trainer.eos_token_ids, list | tuple | torch.Tensor)


@pytest.mark.parametrize(("name", "params"), TRAINER_METHODS, ids=[n for n, _ in TRAINER_METHODS])
def test_transformers_trainer_checkpoint_hooks(name, params):
    import transformers

    found = list(inspect.signature(getattr(transformers.Trainer, name)).parameters)
    assert found == params, (f"transformers {transformers.__version__} moved Trainer.{name} (parameters "
                             f"{found}, pinned {params}); CIPR relies on it in {_CKPT} CheckpointMixin "
                             "(every trainer)")


def test_private_names_the_sft_side_reads():
    """`CheckpointMixin.create_model_card` names the trainer by TRL's class attribute `_name`; the supervised
    regime's trainer (an SFTTrainer) logs through TRL's `_metrics` and gets its sampler from transformers'
    `_get_dataloader`, which passes the dataset positionally (the override names it `dataset`)."""
    from transformers import Trainer
    from trl import GRPOTrainer, SFTTrainer

    assert (GRPOTrainer._name, SFTTrainer._name) == ("GRPO", "SFT"), _moved(
        "GRPOTrainer._name / SFTTrainer._name", f"{_CKPT} CheckpointMixin.create_model_card", "renamed")
    assert "self._metrics = " in inspect.getsource(SFTTrainer.__init__), _moved(
        "SFTTrainer._metrics", "cipr/train/supervised.py SupervisedTrainer.log / _log",
        "SFTTrainer.__init__ no longer sets it")
    assert "sampler_fn(dataset)" in inspect.getsource(Trainer._get_dataloader), (
        "transformers' Trainer._get_dataloader no longer calls sampler_fn(dataset) positionally; "
        "cipr/train/supervised.py SupervisedTrainer._get_train_sampler names its parameter `dataset`")


def test_vllm_generation_surface():
    from trl.generation import vllm_generation

    cls = vllm_generation.VLLMGeneration
    for name, params, where in VLLM_METHODS:
        method = getattr(cls, name, None)
        assert callable(method), _moved(f"VLLMGeneration.{name}", where, "it no longer exists")
        found = list(inspect.signature(method).parameters)
        assert found == params, \
            _moved(f"VLLMGeneration.{name}", where, f"parameters {found}, pinned {params}")
    init = inspect.getsource(cls.__init__) + inspect.getsource(cls)
    missing = [f"{a} (used in {_ROLLOUT} {w})"
               for a, w in VLLM_ATTRIBUTES.items() if f"self.{a} = " not in init]
    assert not missing, \
        f"TRL {trl.__version__} VLLMGeneration no longer sets attributes CIPR reads: {missing}"
    assert callable(getattr(vllm_generation, "empty_cache", None)) and not inspect.signature(
        vllm_generation.empty_cache).parameters, _moved(
        "trl.generation.vllm_generation.empty_cache", f"{_ROLLOUT} push_weights",
        "it is gone or takes arguments")


def test_colocated_engine_is_built_through_the_module_level_llm(monkeypatch):
    """`eager_engine` passes `enforce_eager` and the engine's memory options by replacing
    `trl.generation.vllm_generation.LLM` around TRL's constructor: TRL must build the engine through that
    module-level name with the keywords the memory sizing reads, and pass no `enforce_eager` of its own.
    Checked on TRL's source, then the patch on a stand-in (no vLLM needed)."""
    from trl.generation import vllm_generation

    import cipr.runtime.vllm_engine as engine
    from cipr.train.rollout import eager_engine

    init = inspect.getsource(vllm_generation.VLLMGeneration)
    assert "self.llm = LLM(" in init and "enforce_eager" not in init, _moved(
        "VLLMGeneration's engine construction", f"{_ROLLOUT} eager_engine",
        "it no longer calls the module-level LLM(...), or passes enforce_eager itself")
    for keyword in ("model=", "max_model_len=", "max_num_seqs=", "gpu_memory_utilization="):
        assert keyword in init, _moved("VLLMGeneration's LLM(...) keywords", f"{_ROLLOUT} eager_engine",
                                       f"it no longer passes {keyword}")
    calls: list[dict[str, Any]] = []

    def fake_llm(**kwargs: Any) -> None:
        calls.append(kwargs)

    monkeypatch.setattr(vllm_generation, "LLM", fake_llm, raising=False)
    monkeypatch.setattr(engine, "engine_memory",
                        lambda model, length, seqs, share: {"kv_cache_memory_bytes": seqs})
    for choice in (True, False):
        with eager_engine(choice):
            vllm_generation.LLM(model="m", max_num_seqs=3)
        assert vllm_generation.LLM is fake_llm  # restored
    with pytest.raises(RuntimeError), eager_engine(True):
        raise RuntimeError("TRL's constructor failed")
    assert vllm_generation.LLM is fake_llm
    assert calls == [{"model": "m", "max_num_seqs": 3, "kv_cache_memory_bytes": 3, "enforce_eager": choice}
                     for choice in (True, False)]


def test_trainer_syncs_vllm_weights_through_the_instance_method():
    from trl import GRPOTrainer

    assert "self.vllm_generation.sync_weights()" in inspect.getsource(GRPOTrainer), _moved(
        "GRPOTrainer's weight sync", f"{_ROLLOUT} use_reload_weights",
        "it no longer calls self.vllm_generation.sync_weights(), so the colocated push would be skipped")


def test_rollout_func_carries_the_episodes_mask_and_fields(tiny_model, tiny_tokenizer, tmp_path):
    """Multi-turn episodes ride on TRL's `rollout_func`: TRL calls it with the generation batch's prompts, one
    per row and in row order (the trainer maps them back to its rows), takes one completion per row, turns
    `env_mask` into the batch's `tool_mask`, hands every other field to the reward functions row by row, and
    its loss masks with completion_mask * tool_mask. Checked on a stock trainer, end to end."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    seen: dict[str, Any] = {}

    def rollout(prompts, trainer):
        seen["prompts"] = list(prompts)
        seen["trainer"] = trainer
        completion = [[5, 6, 7, 8, tiny_tokenizer.eos_token_id] for _ in prompts]
        return {"prompt_ids": [[3, 4] for _ in prompts], "completion_ids": completion, "logprobs": None,
                "env_mask": [[1, 0, 0, 1, 1] for _ in prompts],
                "cipr_episode": [f"e{i}" for i in range(len(prompts))]}

    def reward(completions, cipr_episode, row_id, **_):
        seen["fields"] = list(zip(cipr_episode, row_id, strict=True))
        return [float(i) for i in row_id]

    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=2,
                      max_completion_length=8, report_to="none", use_cpu=True, bf16=False, disable_tqdm=True)
    rows = [{"prompt": f"p{i}", "row_id": i} for i in range(2)]
    trainer = GRPOTrainer(model=tiny_model, reward_funcs=reward, args=args, rollout_func=rollout,
                          train_dataset=Dataset.from_list(rows * 2), processing_class=tiny_tokenizer)
    batch = [rows[0], rows[0], rows[1], rows[1]]
    out = trainer._generate_and_score_completions([dict(r) for r in batch])
    assert seen["prompts"] == ["p0", "p0", "p1", "p1"] and seen["trainer"] is trainer, _moved(
        "GRPOTrainer._generate's rollout_func call", _EPISODES, f"it got {seen['prompts']}")
    assert seen["fields"] == [("e0", 0), ("e1", 0), ("e2", 1), ("e3", 1)], _moved(
        "the rollout_func's extra fields", _EPISODES, "they no longer reach the reward function row by row")
    assert out["tool_mask"].tolist() == [[1, 0, 0, 1, 1]] * 4, _moved(
        "the rollout_func's env_mask", _EPISODES, "it no longer becomes the batch's tool_mask")
    source = inspect.getsource(GRPOTrainer._compute_loss)
    assert 'completion_mask * inputs["tool_mask"]' in source, _moved(
        "GRPOTrainer._compute_loss", _EPISODES, "its loss mask no longer multiplies tool_mask in, so "
        "observation tokens would be trained on")


def test_generation_budget_is_read_at_every_call():
    """`_sample_turn` bounds one turn by setting `generation_config.max_new_tokens` (HF) and
    `VLLMGeneration.max_completion_length` (vLLM) around `_generate_single_turn`: both are read per call."""
    from trl import GRPOTrainer
    from trl.generation import vllm_generation

    hf = inspect.getsource(GRPOTrainer._generate_single_turn)
    assert "generation_config=self.generation_config" in hf, _moved(
        "GRPOTrainer._generate_single_turn", _EPISODES, "it no longer generates with self.generation_config")
    vllm = inspect.getsource(vllm_generation.VLLMGeneration.generate)
    assert "max_completion_length = self.max_completion_length" in vllm, _moved(
        "VLLMGeneration.generate", _EPISODES, "it no longer reads self.max_completion_length per call")


def test_completion_scoring_matches_trls_fused_head(tiny_tokenizer, tmp_path):
    """Off Triton, CIPR scores only the completion positions (`completion_logps`); TRL's fused head scores
    every position. Same log-probabilities, entropies and gradients, at a sampling temperature."""
    from datasets import Dataset
    from support.tiny_models import tiny_model
    from trl import GRPOConfig, GRPOTrainer

    from cipr.train.grpo import CIPRGRPOTrainer

    model = tiny_model(tiny_tokenizer)  # its own float32 model: the backward below changes its gradients
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2,
                      max_completion_length=4, report_to="none", use_cpu=True, bf16=False, disable_tqdm=True,
                      temperature=0.7)
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions),
                          args=args, train_dataset=Dataset.from_list([{"prompt": "a b"}] * 4),
                          processing_class=tiny_tokenizer)
    # a stock trainer with CIPR's scoring methods bound to it: TRL's and CIPR's scoring side by side
    trainer._score_completions_only = types.MethodType(CIPRGRPOTrainer._score_completions_only, trainer)
    # as TRL's _compute_loss calls
    call = {"compute_entropy": True, "compute_aux_loss": False, "pixel_values": None}
    assert trainer._score_completions_only(trainer.model, (), call)
    assert not trainer._score_completions_only(trainer.model, (), {**call, "compute_aux_loss": True})
    assert not trainer._score_completions_only(trainer.model, (), {**call, "pixel_values": torch.zeros(1)})
    torch.manual_seed(0)
    ids = torch.randint(3, 200, (3, 11))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    results = []
    for score in (GRPOTrainer._get_per_token_logps_and_entropies,
                  CIPRGRPOTrainer._get_per_token_logps_and_entropies):
        trainer.model.zero_grad()
        trainer._given_task_logps = None
        logps, entropies, _ = score(trainer, trainer.model, ids, mask, 5, batch_size=2, **call)
        (logps * torch.linspace(-1, 1, 5)).sum().backward()
        results.append((logps, entropies,
                        [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]))
    (trl_logps, trl_ent, trl_grads), (ours, ent, grads) = results
    assert ours.shape == (3, 5) and ent.shape == (3, 5)
    torch.testing.assert_close(ours, trl_logps, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ent, trl_ent, rtol=1e-4, atol=1e-5)
    assert len(grads) == len(trl_grads) > 0
    for got, want in zip(grads, trl_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-6)


# --- the sharding seam (cipr/train/strategy.py, cipr/method/actions.py, cipr/train/checkpoint.py, the
# distributed tier's shim tests/support/cpu_sharding.py): accelerate, torch and DeepSpeed names it relies on


def test_accelerate_still_drops_fsdp_and_deepspeed_on_cpu_processes():
    """The shim and the strategy check exist because of these two conditions in AcceleratorState.__init__;
    when accelerate changes them, re-check cipr/train/strategy.py's refusal and
    tests/support/cpu_sharding.py."""
    from accelerate.state import AcceleratorState

    source = inspect.getsource(AcceleratorState.__init__)
    assert '"ACCELERATE_USE_DEEPSPEED", "false").lower() == "true" and not cpu' in source
    assert "DistributedType.MULTI_GPU," in source and "self.distributed_type = DistributedType.FSDP" in source
    assert callable(AcceleratorState._reset_state)


def test_accelerate_names_the_strategy_check_reads():
    from accelerate.utils import (
        DeepSpeedPlugin,
        DistributedType,
        FullyShardedDataParallelPlugin,
        gather_object,
    )

    assert {"NO", "MULTI_CPU", "MULTI_GPU", "FSDP", "DEEPSPEED"} <= set(DistributedType.__members__)
    assert "fsdp_version" in inspect.signature(FullyShardedDataParallelPlugin).parameters
    assert hasattr(DeepSpeedPlugin, "zero_stage") or \
        "zero_stage" in inspect.signature(DeepSpeedPlugin).parameters
    assert list(inspect.signature(gather_object).parameters) == ["object"]


def test_torch_names_the_reader_and_the_resume_rely_on():
    from torch.distributed.fsdp import FSDPModule, fully_shard  # noqa: F401 - cipr/method/action_forward.py _sharded
    from torch.distributed.tensor import DTensor

    assert callable(DTensor.full_tensor)
    assert list(inspect.signature(torch.serialization.register_package).parameters) == [
        "priority", "tagger", "deserializer"]  # cipr/train/checkpoint.py restore_indexed_cpu_locations


def test_transformers_loads_the_optimizer_of_a_multi_process_run_at_args_device():
    """Why restore_indexed_cpu_locations exists (accelerate gives CPU processes 'cpu:N')."""
    from transformers import Trainer, TrainingArguments

    assert "map_location = self.args.device if self.args.world_size > 1" in inspect.getsource(
        Trainer._load_optimizer_and_scheduler)
    fields = TrainingArguments.__dataclass_fields__
    assert {"fsdp", "fsdp_config", "deepspeed", "average_tokens_across_devices", "optim_args"} <= set(fields)


@pytest.mark.distributed
def test_deepspeed_names_the_reader_and_its_test_rely_on():
    import deepspeed
    from deepspeed.utils import safe_get_full_grad

    assert deepspeed.__version__ == "0.19.8"
    assert list(inspect.signature(safe_get_full_grad).parameters) == ["param"]
    from deepspeed.runtime.zero.partition_parameters import Init

    # cipr/method/action_forward.py _sharded
    assert "ds_id" in inspect.getsource(Init._convert_to_deepspeed_param)
