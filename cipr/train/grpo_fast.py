"""The GRPO trainer's performance paths, in one place a reader of `cipr.train.grpo` can skip: each gives the
numbers TRL's own path gives (tested) in less time or memory, and each is on only where it applies.

- Folded action read (`algo.fold_action_read`; off under vLLM's importance-sampling correction): TRL's fused
  LM head never exposes logits, so one forward of `read_actions(..., response_logprobs=True)` gives both the
  completion tokens' log-probabilities (at the sampling temperature, as TRL scores them) and the action
  distributions, from the same logits. It holds for rows whose re-tokenized prompt and decoded completion give
  back the ids the loss uses (`_fold_rows`); TRL's forward scores the others (`_task_logps`;
  `actions/folded` logs the fraction folded). The log-probabilities reach TRL's loss through
  `_get_per_token_logps_and_entropies`, which TRL's `_compute_loss` calls with fixed arguments:
  `given_task_logps` holds them for that one call and clears them on exit (also on error);
  tests/test_trl_contract.py pins that TRL still scores through it. TRL's token entropy needs full logits and
  is logged as missing on the folded path (the action entropy is logged instead); an entropy-dependent loss or
  a MoE load-balancing loss turns folding off.
- Completion-only scoring: off Triton devices TRL's fused head projects every position (prompt included) onto
  the vocabulary, backward included; `completion_logps` projects the completion only, in TRL's micro-batches
  (text-only batches whose model takes `logits_to_keep`).
- Shared prefill (`rollout.share_prompt_prefill`): HF generation runs each distinct prompt's prefill once for
  its G completions (`cipr.runtime.generation.sample_shared_prefill`); vLLM, continuous batching and
  multimodal inputs use TRL's path.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from trl import GRPOTrainer
from trl.models import unwrap_model_for_generation

from cipr.method.actions import ActionQuery, ActionReading
from cipr.runtime.generation import consecutive_runs, sample_shared_prefill


def completion_logps(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                     temperature: float, compute_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities [B, C] of the last C = `logits_to_keep` tokens of `input_ids` [B, T] at
    `temperature`, and their entropies [B, C] if asked, from logits at those positions only (module
    docstring). Same values as TRL's (tested)."""
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep + 1,
                use_cache=False)
    logits = out.logits[:, :-1] / temperature
    logps = selective_log_softmax(logits, input_ids[:, -logits_to_keep:])
    return logps, entropy_from_logits(logits) if compute_entropy else None


class GRPOFastPaths(GRPOTrainer):
    """The performance paths of `CIPRGRPOTrainer` (module docstring), as overrides of TRL's methods and the
    folded read's hooks (`_fold_rows`, `_folded`) its loss calls."""

    _fold_allowed: bool = True
    _share_prefill: bool = True
    _given_task_logps: torch.Tensor | None = None

    # -- shared prefill ----------------------------------------------------------------------------
    def _generate_single_turn(self, prompt_ids: Any, images: Any, multimodal_fields: Any,
                              num_generations: int, has_tool_images: bool = False) -> Any:
        runs = consecutive_runs(prompt_ids)
        distinct = len(runs) == len(prompt_ids)
        if self.accelerator.num_processes > 1:  # one path on every process: ZeRO-3's generation is collective
            distinct = bool(self._sync_max([int(distinct)])[0])  # type: ignore[attr-defined]
        if (not self._share_prefill or self.use_vllm or self.use_transformers_continuous_batching or images
                or multimodal_fields or distinct):
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)
        with (unwrap_model_for_generation(self.model_wrapped, self.accelerator,
                                          gather_deepspeed3_params=self.args.ds3_gather_for_generation,
                                          generation_kwargs=self.generation_kwargs,
                                          gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs)
              as unwrapped, torch.no_grad(),
              self._dist.summon_full_params(self.model_wrapped, recurse=False)):
            completions = sample_shared_prefill(unwrapped, runs, self._tokenizer.pad_token_id,
                                                self.eos_token_ids, self.generation_config,
                                                self.accelerator.device)
        return completions, None

    # -- token scoring -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def given_task_logps(self, logps: torch.Tensor) -> Iterator[None]:
        """Inside, `_compute_loss` takes the completion-token log-probs from `logps`, not a forward."""
        if self._given_task_logps is not None:
            raise RuntimeError("given_task_logps does not nest: one set of log-probabilities per loss call")
        self._given_task_logps = logps
        try:
            yield
        finally:
            self._given_task_logps = None

    def _get_per_token_logps_and_entropies(self, model: Any, input_ids: torch.Tensor,
                                           attention_mask: torch.Tensor, logits_to_keep: int, *args: Any,
                                           **kwargs: Any) -> Any:
        """TRL's token scoring, or inside `given_task_logps` the given log-probs (entropies NaN).
        Off Triton devices, text-only batches go to `completion_logps`, in TRL's micro-batches."""
        logps = self._given_task_logps
        if logps is None:
            if self._score_completions_only(model, args, kwargs):
                size = kwargs.get("batch_size") or input_ids.size(0)
                parts = [completion_logps(model, input_ids[i:i + size], attention_mask[i:i + size],
                                          logits_to_keep, self.temperature,
                                          bool(kwargs.get("compute_entropy")))
                         for i in range(0, input_ids.size(0), size)]
                entropies = torch.cat([e for _, e in parts]) if kwargs.get("compute_entropy") else None
                return torch.cat([lp for lp, _ in parts]), entropies, None
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask,
                                                              logits_to_keep, *args, **kwargs)
        if logps.shape != (input_ids.size(0), logits_to_keep):
            raise RuntimeError(f"given log-probabilities {tuple(logps.shape)} do not match the scored batch "
                               f"({input_ids.size(0)}, {logits_to_keep})")
        entropies = torch.full_like(logps, float("nan")) if kwargs.get("compute_entropy") else None
        return logps, entropies, None

    def _score_completions_only(self, model: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether `completion_logps` scores this call: off Triton devices, text only, no MoE aux loss."""
        from trl.kernels.chunked_logprob import _use_triton

        if args or kwargs.get("compute_aux_loss") or _use_triton(torch.device(self.accelerator.device)):
            return False
        if any(v is not None for k, v in kwargs.items()
               if k not in ("batch_size", "compute_entropy", "compute_aux_loss")):
            return False
        unwrapped = self.accelerator.unwrap_model(model)
        base = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped  # PEFT
        forward = getattr(base, "forward", None)
        return forward is not None and "logits_to_keep" in inspect.signature(forward).parameters

    # -- the folded read -----------------------------------------------------------------------------
    def _fold_rows(self, inputs: dict[str, Any], queries: Sequence[ActionQuery]) -> list[bool] | None:
        """Per row, whether re-tokenizing it gives exactly the prompt and completion ids the loss uses.
        None when folding is off: by config, under vLLM importance-sampling correction, or with an
        entropy-dependent loss (needs TRL's token entropies) or a MoE load-balancing loss (TRL's forward)."""
        if not (self.algo.fold_action_read and self._fold_allowed) or self.top_entropy_quantile < 1.0 \
                or self._entropy_bonus_enabled or self.aux_loss_enabled:
            return None
        tok = self.processing_class
        prompts = tok([q.prompt for q in queries], add_special_tokens=False)["input_ids"]
        responses = tok([q.response for q in queries], add_special_tokens=False)["input_ids"]
        out = []
        for b in range(len(queries)):
            prompt = inputs["prompt_ids"][b][inputs["prompt_mask"][b].bool()].tolist()
            completion = inputs["completion_ids"][b][inputs["completion_mask"][b].bool()].tolist()
            out.append(prompts[b] == prompt and responses[b] == completion)
        return out

    def _folded(self, model: Any, inputs: dict[str, Any], reading: ActionReading,
                fold: Sequence[bool] | None) -> contextlib.AbstractContextManager[None]:
        """Around TRL's loss: the folded read's token log-probabilities where rows fold (else nothing)."""
        if fold is None or not any(fold):
            return contextlib.nullcontext()
        return self.given_task_logps(self._task_logps(model, inputs, reading.response_logprobs, fold))

    def _task_logps(self, model: Any, inputs: dict[str, Any], logps: torch.Tensor, rows: Sequence[bool]
                    ) -> torch.Tensor:
        """Completion-token log-probs: the folded read's where a row matched, TRL's forward elsewhere."""
        width = inputs["completion_ids"].size(1)
        if logps.size(1) < width:
            logps = torch.nn.functional.pad(logps, (0, width - logps.size(1)))
        logps = logps[:, :width]
        missing = [b for b, ok in enumerate(rows) if not ok]
        if missing:
            idx = torch.tensor(missing, dtype=torch.long, device=logps.device)
            ids = torch.cat([inputs["prompt_ids"][idx], inputs["completion_ids"][idx]], dim=1)
            mask = torch.cat([inputs["prompt_mask"][idx], inputs["completion_mask"][idx]], dim=1)
            own, _, _ = super()._get_per_token_logps_and_entropies(model, ids, mask, width)
            logps = logps.index_copy(0, idx, own.to(logps.dtype))
        return logps
