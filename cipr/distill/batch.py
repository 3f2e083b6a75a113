"""A trajectory's views for self-distillation, and the loss of a batch of them.

A `DistillItem` holds, computed once per trajectory: the teacher's rendering (original names), the
student's (canonical, free text rewritten), their tokens and alignment, checked to have the same
decisions taking the same actions. At every step the student's rendering (`student_view`) is relabeled with
fresh neutral names by `cipr.method.pairing` (seeded by the step and the trajectory) for the rescoring KL.

`batch_loss` runs one teacher forward without gradient and one student forward with gradient (canonical
and relabeled together): each an action read whose decoder hidden states also give the next-token
distributions at the aligned positions (`read_with_logits`); it sums the terms (`cipr.distill.loss`,
`cipr.method.objective.weighted_sum`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cipr.distill.alignment import TokenAlignment, align_tokens, segment_texts
from cipr.distill.conversation import (
    Rendered,
    Tokenized,
    UnusableTrajectory,
    render_conversation,
    tokenize_rendered,
)
from cipr.distill.loss import action_kl, token_kl
from cipr.distill.naming import named, rename_pairs
from cipr.formats.base import CallFormat
from cipr.method.actions import ActionQuery, ActionReaderConfig, plain_head, read_actions
from cipr.method.objective import Objective, weighted_sum
from cipr.method.pairing import RelabeledBatch, Response, pair_relabeled
from cipr.tools.canonical import RewriteText
from cipr.tools.interface import Example


@dataclass(frozen=True)
class DistillItem:
    """One trajectory's fixed views: teacher (original names) and student (canonical names)."""

    example: Example
    student_example: Example
    teacher: Rendered
    teacher_tokens: Tokenized
    student: Rendered
    student_tokens: Tokenized
    alignment: TokenAlignment

    @property
    def num_tools(self) -> int:
        return len(self.example.interface)


def check_same_decisions(a: Rendered, b: Rendered, what: str) -> None:
    """Raise UnusableTrajectory unless a and b have the same decisions taking the same actions."""
    def classes(r: Rendered) -> list[int | None]:
        pos = {t: i for i, t in enumerate(r.tools)}
        return [None if d.taken is None else pos.get(d.taken, -1) for d in r.decisions]

    if classes(a) != classes(b) or a.turn_of != b.turn_of:
        raise UnusableTrajectory("decisions change under renaming",
                                 f"{what}: {classes(a)} vs {classes(b)}; renaming must not change which "
                                 f"actions a trajectory takes")


def build_item(example: Example, fmt: CallFormat, tokenizer: Any, *,
               rewrite: RewriteText = "all") -> DistillItem:
    """The fixed views of one trajectory (raises UnusableTrajectory, AlignmentError or a format's
    ValueError)."""
    student_example, nmap = named(example, "canonical", rewrite=rewrite)
    teacher = render_conversation(example, fmt, tokenizer)
    student = render_conversation(student_example, fmt, tokenizer)
    check_same_decisions(teacher, student, f"trajectory {example.id}")
    t_tok, s_tok = tokenize_rendered(tokenizer, teacher), tokenize_rendered(tokenizer, student)
    segments = segment_texts(teacher.text, student.text, rename_pairs(nmap, example.interface))
    alignment = align_tokens(segments, t_tok.ids, t_tok.offsets, s_tok.ids, s_tok.offsets,
                             a_regions=teacher.turns, b_regions=student.turns)
    return DistillItem(example, student_example, teacher, t_tok, student, s_tok, alignment)


def action_query(rendered: Rendered, fmt: CallFormat) -> ActionQuery:
    """The action reader's query for every decision of a rendering (class i = tool i)."""
    return ActionQuery(rendered.prompt, rendered.response, rendered.decisions, rendered.tools,
                       tuple(range(len(rendered.tools))), tuple(fmt.name_text(t) for t in rendered.tools))


def logits_at(model: Any, sequences: Sequence[Sequence[int]], rows: Sequence[int], cols: Sequence[int],
              pad_id: int) -> torch.Tensor:
    """Next-token logits [P, V] at (rows[i], cols[i]) of right-padded `sequences`, in one plain forward."""
    device = next(model.parameters()).device
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for b, s in enumerate(sequences):
        ids[b, :len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[b, :len(s)] = 1
    r = torch.tensor(list(rows), dtype=torch.long, device=device)
    c = torch.tensor(list(cols), dtype=torch.long, device=device)
    return model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits[r, c]


def read_with_logits(model: Any, tokenizer: Any, queries: Sequence[ActionQuery], num_actions: int,
                     sequences: Sequence[Sequence[int]], rows: Sequence[int], cols: Sequence[int],
                     reader: ActionReaderConfig | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Action distributions of `queries` [D, A+1] and next-token logits [P, V] at (rows, cols), in one
    forward.

    The action reader's forward runs the decoder over every prompt + response (packed name tries after
    them), so a hook on the decoder keeps its last hidden states and the output head is applied at the
    P positions. This relies on right padding (set here), checked: the hooked ids must equal
    `sequences[b]` on every row given. When the check fails, the head is not a plain projection (logit
    soft-capping), or the model is wrapped (DDP, DeepSpeed) or sharded (FSDP2, ZeRO-3), a separate
    forward computes the logits.
    """
    config = dataclasses.replace(reader or ActionReaderConfig(), padding_side="right")
    captured: dict[str, Any] = {}

    def hook(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        if "hidden" not in captured:
            captured["hidden"] = getattr(output, "last_hidden_state", None)
            captured["ids"] = kwargs.get("input_ids", args[0] if args else None)

    plain = plain_head(model)  # a wrapper (DDP, DeepSpeed) or a sharded model: no decoder to hook around
    handle = model.get_decoder().register_forward_hook(hook, with_kwargs=True) if plain else None
    try:
        probs = read_actions(model, tokenizer, queries, num_actions, config).probs
    finally:
        if handle is not None:
            handle.remove()
    hidden, ids = captured.get("hidden"), captured.get("ids")
    usable = plain and hidden is not None and ids is not None and all(
        ids.shape[1] >= len(s) and ids[b, :len(s)].tolist() == list(s) for b, s in enumerate(sequences))
    if not usable:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        return probs, logits_at(model, sequences, rows, cols, pad)
    r = torch.tensor(list(rows), dtype=torch.long, device=hidden.device)
    c = torch.tensor(list(cols), dtype=torch.long, device=hidden.device)
    return probs, model.get_output_embeddings()(hidden[r, c])


@dataclass(frozen=True)
class LossWeights:
    """Weights of the distillation task loss's two terms (`cipr.distill.loss`, summed by
    `cipr.method.objective.weighted_sum`) and the smoothing of its KLs; the consistency terms are the
    objective's (`cipr.method.objective`)."""

    token: float = 1.0
    action: float = 1.0
    eps: float = 1e-6


def default_objective(eps: float = 1e-6) -> Objective:
    """The built-in rescoring term at weight 1, the canonical side detached (`algo=distill`'s default)."""
    return Objective.builtin(rescore=1.0, eps=eps)


def student_view(items: Sequence[DistillItem], tokenizer: Any) -> list[Response]:
    """The student's canonical trajectories as `cipr.method.pairing` sees them: one response per item, its
    turns (the assistant turns' texts, the end-of-turn token left to the context), its decisions' rows in the
    batch's student read (items in order)."""
    eos = getattr(tokenizer, "eos_token", None) or ""
    out, start = [], 0
    for b, it in enumerate(items):
        r = it.student
        spans = tuple((s - r.prompt_end, e - r.prompt_end - (len(eos) if eos and r.text[s:e].endswith(eos)
                                                             else 0)) for s, e in r.turns)
        rows = tuple(range(start, start + len(r.decisions)))
        start += len(rows)
        out.append(Response(it.example.id, b, "canonical", 0, r.prompt, r.response, r.tools,
                            tuple(range(len(r.tools))), rows, spans=spans))
    return out


def batch_loss(student: Any, teacher: Any, tokenizer: Any, items: Sequence[DistillItem],
               relabeled: RelabeledBatch | None, fmt: CallFormat, weights: LossWeights, *,
               objective: Objective | None = None,
               teacher_context: Callable[[], Any] = contextlib.nullcontext,
               reader: ActionReaderConfig | None = None,
               token_positions: Callable[[int], float] | None = None, step: int = 0, max_steps: int = 0
               ) -> tuple[torch.Tensor, dict[str, float]]:
    """The distillation loss of a batch: token KL + action KL (teacher → student) + the consistency objective.

    `token_positions`: this batch's aligned positions -> the token KL's divisor (default: themselves;
    several processes: all processes' positions over their number). `teacher_context` is entered around
    the teacher's forwards (e.g. a LoRA student's `disable_adapter`). `relabeled`: the student view's
    relabeled copies (`cipr.method.pairing.relabeled` of `student_view`), read in the student's forward, the
    rescoring pairs' other side. `objective`: the consistency terms (None: `default_objective`).
    """
    if not items:
        raise ValueError("an empty batch")
    objective = objective if objective is not None else default_objective(weights.eps)
    num_actions = max(it.num_tools for it in items)
    rows = [b for b, it in enumerate(items) for _ in range(len(it.alignment))]
    cols_t = [k - 1 for it in items for k in it.alignment.a_index]
    cols_s = [k - 1 for it in items for k in it.alignment.b_index]
    seg = torch.tensor([b for b, it in enumerate(items) for _ in it.teacher.decisions], dtype=torch.long)
    with torch.no_grad(), teacher_context():
        t_probs, t_logits = read_with_logits(teacher, tokenizer,
                                             [action_query(it.teacher, fmt) for it in items], num_actions,
                                             [it.teacher_tokens.ids for it in items], rows, cols_t, reader)
    queries = [action_query(it.student, fmt) for it in items]
    if not objective.uses("rescore"):
        relabeled = None
    if relabeled is not None:
        queries += relabeled.queries
    s_probs, s_logits = read_with_logits(student, tokenizer, queries, num_actions,
                                         [it.student_tokens.ids for it in items], rows, cols_s, reader)
    n = len(seg)
    seg = seg.to(s_probs.device)
    positions = token_positions(len(rows)) if token_positions is not None else None
    token, token_metrics = token_kl(t_logits, s_logits, positions)
    action, action_metrics = action_kl(t_probs, s_probs[:n], seg, eps=weights.eps)
    loss = weighted_sum([(weights.token, token), (weights.action, action)], s_probs)
    metrics = {**token_metrics, **action_metrics}
    if relabeled is not None:
        metrics["consistency/relabel_failures"] = float(relabeled.failures)
        if relabeled.queries:
            pairs = pair_relabeled(student_view(items, tokenizer), s_probs[:n], relabeled, s_probs[n:])
            value, consistency = objective(loss, rescore=pairs, step=step, max_steps=max_steps)
            loss = loss + value
            metrics.update(consistency)
    metrics["distill/loss"] = float(loss.detach())
    metrics["distill/unpaired_student_tokens"] = float(sum(it.alignment.b_unpaired for it in items))
    return loss, metrics
