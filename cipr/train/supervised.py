"""The supervised regime (`algo.regime=supervised`, paper §3.4): each algorithm's data, SFT instead of GRPO.

The paper's supervised CIPR is the SFT loss plus the rescoring KL: no generation, one forward and
backward per row plus the relabeled read. Per algorithm (`algo.py`):

- `grpo` (the plain baseline): SFT on the original names.
- `masking`: SFT on masked names.
- `multi_interface`: SFT on every canonical example and its perturbed copy (twins, relabeling,
  reordering), the two rows of a pair in the same batch (`PairedRepeatSampler` with one "generation").
- `cipr`: the same rows, plus λ_rescore · KL_rescore on the canonical rows: the action distributions at
  the decisions of the reference target y under the canonical prompt x, against those of (x̃, ỹ),
  the same pair with fresh `function_XX` names (`cipr.method.pairing.build_rescore`: the batch's canonical
  rows as `Response`s, each decision carrying the reference action as its target).
  There are no rollouts, so there is no rollout term (a nonzero `algo.terms.rollout.weight` is refused).

Action supervision (`action_weight` > 0, `algo.action_weight` / `trainer.warm_start.action_weight`): the
task loss becomes the SFT token loss plus `action_weight` times the cross-entropy of the action
distribution at the reference's calls (`action_nll`). Plain SFT spreads the signal over all target
tokens, of which one (the id's last digit under canonical names) chooses the tool, and left the
held-out choice near chance (docs/results/cpu_evidence.md); the term gives the choice a loss of its
own. Both come from one forward of the action reader
(`read_actions(..., response_logprobs=True)`: the target's token log-probabilities and the action
distributions), which replaces TRL's forward; the token loss is the mean over the micro-batch's target
tokens (end-of-turn token included, as TRL appends it).

Choices the paper leaves open:
- The canonical side of the KL is read in a separate forward from the SFT loss's (TRL's forward
  returns no action distributions) and, with `algo.detach_reference`, without gradient; with action
  supervision it is the same forward's canonical rows.
- The term is averaged over the canonical rows of the micro-batch (each target's decisions averaged
  first) and divided by the gradient-accumulation steps exactly when the Trainer does not divide the
  token loss (it sums tokens over the accumulated batch), so λ weighs it against the SFT loss per
  optimizer step as the GRPO term is weighed against TRL's loss.
- A target whose decisions do not survive relabeling (none in the project's formats) is counted in
  `consistency/relabel_failures` and adds no term.

Memory (the numbers are unchanged, bit for bit): the decoder layers that train keep only their inputs for
backward and are run again there (`cipr.method.action_forward.recomputing`), in TRL's SFT forward
(`lean_sft_forward`) and in the reader's (`LEAN`), unless the model checkpoints already: what they keep
otherwise (about 12h + 3kv + 4I values per token and layer, for every padded position of every row, and
again for the relabeled rows) is nearly all of the step's memory; the recomputation costs one more forward
of those layers. And off Triton devices TRL's fused head projects every position of every row onto the
vocabulary in tiles of up to 4096 x 32768 float32 (plus a few temporaries of that size, forward and
backward), where only the target tokens are scored: `lean_sft_forward` projects those only, through
TRL's own kernel, when the head does not train (about what the recomputation costs, on a CPU).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from transformers import TrainerCallback

from cipr.formats.base import CallFormat
from cipr.method.action_forward import recomputing, sharded
from cipr.method.actions import ActionQuery, ActionReaderConfig, ActionReading, read_actions
from cipr.method.consistency import segment_mean
from cipr.method.objective import Objective, Pairs
from cipr.method.pairing import Response, build_rescore, rows_by_response
from cipr.method.relabel import Relabeling
from cipr.train.checkpoint import check_finite
from cipr.train.data import PromptRecord
from cipr.train.sampler import PairedRepeatSampler
from cipr.train.sft import WarmStartTrainer

ROW = "row_id"
RECORDS = "cipr_records"
LEAN = ActionReaderConfig(recompute=True)
"""The regime's reads: the trained layers recomputed in backward (module docstring, Memory)."""
SFT_OUTPUTS = ("log_probs", "entropy", "is_top1")
"""The per-token fields TRL's SFTTrainer asks of its fused head (`add_fused_lm_head` in its constructor)."""
SCALES = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier",
          "logits_scaling")
"""Text-config fields by which TRL's fused head scales or caps logits; `compact_fused_forward` takes none."""


def canonical_queries(records: Sequence[PromptRecord], fmt: CallFormat,
                      suffix: str = "") -> list[ActionQuery]:
    """The action queries of the reference targets (+ `suffix`, e.g. end of turn) under their prompts."""
    return [ActionQuery.from_format(fmt, r.prompt, r.target + suffix, r.tools, r.classes) for r in records]


def reference_classes(query: ActionQuery, num_actions: int) -> list[int]:
    """Per decision of `query`, the class the reference takes (∅ = `num_actions`) where it is a choice: every
    call; the ∅ only of a target without calls (the end of turn after calls is not scored), else -1."""
    calls = any(d.taken is not None for d in query.decisions)
    index = {t: i for i, t in reversed(list(enumerate(query.tools)))}
    return [query.classes[index[d.taken]] if d.taken is not None else (-1 if calls else num_actions)
            for d in query.decisions]


def action_nll(probs: torch.Tensor, targets: torch.Tensor, segments: torch.Tensor, *, eps: float = 1e-12
               ) -> tuple[torch.Tensor, dict[str, float]]:
    """Cross-entropy of action distributions at the reference's choices, averaged per response, then
    over them. Shapes: probs [D, A] (∅ last, rows sum to 1), targets [D] (long, the reference's column,
    -1 = not scored), segments [D] (long, the response of each decision). Returns a scalar (a zero that
    keeps the graph when nothing is scored) and metrics `action/nll`, `action/accuracy` (argmax =
    target), `action/scored`.
    """
    if probs.dim() != 2 or targets.shape != probs.shape[:1] or segments.shape != targets.shape:
        raise ValueError(f"expected probs [D, A], targets [D], segments [D]; got {tuple(probs.shape)}, "
                         f"{tuple(targets.shape)}, {tuple(segments.shape)}")
    keep = targets >= 0
    if not bool(keep.any()):
        return probs.sum() * 0.0, {"action/nll": 0.0, "action/accuracy": 0.0, "action/scored": 0.0}
    p, t, seg = probs[keep], targets[keep], segments[keep]
    nll = -torch.log(p.gather(1, t[:, None]).squeeze(1).clamp_min(eps))
    value = segment_mean(nll, seg)[0].mean()
    return value, {"action/nll": float(value.detach()), "action/scored": float(keep.sum()),
                   "action/accuracy": float((p.argmax(-1) == t).double().mean())}


def compact_fused_forward(model: Any, forward: Any, *args: Any, fused_lm_head: bool = False,
                          labels: torch.Tensor | None = None, **kwargs: Any) -> Any:
    """TRL's fused-head forward (`trl.trainer.utils.add_fused_lm_head` with `SFT_OUTPUTS`, temperature 1) as
    TRL runs it on Triton devices: the head and TRL's `ChunkedLogProbFunction` on the positions whose next
    label is not -100 only, their per-token fields scattered into zeros. Off Triton, TRL projects every
    position; a row's numbers do not depend on the others', so the result is the same. Any other call
    (no `fused_lm_head`, pre-shifted labels, router logits) goes to `forward`, the model's own."""
    if not fused_lm_head or labels is None or kwargs.get("shift_labels") is not None \
            or kwargs.get("output_router_logits"):
        if fused_lm_head:
            kwargs["fused_lm_head"] = True
        if labels is not None:
            kwargs["labels"] = labels
        return forward(*args, **kwargs)
    from trl.kernels import ChunkedLogProbFunction
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE, FusedCausalLMOutput

    num_items_in_batch = kwargs.pop("num_items_in_batch", None)
    kwargs["use_cache"] = False
    hidden = model.base_model(*args, **kwargs).last_hidden_state[:, :-1]
    labels = labels[:, 1:].to(hidden.device)
    mask = labels != -100
    head = model.get_output_embeddings()
    fields = ChunkedLogProbFunction.apply(hidden[mask], head.weight, head.bias, labels[mask], 1.0,
                                          _CHUNKED_LOGPROB_CHUNK_SIZE, None, 1.0, SFT_OUTPUTS)
    log_probs, entropy, _, _, is_top1 = (None if x is None else
                                         x.new_zeros(mask.shape).masked_scatter(mask, x) for x in fields)
    loss = -log_probs.sum() / (mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch)
    return FusedCausalLMOutput(loss=loss, log_probs=log_probs, entropy=entropy, is_top1=is_top1,
                               label_mask=mask)


def _compactable(model: Any, device: torch.device) -> bool:
    """Whether `compact_fused_forward` may stand in for TRL's: off Triton (where TRL does not compact), a
    plain text model whose head neither scales nor caps the logits, not sharded, and a head that does not
    train (frozen, or tied to frozen input embeddings: `model.freeze_bottom_layers`). A trained head's
    gradient sums over the projected positions, and a sum over fewer terms (the zeros of the positions
    without a label left out) rounds differently in the last bits."""
    from trl.kernels.chunked_logprob import _use_triton

    config = getattr(model, "config", None)
    text = config.get_text_config() if config is not None else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return (text is config and text is not None and not _use_triton(device) and not sharded(model)
            and head is not None and not any(p.requires_grad for p in head.parameters())
            and all(getattr(text, key, None) is None for key in SCALES))


@contextlib.contextmanager
def lean_sft_forward(model: Any, device: torch.device) -> Iterator[None]:
    """TRL's SFT forward in less memory, with the same numbers (module docstring): inside, the model's fused
    head scores the target positions only (`compact_fused_forward`, where `_compactable`) and, in training
    with gradients, the trained decoder layers are recomputed in backward (`recomputing`). `model`:
    unwrapped (PEFT's base model is the one patched, as TRL patches it)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    before = base.__dict__.get("forward")
    compact = _compactable(base, device)
    try:
        if compact:
            base.forward = functools.partial(compact_fused_forward, base, base.forward)
        with recomputing(base):
            yield
    finally:
        if compact:
            if before is None:
                del base.forward
            else:
                base.forward = before


class SupervisedTrainer(WarmStartTrainer):
    """SFT over an algorithm's rows: pairs kept together, action supervision, the consistency objective.

    `objective`: the consistency terms (`cipr.method.objective`; rescore-kind only: no rollouts), None or
    empty for none (an algorithm other than CIPR); a weight-0 term is still read and logged. `action_weight`:
    the action cross-entropy's weight (0: TRL's SFT loss alone). `relabeling`: the run's (None: the default
    names under the run seed).
    """

    def __init__(self, *, fmt: CallFormat, unit_size: int, objective: Objective | None = None,
                 action_weight: float = 0.0, relabeling: Relabeling | None = None,
                 trace: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.fmt = fmt
        self.unit_size = unit_size
        self.consistency = objective or Objective([])
        self.action_weight = action_weight
        self.relabeling = relabeling or Relabeling.of(None, self.args.seed)
        self.trace = trace and self.consistency.uses("rescore")
        self._traced: list[tuple[list[PromptRecord], int]] = []
        if self.trace:
            self.add_callback(TraceCallback(self))

    def trace_after(self) -> None:
        """The terms' values on this step's own pairs (the same examples, the same relabelings) after its
        optimizer update, logged as `trace/<term>/after` beside `trace/<term>/before` (`logging.trace`): the
        term working on the pairs it trained on. Read in eval mode without gradient; changes no weight."""
        batches, self._traced = self._traced, []
        if not batches:
            return
        model = self.model
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for records, step in batches:
                    pairs, _ = self._rescore(model, records, step)
                    if pairs is None:
                        continue
                    _, metrics = self.consistency(pairs.p_other, rescore=pairs, step=step,
                                                  max_steps=self.state.max_steps)
                    self._log({f"trace/{t.name}/after": metrics[f"consistency/{t.name}/value"]
                               for t in self.consistency.terms if t.kind == "rescore"})
        finally:
            model.train(was_training)

    def _get_train_sampler(self, dataset: Any = None) -> PairedRepeatSampler:
        dataset = dataset if dataset is not None else self.train_dataset
        self._cipr_sampler = PairedRepeatSampler(
            dataset, unit_size=self.unit_size, num_generations=1,
            units_per_batch=self.args.per_device_train_batch_size // self.unit_size, seed=self.args.seed)
        return self._cipr_sampler

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Metrics pooled over the processes before TRL averages them: the whole step's, not rank 0's."""
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            mode = "train" if self.model.training else "eval"
            pooled: dict[str, list[float]] = {}
            for part in gather_object([dict(self._metrics[mode])]):
                for key, values in part.items():
                    pooled.setdefault(key, []).extend(values)
            self._metrics[mode].clear()
            self._metrics[mode].update(pooled)
        super().log(logs, start_time)

    def _log(self, metrics: dict[str, float], prefix: str = "") -> None:
        for key, v in metrics.items():
            self._metrics["train"][prefix + key].append(v)

    def _accumulated(self, term: torch.Tensor, num_items_in_batch: Any) -> torch.Tensor:
        """A per-micro-batch mean scaled as the Trainer scales its loss: it divides by the accumulation steps
        only when the model does not take `num_items_in_batch` (else the token loss is a sum over all
        steps)."""
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            return term / self.current_gradient_accumulation_steps
        return term

    def _supervised_loss(self, model: Any, batch: Sequence[PromptRecord], num_items_in_batch: Any
                         ) -> tuple[torch.Tensor, Any]:
        """Token loss + action_weight · action CE from one reader forward; also the reading."""
        tokenizer = self.processing_class
        queries = canonical_queries(batch, self.fmt, tokenizer.eos_token or "")
        num_actions = max(r.num_actions for r in batch)
        reading = read_actions(model, tokenizer, queries, num_actions,
                               dataclasses.replace(LEAN, response_logprobs=True))
        mask = reading.response_mask
        total = -(reading.response_logprobs * mask).sum()
        targets = torch.tensor([c for q in queries for c in reference_classes(q, num_actions)],
                               dtype=torch.long, device=reading.probs.device)
        ce, metrics = action_nll(reading.probs, targets, reading.sequence)
        self._log({"token_loss": float(total.detach() / mask.sum().clamp(min=1)), **metrics})
        action = self._accumulated(self.action_weight * ce.to(total.dtype), num_items_in_batch)
        return self._token_loss(total, mask.sum(), num_items_in_batch) + action, reading

    def _token_loss(self, total: torch.Tensor, count: torch.Tensor, num_items_in_batch: Any) -> torch.Tensor:
        """The token loss scaled as the Trainer scales a model's own: the sum over the whole step's target
        tokens (`num_items_in_batch`: every accumulation step and, with `average_tokens_across_devices`,
        every process) times the processes, whose gradients DDP/FSDP/ZeRO average, so two processes train
        like one on the same global batch; else the micro-batch's mean."""
        if self.model_accepts_loss_kwargs and num_items_in_batch is not None:
            processes = self.accelerator.num_processes if self.args.average_tokens_across_devices else 1
            return total * processes / num_items_in_batch
        return total / count.clamp(min=1)

    def compute_loss(self, model: Any, inputs: Any, return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        batch: list[PromptRecord] = inputs.pop(RECORDS)
        reading = None
        if self.action_weight > 0:
            if return_outputs:
                raise ValueError("action supervision computes its own loss and returns no model outputs")
            out, reading = self._supervised_loss(model, batch, num_items_in_batch)
        else:
            with lean_sft_forward(self.accelerator.unwrap_model(model), self.accelerator.device):
                out = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                           num_items_in_batch=num_items_in_batch)
        if not self.consistency.uses("rescore") or not model.training:
            return out
        loss = out[0] if return_outputs else out
        step = self.state.global_step
        trained = any(t.weight for t in self.consistency.terms)  # all at weight 0: read for the log only
        with torch.enable_grad() if trained else torch.no_grad():
            pairs, counts = self._rescore(model, batch, step, reading)
        self._log(counts)
        if pairs is None:
            return out
        value, metrics = self.consistency(loss, rescore=pairs, step=step, max_steps=self.state.max_steps)
        self._log(metrics)
        if self.trace:
            self._traced.append(([r for r in batch if r.side == "canonical"], step))
            self._log({f"trace/{t.name}/before": metrics[f"consistency/{t.name}/value"]
                       for t in self.consistency.terms if t.kind == "rescore"})
        loss = loss + self._accumulated(value.to(loss.dtype), num_items_in_batch)
        check_finite(loss, step, metrics)
        return (loss, out[1]) if return_outputs else loss

    def _rescore(self, model: Any, batch: Sequence[PromptRecord], step: int,
                 reading: ActionReading | None = None) -> tuple[Pairs | None, dict[str, float]]:
        """The rescoring pairs of the batch's canonical rows (`cipr.method.pairing.build_rescore`): their
        decisions in `reading` (the action-supervised forward of `batch`) or in a read of the canonical rows
        here (without gradient when the reference is detached), against their relabeled copies'."""
        detach, tokenizer = self.consistency.detach_reference, self.processing_class
        if reading is None:
            batch = [r for r in batch if r.side == "canonical"]
            if not batch:
                return None, {"consistency/relabel_failures": 0.0}
            with torch.no_grad() if detach else torch.enable_grad():
                reading = read_actions(model, tokenizer, canonical_queries(batch, self.fmt),
                                       max(r.num_actions for r in batch), LEAN)
        probs = reading.probs.detach() if detach else reading.probs
        num_actions = probs.shape[1] - 1
        by_row = rows_by_response(reading.sequence.tolist(), len(batch))
        view = [Response(r.example.id, r.pair_id, r.side, 0, r.prompt, r.target, r.tools, r.classes,
                         by_row[b], targets=tuple(reference_classes(ActionQuery.from_format(
                             self.fmt, r.prompt, r.target, r.tools, r.classes), num_actions)))
                for b, r in enumerate(batch)]

        def read(queries: Sequence[ActionQuery]) -> torch.Tensor:
            return read_actions(model, tokenizer, queries, num_actions, LEAN).probs

        return build_rescore(view, probs, read, self.fmt, self.relabeling, step)


class TraceCallback(TrainerCallback):
    """Calls `SupervisedTrainer.trace_after` once per optimizer step, after the update and before the step's
    metrics are logged."""

    def __init__(self, trainer: SupervisedTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.trainer.trace_after()


def collate_with_records(collator: Any, records: Sequence[PromptRecord]) -> Any:
    """TRL's collator, with each example's `PromptRecord` carried through (`RECORDS`), so the loss receives
    the batch's rows themselves (side, pair, tools, target) rather than ids to look them up by."""

    def collate(examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = collator([{k: v for k, v in e.items() if k != ROW} for e in examples])
        batch[RECORDS] = [records[e[ROW]] for e in examples]
        return batch

    return collate


def build_supervised_trainer(model: Any, tokenizer: Any, records: Sequence[PromptRecord],
                             args: dict[str, Any], max_length: int | None, *, fmt: CallFormat, unit_size: int,
                             objective: Objective | None = None, action_weight: float = 0.0,
                             relabeling: Relabeling | None = None, trace: bool = False,
                             callbacks: Sequence[Any] = ()) -> SupervisedTrainer:
    """A supervised trainer over `records` (TrainingArguments fields `args`, see `schedule.common_args`)."""
    from datasets import Dataset
    from trl import SFTConfig

    if args["per_device_train_batch_size"] % unit_size:
        raise ValueError(f"per-device batch {args['per_device_train_batch_size']} is not a whole number of "
                         f"pairs of {unit_size} rows")
    config = SFTConfig(**args, max_length=max_length, completion_only_loss=True, packing=False,
                       remove_unused_columns=False)
    dataset = Dataset.from_list([{"prompt": r.prompt, "completion": r.target, ROW: r.row} for r in records])
    trainer = SupervisedTrainer(fmt=fmt, unit_size=unit_size, objective=objective,
                                action_weight=action_weight, relabeling=relabeling, trace=trace,
                                model=model,
                                args=config, train_dataset=dataset, processing_class=tokenizer,
                                callbacks=list(callbacks))
    trainer.data_collator = collate_with_records(trainer.data_collator, records)
    return trainer
