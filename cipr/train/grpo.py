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

Performance paths (the folded action read, completion-only scoring, shared prefill) are `grpo_fast`'s
(`GRPOFastPaths`, a class this one inherits from): each on only where it applies, each with TRL's numbers. The
rescoring term always needs a second forward over the relabeled canonical rollouts (x̃, ỹ).

Rollouts come from the policy through TRL's generation, or from `rollout_source` (a factory called with the
trainer, returning `generate(prompt_ids) -> (completion_ids, logprobs or None)`): replayed completions for
tests and benchmarks (`cipr.train.replay`), everything after generation being the trainer's own code.

Multi-turn episodes (`rollout.mode=multi_turn`, `cipr.train.episodes`) go through TRL's `rollout_func`
hook: TRL hands it the generation batch's prompts (after syncing vLLM's weights) and takes back prompt ids,
completion ids, sampler log-probabilities, `env_mask` (TRL multiplies it into the loss mask: observation
tokens are never trained on) and extra per-row fields, which reach the reward function (`cipr_episode`).
The trainer keeps the batch's rows while TRL calls it (TRL passes the prompts only) and gives the loop
`_sample_turn` (`_generate_single_turn` with the turn's token budget), so HF and vLLM sample every turn
through TRL's own generation code (why not TRL's `tools=` / `environment_factory`: docs/multi_turn.md). Each
episode is one response to the consistency terms: its decisions are every turn's, read on the multi-turn
context; the rollout term is turn-aligned and the rescoring term relabels every turn.

The consistency terms see the batch through `cipr.method.pairing`: each row is a `Response` (its record's
example, pair, side and tools; its rollout's text, turns and decisions' rows), the reader is the action
reader on the same model, and `cipr.method.pairing` builds every pair (`_consistency`).

The choices the paper leaves open (which decisions count, which pairs enter, the reference side) are the
method's: `cipr.method.pairing`, `cipr.method.consistency` and docs/method.md.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from trl.trainer.utils import split_tensor_dict

from cipr.formats.base import CallFormat
from cipr.method.actions import ActionQuery, ActionReaderConfig, read_actions
from cipr.method.objective import Objective
from cipr.method.pairing import Response, build_rescore, build_rollout, rows_by_response
from cipr.method.relabel import Relabeling
from cipr.train.algo import AlgoConfig
from cipr.train.checkpoint import CheckpointMixin, check_finite
from cipr.train.data import PromptSet
from cipr.train.episodes import EpisodeRunner, EpisodeScorer, episode_metrics, episode_totals
from cipr.train.grpo_fast import GRPOFastPaths
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


def action_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each row of [D, A] action distributions."""
    p = probs.detach().clamp_min(0)
    return -(torch.xlogy(p, p)).sum(-1)


Generate = Callable[[list[list[int]]], tuple[list[list[int]], list[list[float]] | None]]
RolloutSource = Callable[[Any], Generate]
"""Called once with the trainer, at its first generation: what stands in for the policy's sampling."""


class CIPRGRPOTrainer(CheckpointMixin, GRPOFastPaths):
    """GRPO with paired interfaces and CIPR's consistency terms (module docstring). `relabeling`: the run's
    (None: the default names under the run seed); `rollout_source`: replayed rollouts (module docstring)."""

    def __init__(self, *args: Any, prompts: PromptSet, scorer: RolloutScorer | EpisodeScorer,
                 algo: AlgoConfig, fmt: CallFormat, objective: Objective | None = None,
                 relabeling: Relabeling | None = None, fold_allowed: bool = True, share_prefill: bool = True,
                 vllm_enforce_eager: bool | None = None,
                 sample_log: Callable[[int, list[dict[str, Any]]], None] | None = None,
                 samples_per_step: int = 0, episodes: EpisodeRunner | None = None,
                 rollout_source: RolloutSource | None = None, **kwargs: Any) -> None:
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
        self.rollout_source = rollout_source
        self._rollouts: Generate | None = None
        self._cipr_sampler: PairedRepeatSampler | None = None
        self._fold_allowed = fold_allowed
        self._share_prefill = share_prefill
        self._vllm_enforce_eager = vllm_enforce_eager
        self._timed_seconds = 0.0
        self._init_trl(args, kwargs)
        self.relabeling = relabeling or Relabeling.of(None, self.args.seed)
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
        """One turn for every prompt: the `rollout_source`'s, else the policy's (`GRPOFastPaths`, TRL's)."""
        with self._timed("generate"):
            if self.rollout_source is not None:
                if self._rollouts is None:
                    self._rollouts = self.rollout_source(self)
                return self._rollouts([list(ids) for ids in prompt_ids])
            return super()._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations,
                                                 has_tool_images)

    # -- losses ----------------------------------------------------------------------------------
    def _query(self, row: BatchRow) -> ActionQuery:
        r = row.rollout
        response = r.text + (self.processing_class.eos_token if r.ended else "")
        record = row.record
        return ActionQuery(record.prompt, response, tuple(r.decisions), record.tools, record.classes)

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
        fold = self._fold_rows(inputs, queries)  # grpo_fast: None unless the folded read applies
        folded = fold is not None and any(fold)
        metrics["actions/folded"].append(sum(fold) / len(fold) if fold else 0.0)
        reader = ActionReaderConfig(response_logprobs=folded, response_temperature=self.temperature)
        with self.accelerator.autocast(), self._timed("action_read"):
            reading = read_actions(model, self.processing_class, queries, num_actions, reader)
        with self._timed("task_loss"), self._folded(model, inputs, reading, fold):
            task = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        terms, parts = self._consistency(model, rows, reading.probs, reading.sequence, num_actions)
        scale = self.current_gradient_accumulation_steps if self.model.training else 1.0
        loss = task + (terms / scale).to(task.dtype)
        parts["task"] = float(task.detach()) * scale
        for key, value in parts.items():
            metrics[key].append(value)
        check_finite(loss, self.state.global_step, parts)
        return loss

    def _view(self, rows: Sequence[BatchRow], sequence: Sequence[int]) -> list[Response]:
        """The micro-batch as `cipr.method.pairing` sees it: a `Response` per row (an episode: every turn)."""
        eos = self.processing_class.eos_token
        by_row = rows_by_response(sequence, len(rows))
        drawn: dict[int, int] = {}
        out = []
        for b, row in enumerate(rows):
            record, r = row.record, row.rollout
            drawn[record.row] = drawn.get(record.row, -1) + 1  # the k-th of the prompt's G responses
            episode = self.episodes is not None
            out.append(Response(record.example.id, record.pair_id, record.side, drawn[record.row],
                                record.prompt, r.text, record.tools, record.classes, by_row[b],
                                eos if r.ended else "", r.turn_spans if episode else None,
                                tuple(r.turn_of) if episode else ()))
        return out

    def _consistency(self, model: Any, rows: Sequence[BatchRow], probs: torch.Tensor, sequence: torch.Tensor,
                     num_actions: int) -> tuple[torch.Tensor, dict[str, float]]:
        """The objective's terms for one micro-batch (`cipr.method.objective`), and their metrics."""
        parts: dict[str, float] = {}
        if probs.numel():
            parts["actions/entropy"] = float(action_entropy(probs).mean())
            parts["actions/p_no_call"] = float(probs[:, -1].detach().mean())
        view = self._view(rows, sequence.tolist())
        rollout = rescore = None
        if self.consistency.uses("rollout"):
            rollout, counts = build_rollout(view, probs, by_turn=self.episodes is not None)
            parts.update(counts)
        if self.consistency.uses("rescore"):
            def read(queries: Sequence[ActionQuery]) -> torch.Tensor:
                with self.accelerator.autocast(), self._timed("rescore_read"):
                    return read_actions(model, self.processing_class, queries, num_actions).probs

            rescore, counts = build_rescore(view, probs, read, self.fmt, self.relabeling,
                                            self.state.global_step)
            parts.update(counts)
        total, metrics = self.consistency(probs, rescore=rescore, rollout=rollout,
                                          step=self.state.global_step, max_steps=self.state.max_steps)
        parts.update(metrics)
        return total, parts

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
