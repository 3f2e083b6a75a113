"""CIPR on TRL 1.16's GRPOTrainer: paired batches, rollouts under both interfaces, consistency terms.

`CIPRGRPOTrainer` subclasses `trl.GRPOTrainer` at TRL's extension points:
- `_get_train_sampler`: `PairedRepeatSampler` keeps a canonical prompt and its perturbed copy (one
  unit) in the same generation batch (TRL's sampler shuffles rows).
- `_prepare_inputs`: whole units (a prompt's G completions, and its copy's G when paired) are shuffled
  and the cut into micro-batches falls on unit boundaries, so a micro-batch holds whole pairs (TRL
  shuffles row by row).
- `_generate_and_score_completions`: attaches each row's prompt record and scored rollout (`BatchRow`,
  `cipr_rows`: the pair reaches the loss with the batch) and logs rollout metrics.
- `compute_loss` (TRL's public one): TRL's GRPO task loss on every row (both interfaces) plus the
  consistency objective's terms (`cipr.method.objective`: for `algo=cipr` λ_rescore·KL_rescore +
  λ_rollout·KL_rollout, or a user's terms) divided by the gradient-accumulation steps as TRL scales its
  own loss. docs/method.md ("TRL seam") lists every private method still overridden and why.

Action reads. TRL's fused LM head never exposes logits, so with `algo.fold_action_read` one forward of
`cipr.method.actions.read_actions(..., response_logprobs=True)` gives both the completion token
log-probabilities (at the sampling temperature, as TRL scores them) and the action distributions of both
interfaces (at temperature 1), from the same logits. The reader tokenizes text, so this holds for rows whose
re-tokenized prompt and decoded completion give back the ids the loss uses; TRL's own forward scores the other
rows (`actions/folded` logs the fraction folded). The folded log-probabilities reach TRL's loss through
`_get_per_token_logps_and_entropies`, which TRL's `_compute_loss` (called by its `compute_loss`) calls with
fixed arguments: `given_task_logps(logps)` holds them for that one call and clears them on exit (also on
error); `tests/test_trl_contract.py` pins that TRL still scores through it. TRL's token entropy needs full
logits and is logged as missing on the folded path; the action entropy is logged instead. The rescoring term
always needs a second forward over the relabeled canonical rollouts (x̃, ỹ) (`cipr.method.relabel`).

Multi-turn episodes (`rollout.mode=multi_turn`, `cipr.train.episodes`) go through TRL's `rollout_func`
hook: TRL hands it the generation batch's prompts (after syncing vLLM's weights) and takes back prompt ids,
completion ids, sampler log-probabilities, `env_mask` (TRL multiplies it into the loss mask: observation
tokens are never trained on) and extra per-row fields, which reach the reward function (`cipr_episode`).
The trainer keeps the batch's rows while TRL calls it (TRL passes the prompts only) and gives the loop
`_sample_turn` (`_generate_single_turn` with the turn's token budget), so HF and vLLM sample every turn
through TRL's own generation code. TRL's `tools=` / `environment_factory` hooks are not used: they declare
one tool list for the run (or one per named environment), never one per sample, take the tool names from
Python method names (no adapter between an episode's names and the environment's), parse calls with the
chat template's response schema (SmolLM2's ChatML has none; CIPR's call formats parse themselves), and end
an episode at the first answer (no next user turn). Each episode is one response to the consistency
terms: its decisions are every turn's, read on the multi-turn context; the rollout term is turn-aligned and
the rescoring term relabels every turn (`cipr.train.episode_terms`, weighting stated there).

Choices the paper leaves open:
- Decisions in sampled text are those the call format finds (`CallFormat.decisions`); a response
  with none (cut off before any call or answer) adds no term. A pair enters the rollout term only
  when both sides have a response with a decision; the rest are counted in `consistency/pairs_skipped`.
- Rescoring uses the canonical rollouts only (the paper's y is a response to the canonical x), with
  fresh `function_XX` names drawn per step and response (`cipr.method.objective.relabel_seed`); a rollout
  whose decisions do not survive relabeling is counted in `consistency/relabel_failures` and skipped.
- Both terms follow `cipr.method.consistency` defaults: canonical side as reference (detached unless
  `algo.detach_reference=false`), KL(canonical || other), each response weighted once. The KLs are
  evaluated in float64 on rows renormalized to sum to 1 (`exact`): float32 rows sum to 1 only within
  ~1e-7, which makes the KL of two nearly equal distributions come out slightly negative.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from trl import GRPOTrainer
from trl.models import unwrap_model_for_generation
from trl.trainer.utils import split_tensor_dict

from cipr.formats.base import CallFormat
from cipr.method.actions import ActionQuery, ActionReaderConfig, read_actions
from cipr.method.objective import Objective, Pairs, relabel_seed, rescore_pairs, rollout_pairs
from cipr.method.pairing import decision_rows, rollout_index
from cipr.method.relabel import RelabelConfig, relabel
from cipr.runtime.generation import consecutive_runs, sample_shared_prefill
from cipr.train.algo import AlgoConfig
from cipr.train.checkpoint import CheckpointMixin, check_finite
from cipr.train.data import PromptSet
from cipr.train.episode_terms import relabel_episode, turn_index
from cipr.train.episodes import EpisodeRunner, EpisodeScorer, episode_metrics, episode_totals
from cipr.train.reward import BatchRow, RolloutScorer
from cipr.train.rollout import (
    check_vllm_loadable,
    eager_engine,
    server_sync_error,
    stop_token_ids,
    use_reload_weights,
)
from cipr.train.sampler import PairedRepeatSampler


def shuffle_units(batch: dict[str, Any], unit_rows: int,
                  generator: torch.Generator | None = None) -> dict[str, Any]:
    """Permute a generation batch in blocks of `unit_rows` consecutive rows (whole groups/pairs)."""
    first = next(v for v in batch.values() if v is not None and (isinstance(v, list) or v.ndim > 0))
    rows = len(first)
    if rows % unit_rows:
        raise ValueError(f"a generation batch of {rows} rows is not made of whole units of {unit_rows} rows")
    units = torch.randperm(rows // unit_rows, generator=generator)
    order = (units[:, None] * unit_rows + torch.arange(unit_rows)[None, :]).reshape(-1)

    def permute(v: Any) -> Any:
        if v is None or (isinstance(v, torch.Tensor) and v.ndim == 0):
            return v
        if isinstance(v, torch.Tensor):
            return v[order.to(v.device)]
        return [v[i] for i in order.tolist()]

    return {k: permute(v) for k, v in batch.items()}


def completion_logps(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int,
                     temperature: float, compute_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities [B, C] of the last C = `logits_to_keep` tokens of `input_ids` [B, T] at
    `temperature`, and their entropies [B, C] if asked, from logits at those positions only.

    Where Triton is absent TRL's fused head projects every position (prompt included) onto the
    vocabulary, backward included; this projects the completion only. Same values as TRL's (tested).
    """
    from trl.trainer.utils import entropy_from_logits, selective_log_softmax

    out = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep + 1,
                use_cache=False)
    logits = out.logits[:, :-1] / temperature
    logps = selective_log_softmax(logits, input_ids[:, -logits_to_keep:])
    return logps, entropy_from_logits(logits) if compute_entropy else None


def action_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each row of [D, A] action distributions."""
    p = probs.detach().clamp_min(0)
    return -(torch.xlogy(p, p)).sum(-1)


class CIPRGRPOTrainer(CheckpointMixin, GRPOTrainer):
    """GRPO with paired interfaces and CIPR's consistency terms (module docstring)."""

    def __init__(self, *args: Any, prompts: PromptSet, scorer: RolloutScorer | EpisodeScorer,
                 algo: AlgoConfig, fmt: CallFormat, objective: Objective | None = None,
                 relabel_config: RelabelConfig | None = None, fold_allowed: bool = True,
                 share_prefill: bool = True,
                 vllm_enforce_eager: bool | None = None,
                 sample_log: Callable[[int, list[dict[str, Any]]], None] | None = None,
                 samples_per_step: int = 0, episodes: EpisodeRunner | None = None, **kwargs: Any) -> None:
        self.prompt_set = prompts
        self.episodes = episodes
        self._episode_rows: list[int] | None = None
        if episodes is not None:
            kwargs["rollout_func"] = self._rollout_episodes
        self._sample_log = sample_log
        self._samples_per_step = samples_per_step
        self.scorer = scorer
        self.algo = algo
        self.fmt = fmt
        self.consistency = objective or Objective([])
        self.relabel_config = relabel_config or RelabelConfig()
        self._cipr_sampler: PairedRepeatSampler | None = None
        self._given_task_logps: torch.Tensor | None = None
        self._fold_allowed = fold_allowed
        self._share_prefill = share_prefill
        self._vllm_enforce_eager = vllm_enforce_eager
        self._timed_seconds = 0.0
        self._init_trl(args, kwargs)
        self.unit_rows = prompts.unit_size * self.num_generations
        if self.args.generation_batch_size % self.unit_rows:
            raise ValueError(f"generation_batch_size {self.args.generation_batch_size} is not a multiple of "
                             f"{self.unit_rows} completions (whole units)")
        if self.args.per_device_train_batch_size % self.unit_rows:
            raise ValueError(f"per_device_train_batch_size {self.args.per_device_train_batch_size} is not a "
                             f"multiple of {self.unit_rows} completions (whole units)")

    def _init_trl(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """TRL's constructor inside the vLLM adjustments of `cipr.train.rollout`: the policy's folder is
        checked loadable by vLLM, a colocated engine is built with `enforce_eager` (`vllm_enforce_eager`;
        null: eager on CPU), receives weights through `reload_weights` and stops at the policy's eos ids;
        vllm_server without CUDA raises a ConfigError at TRL's NCCL set-up.
        """
        train_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        use_vllm = bool(getattr(train_args, "use_vllm", False))
        if use_vllm:
            check_vllm_loadable(kwargs.get("model", args[0] if args else None))
        colocate = use_vllm and train_args.vllm_mode == "colocate"
        try:
            with eager_engine(self._vllm_enforce_eager) if colocate else contextlib.nullcontext(), \
                    warnings.catch_warnings():
                # the rollout_func surface multi-turn episodes use is pinned by tests/test_trl_contract.py
                warnings.filterwarnings("ignore", message="You are using 'rollout_func'")
                super().__init__(*args, reward_funcs=[self.scorer], **kwargs)
        except NotImplementedError as e:
            if use_vllm and train_args.vllm_mode == "server":
                device = getattr(getattr(self, "accelerator", None), "device", "cpu")
                raise server_sync_error(device, e) from e
            raise
        if self.use_vllm:
            use_reload_weights(self.vllm_generation)
            stop_token_ids(self.vllm_generation, self.eos_token_ids)

    # -- sampling and batching -------------------------------------------------------------------
    def _get_train_sampler(self, dataset: Any = None) -> PairedRepeatSampler:
        dataset = dataset if dataset is not None else self.train_dataset
        self._cipr_sampler = PairedRepeatSampler(
            dataset, unit_size=self.prompt_set.unit_size, num_generations=self.num_generations,
            units_per_batch=self.args.generation_batch_size // self.unit_rows,
            repeat_count=self.num_iterations * self.args.steps_per_generation,
            shuffle=bool(self.shuffle_dataset), seed=self.args.seed)
        return self._cipr_sampler

    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self._step % generate_every == 0 or self._buffered_inputs is None:
            batch = self._generate_and_score_completions(generation_batch)
            batch = shuffle_units(batch, self.unit_rows)
            self._buffered_inputs = split_tensor_dict(batch, self.args.steps_per_generation)
        return self._buffered_inputs[self._step % self.args.steps_per_generation]

    @contextlib.contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        """Log the block's wall seconds as `time/<name>` (mean per call over the logging interval)."""
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            seconds = time.perf_counter() - start
            self._metrics["train" if self.model.training else "eval"][f"time/{name}"].append(seconds)
            if name in ("generate_and_score", "loss_forward"):
                self._timed_seconds += seconds

    def _sync(self) -> None:
        """Wait for queued CUDA work, so that wall-clock timings are of the work itself (no-op on CPU)."""
        if torch.device(self.accelerator.device).type == "cuda":
            torch.cuda.synchronize()

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> torch.Tensor:
        """TRL's micro-step; logs `time/backward` (wall time outside generation, scoring, loss forward)."""
        self._timed_seconds = 0.0
        start = time.perf_counter()
        out = super().training_step(model, inputs, num_items_in_batch)
        self._sync()
        self._metrics["train"]["time/backward"].append(time.perf_counter() - start - self._timed_seconds)
        return out

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        with self._timed("generate_and_score"):
            self._episode_rows = [int(x["row_id"]) for x in inputs]  # _rollout_episodes (TRL passes prompts)
            try:
                output = super()._generate_and_score_completions(inputs)
            finally:
                self._episode_rows = None
            rollouts = list(self.scorer.last)
            if len(rollouts) != len(inputs):
                raise RuntimeError(f"the reward function scored {len(rollouts)} completions "
                                   f"for {len(inputs)} rows")
            records = self.prompt_set.records
            output["cipr_rows"] = [BatchRow(records[r.row], r) for r in rollouts]
            if self.model.training:
                self._log_rollouts(output["cipr_rows"])
            return output

    def _log_rollouts(self, rows: Sequence[BatchRow]) -> None:
        metrics = self._metrics["train"]
        rollouts = [row.rollout for row in rows]
        n = len(rollouts)
        if self.episodes is not None:  # over every process's episodes (rank 0 writes the metrics)
            totals = torch.tensor([episode_totals(rollouts)], dtype=torch.float64,  # type: ignore[arg-type]
                                  device=self.accelerator.device)
            if self.accelerator.num_processes > 1:
                totals = self.accelerator.gather(totals)
            for key, value in episode_metrics(totals.sum(0).tolist()).items():
                metrics[key].append(value)
        metrics["rollout/no_call_rate"].append(sum(r.no_call for r in rollouts) / n)
        metrics["rollout/decisions_per_response"].append(sum(len(r.decisions) for r in rollouts) / n)
        for side in ("canonical", "perturbed"):
            chosen = [row.rollout for row in rows if row.record.side == side]
            if chosen:
                metrics[f"reward/{side}"].append(sum(r.reward for r in chosen) / len(chosen))
        perturbed = [row.rollout for row in rows if row.record.side == "perturbed"]
        calls = sum(len(r.calls) for r in perturbed)
        if perturbed:
            metrics["rollout/twin_call_rate"].append(sum(r.twin_calls for r in perturbed) / calls
                                                     if calls else 0.0)
        if self._sample_log is not None and self._samples_per_step > 0:
            self._sample_log(self.state.global_step + 1, [
                {"pair_id": row.record.pair_id, "side": row.record.side, "id": row.record.example.id,
                 "reference": [c.name for c in row.record.example.reference], "completion": row.rollout.text,
                 "ended": row.rollout.ended, "calls": [c.name for c in row.rollout.calls],
                 "twin_calls": row.rollout.twin_calls, "format": row.rollout.format,
                 "correctness": row.rollout.correctness,
                 **({"turns": row.rollout.turns, "success": row.rollout.success}
                    if self.episodes is not None else {})}
                for row in rows[:self._samples_per_step]])

    # -- multi-turn episodes (TRL's rollout_func) -------------------------------------------------
    def _rollout_episodes(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        """TRL's `rollout_func`: play one episode per row of the generation batch (module docstring)."""
        rows = self._episode_rows
        if rows is None or len(rows) != len(prompts):
            raise RuntimeError(f"rollout_func got {len(prompts)} prompts for the generation batch's "
                               f"{None if rows is None else len(rows)} rows")
        assert self.episodes is not None
        episodes = self.episodes.run(rows, self._sample_turn, self.eos_token_ids, self._sync_max)
        self._metrics["train" if self.model.training else "eval"]["time/env"].append(
            sum(e.env_seconds for e in episodes))
        logprobs = None if any(e.logprobs is None for e in episodes) else [list(e.logprobs) for e in episodes]
        return {"prompt_ids": [list(e.prompt_ids) for e in episodes],
                "completion_ids": [list(e.completion_ids) for e in episodes], "logprobs": logprobs,
                "env_mask": [list(e.mask) for e in episodes], "cipr_episode": episodes}

    def _sample_turn(self, contexts: list[list[int]], max_new_tokens: int
                     ) -> tuple[list[list[int]], list[list[float]] | None]:
        """One turn for every context through `_generate_single_turn`, at most `max_new_tokens` tokens."""
        config, kwargs = getattr(self, "generation_config", None), getattr(self, "generation_kwargs", None)
        vllm = getattr(self, "vllm_generation", None) if self.use_vllm else None
        saved = (getattr(config, "max_new_tokens", None), (kwargs or {}).get("max_new_tokens"),
                 getattr(vllm, "max_completion_length", None))
        try:
            if config is not None:
                config.max_new_tokens = max_new_tokens
            if kwargs is not None and "max_new_tokens" in kwargs:
                kwargs["max_new_tokens"] = max_new_tokens
            if vllm is not None:
                vllm.max_completion_length = max_new_tokens
            ids, logprobs = self._generate_single_turn(contexts, None, {}, 1)
        finally:
            if config is not None:
                config.max_new_tokens = saved[0]
            if kwargs is not None and "max_new_tokens" in kwargs:
                kwargs["max_new_tokens"] = saved[1]
            if vllm is not None:
                vllm.max_completion_length = saved[2]
        return [list(i) for i in ids], logprobs

    def _sync_max(self, values: list[int]) -> list[int]:
        """Element-wise maximum over every process (the episode loop's lock step)."""
        if self.accelerator.num_processes == 1:
            return list(values)
        local = torch.tensor([values], dtype=torch.long, device=self.accelerator.device)
        return self.accelerator.gather(local).max(dim=0).values.tolist()

    # -- generation ------------------------------------------------------------------------------
    def _generate_single_turn(self, prompt_ids: Any, images: Any, multimodal_fields: Any,
                              num_generations: int, has_tool_images: bool = False) -> Any:
        """HF generation running each distinct prompt's prefill once (`sample_shared_prefill`); vLLM,
        continuous batching, multimodal inputs and `rollout.share_prompt_prefill=false` use TRL's path."""
        with self._timed("generate"):
            return self._generate_runs(prompt_ids, images, multimodal_fields, num_generations,
                                       has_tool_images)

    def _generate_runs(self, prompt_ids: Any, images: Any, multimodal_fields: Any, num_generations: int,
                       has_tool_images: bool) -> Any:
        runs = consecutive_runs(prompt_ids)
        distinct = len(runs) == len(prompt_ids)
        if self.accelerator.num_processes > 1:  # one path on every process: ZeRO-3's generation is collective
            distinct = bool(self._sync_max([int(distinct)])[0])
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

    # -- losses ----------------------------------------------------------------------------------
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

    def _query(self, row: BatchRow) -> ActionQuery:
        r = row.rollout
        response = r.text + (self.processing_class.eos_token if r.ended else "")
        record = row.record
        return ActionQuery(record.prompt, response, tuple(r.decisions), record.tools, record.classes)

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

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> torch.Tensor:
        """TRL's GRPO loss on every row (both interfaces), plus the consistency objective's terms when it has
        any, divided by the gradient-accumulation steps as TRL scales its own loss (module docstring)."""
        with self._timed("loss_forward"):
            if not self.consistency:
                loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
                check_finite(loss, self.state.global_step)
                return loss
            return self._loss(model, inputs, return_outputs, num_items_in_batch)

    def _loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool, num_items_in_batch: Any
              ) -> torch.Tensor:
        rows: list[BatchRow] = inputs["cipr_rows"]
        queries = [self._query(row) for row in rows]
        num_actions = max(row.record.num_actions for row in rows)
        metrics = self._metrics["train" if self.model.training else "eval"]
        fold = self._fold_rows(inputs, queries)
        folded = fold is not None and any(fold)
        metrics["actions/folded"].append(sum(fold) / len(fold) if fold else 0.0)
        reader = ActionReaderConfig(response_logprobs=folded, response_temperature=self.temperature)
        with self.accelerator.autocast(), self._timed("action_read"):
            reading = read_actions(model, self.processing_class, queries, num_actions, reader)
        with self._timed("task_loss"):
            if folded:
                with self.given_task_logps(self._task_logps(model, inputs, reading.response_logprobs, fold)):
                    task = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            else:
                task = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        terms, parts = self._consistency(model, rows, reading.probs, reading.sequence, num_actions)
        scale = self.current_gradient_accumulation_steps if self.model.training else 1.0
        loss = task + (terms / scale).to(task.dtype)
        parts["task"] = float(task.detach()) * scale
        for key, value in parts.items():
            metrics[key].append(value)
        check_finite(loss, self.state.global_step, parts)
        return loss

    def _consistency(self, model: Any, rows: Sequence[BatchRow], probs: torch.Tensor, sequence: torch.Tensor,
                     num_actions: int) -> tuple[torch.Tensor, dict[str, float]]:
        """The objective's terms for one micro-batch (`cipr.method.objective`), and their metrics."""
        parts: dict[str, float] = {}
        if probs.numel():
            parts["actions/entropy"] = float(action_entropy(probs).mean())
            parts["actions/p_no_call"] = float(probs[:, -1].detach().mean())
        seq = sequence.tolist()
        rollout = rescore = None
        if self.consistency.uses("rollout"):
            build = self._rollout_pairs if self.episodes is None else self._turn_pairs
            rollout, skipped = build(rows, probs, seq)
            parts.update({f"consistency/{k}": v for k, v in skipped.items()})
        if self.consistency.uses("rescore"):
            rescore, failures = self._rescore_pairs(model, rows, probs, seq, num_actions)
            parts["consistency/relabel_failures"] = failures
        total, metrics = self.consistency(probs, rescore=rescore, rollout=rollout,
                                          step=self.state.global_step, max_steps=self.state.max_steps)
        parts.update(metrics)
        return total, parts

    def _rollout_pairs(self, rows: Sequence[BatchRow], probs: torch.Tensor, seq: Sequence[int]
                       ) -> tuple[Pairs | None, dict[str, float]]:
        """The rollout term's pairs: each complete pair's G responses per side (`cipr.method.pairing`)."""
        index, metrics = rollout_index([row.record.pair_id for row in rows],
                                       [row.record.side for row in rows],
                                       [bool(row.rollout.decisions) for row in rows], seq,
                                       device=probs.device)
        if index is None:
            return None, metrics
        canon, pert = index.canonical, index.perturbed
        pairs = torch.arange(int(canon.groups.max()) + 1, device=probs.device)
        return rollout_pairs(probs[canon.decisions], canon.segments, canon.groups, probs[pert.decisions],
                             pert.segments, pert.groups, pairs), metrics

    def _turn_pairs(self, rows: Sequence[BatchRow], probs: torch.Tensor, seq: Sequence[int]
                    ) -> tuple[Pairs | None, dict[str, float]]:
        """The rollout term's pairs of episodes, turn by turn (`cipr.train.episode_terms.turn_index`)."""
        turns = [k for row in rows for k in row.rollout.turn_of]
        index, metrics = turn_index([row.record.pair_id for row in rows], [row.record.side for row in rows],
                                    seq, turns, device=probs.device)
        if index is None:
            return None, metrics
        canon, pert = index.canonical, index.perturbed
        return rollout_pairs(probs[canon.decisions], canon.units, canon.unit_groups, probs[pert.decisions],
                             pert.units, pert.unit_groups, index.group_pairs), metrics

    def _relabeled(self, row: BatchRow, seed: int) -> ActionQuery:
        """The relabeled (x̃, ỹ) of a canonical rollout (an episode: every turn); ValueError when it fails."""
        record, rollout = row.record, row.rollout
        if self.episodes is not None:
            ep = relabel_episode(record.prompt, rollout.text, rollout.turn_spans, record.tools, self.fmt,
                                 self.relabel_config, seed=seed)
            prompt, response, decisions, tools = ep.prompt, ep.response, ep.decisions, ep.tools
        else:
            rel = relabel(record.prompt, rollout.text, record.tools, self.fmt, self.relabel_config, seed=seed)
            prompt, response, decisions, tools = rel.prompt, rel.response, rel.relabeled_decisions, rel.tools
        response += self.processing_class.eos_token if rollout.ended else ""
        return ActionQuery(prompt, response, decisions, tools, record.classes)

    def _rescore_pairs(self, model: Any, rows: Sequence[BatchRow], probs: torch.Tensor, seq: Sequence[int],
                       num_actions: int) -> tuple[Pairs | None, float]:
        """The rescoring term's pairs: each canonical rollout's decisions against its relabeled copy's."""
        queries: list[ActionQuery] = []
        kept: list[int] = []
        failures = 0
        drawn: dict[int, int] = {}
        for b, row in enumerate(rows):
            response = drawn[row.record.row] = drawn.get(row.record.row, -1) + 1  # k-th of the prompt's G
            if row.record.side != "canonical" or not row.rollout.decisions:
                continue
            base = self.args.seed if self.relabel_config.seed is None else self.relabel_config.seed
            seed = relabel_seed(base, self.state.global_step, row.record.example.id, response)
            try:
                queries.append(self._relabeled(row, seed))
            except ValueError:
                failures += 1
                continue
            kept.append(b)
        if not queries:
            return None, float(failures)
        with self.accelerator.autocast(), self._timed("rescore_read"):
            relabeled = read_actions(model, self.processing_class, queries, num_actions)
        p_canon = probs[decision_rows(kept, seq, device=probs.device)]
        return rescore_pairs(p_canon, relabeled.probs, relabeled.sequence), float(failures)

    # -- checkpoint state ------------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        state = super().extra_state()
        generate_every = self.args.steps_per_generation * self.num_iterations
        state["micro_step"] = self._step
        state["buffered_inputs"] = self._buffered_inputs if self._step % generate_every else None
        return state

    def load_extra_state(self, state: dict[str, Any]) -> None:
        super().load_extra_state(state)
        self._step = int(state.get("micro_step", 0))
        self._buffered_inputs = state.get("buffered_inputs")

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        clean = {k: v for k, v in self._metrics["train"].items()
                 if not all(isinstance(x, float) and math.isnan(x) for x in v)}
        self._metrics["train"].clear()
        self._metrics["train"].update(clean)
        super().log(logs, start_time)
