"""What a run can check before any weights load: its prompts as the model will see them, and its batches.

`cipr-train` runs `preflight` after reading its data and tokenizer and before loading the weights, and
refuses a run it fails; `cipr-plan` runs it too, with a stand-in tokenizer where the model's is not here.

- The call format against the chat template: the template renders one probe call (`PROBE_CALL`, a string
  and a boolean argument) and the format's own call text for it must appear in what the template wrote.
  A format that follows the template (`hermes`, `qwen35_xml`, ...) that does not is an error naming the
  format, the template and the formats whose text does appear. A format that writes the tools into the
  prompt itself (`toolrl`, `compact`, `react`) never meets the template's call syntax: a note.
- Lengths: the first `rows` examples are rendered exactly as training renders them (`build_prompts`,
  perturbed copies included) and counted in tokens: prompts against `trainer.max_prompt_length` (GRPO
  leaves a longer unit out) and prompt + target against the SFT stages' `max_length` (a longer row loses
  its target's end): a share over the limit above `max_left_out` is an error, any share a warning.
  Reference targets against `rollout.max_completion_length` are only a warning: rollouts are sampled,
  and a recipe may bound them below the reference (the CPU recipes do, for time).
- Batches (`batch_plan`): every divisibility of the schedule (`validate_schedule`, `grpo_batch`), then
  generation rounds per epoch, optimizer steps, rounds and rollouts of the run, and the pairs per step,
  update and micro-batch; a data set too small for one generation batch is an error.

The count of training units is estimated when only a sample is rendered: the examples, less the held-out
ones and those without tools, scaled by the sample's share that rendered and fit (`BatchPlan.estimated`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from cipr.core.config import ConfigError
from cipr.core.errors import DataError
from cipr.tools.interface import Call
from cipr.train.config import TrainConfig, call_format_name
from cipr.train.schedule import GrpoBatch, grpo_batch, validate_schedule

PROBE_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city.",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string"}, "metric": {"type": "boolean"}}}}}
PROBE_CALL = Call("get_weather", {"city": "Paris", "metric": True})
"""The call the chat template renders for the format check (a boolean tells Qwen3.5's `True` from `true`)."""


@dataclass
class Findings:
    """Errors (the run would fail or waste its GPUs), warnings (it runs, not as one may think) and notes."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def check(self) -> None:
        """Raise ConfigError with every error (one per line after the first) when there is any."""
        if self.errors:
            more = f" (and {len(self.errors) - 1} more: " + "; ".join(self.errors[1:]) + ")" \
                if len(self.errors) > 1 else ""
            raise ConfigError(self.errors[0] + more)


@dataclass(frozen=True)
class LengthStats:
    """Token lengths of a sample against a limit: `over` of `count` exceed it (`share`)."""

    count: int
    mean: float
    p50: int
    p95: int
    max: int
    limit: int | None
    over: int

    @property
    def share(self) -> float:
        return self.over / self.count if self.count else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "share_over": self.share}


def length_stats(lengths: Sequence[int], limit: int | None) -> LengthStats:
    """Mean, median, 95th percentile (nearest rank) and maximum of `lengths`, and how many exceed `limit`."""
    ordered = sorted(lengths)
    if not ordered:
        return LengthStats(0, 0.0, 0, 0, 0, limit, 0)
    p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
    over = sum(n > limit for n in ordered) if limit is not None else 0
    return LengthStats(len(ordered), statistics.fmean(ordered), ordered[(len(ordered) - 1) // 2], p95,
                       ordered[-1], limit, over)


@dataclass(frozen=True)
class BatchPlan:
    """The batch arithmetic of the main stage on `world` processes (module docstring).

    GRPO: a round is one generation batch of `grpo.completions_per_step` completions, consumed by
    `updates_per_generation x num_iterations` optimizer steps; `rounds_per_epoch = train_units //
    units_per_step` (incomplete batches dropped). SFT-like stages (sft, supervised, distill): one optimizer
    step reads `rows_per_step` rows.
    """

    stage: str
    world: int
    train_units: int
    unit_size: int
    estimated: bool
    grpo: GrpoBatch | None
    rows_per_step: int
    optimizer_steps_per_round: int
    rounds_per_epoch: int
    units_dropped_per_epoch: int
    optimizer_steps: int
    rounds: int
    epochs: float
    rollouts: int
    pairs_per_step: int
    pairs_per_update: int
    pairs_per_micro_batch: int
    warm_start_steps: int
    warm_start_rows_per_step: int

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["grpo"] = self.grpo.to_dict() if self.grpo else None
        return out


def _main_stage(cfg: TrainConfig) -> str:
    if cfg.algo.name in ("sft", "distill"):
        return cfg.algo.name
    return "supervised" if cfg.algo.supervised else "grpo"


def batch_plan(cfg: TrainConfig, train_units: int, world: int, findings: Findings, *,
               estimated: bool = False) -> BatchPlan | None:
    """The batch arithmetic (class docstring); each indivisibility or a too-small data set is an error in
    `findings` (None when the schedule itself is refused)."""
    t, stage = cfg.trainer, _main_stage(cfg)
    grpo = stage == "grpo"
    unit_size = cfg.perturb.unit_size
    g = cfg.rollout.num_generations if grpo else 1
    try:
        validate_schedule(t, 1 if stage in ("sft", "distill") else unit_size * g)
        batch = grpo_batch(t, num_generations=g, unit_size=unit_size,
                           pairing_budget=cfg.algo.pairing_budget, world=world) if grpo else None
    except ConfigError as e:
        findings.errors.append(str(e))
        return None
    if grpo and cfg.rollout.uses_vllm and world % cfg.rollout.tensor_parallel_size:
        findings.errors.append(f"rollout.tensor_parallel_size={cfg.rollout.tensor_parallel_size} does not "
                               f"divide the {world} processes: vLLM's tensor-parallel groups must tile them")
    ws = t.warm_start
    ws_steps = ws.steps if stage in ("grpo", "supervised") else 0
    ws_rows = ws.per_device_train_batch_size * ws.gradient_accumulation_steps * world if ws_steps else 0
    if batch is not None:
        units_per_step, per_round = batch.prompts_per_step, t.updates_per_generation * t.num_iterations
        rows = batch.rows_per_step
    else:
        per_device = t.per_device_train_batch_size
        if stage == "supervised" and cfg.algo.pairing_budget == "prompts":
            per_device *= unit_size  # each example with its copy (cipr/train/run.py)
        rows = per_device * t.gradient_accumulation_steps * world
        units_per_step, per_round = max(1, rows // unit_size), 1
    rounds_per_epoch, dropped = divmod(train_units, units_per_step)
    what = f"{'pairs' if unit_size == 2 else 'prompts'}" if stage != "distill" else "trajectories"
    if rounds_per_epoch == 0:
        size = f"~{train_units}" if estimated else f"{train_units}"
        findings.errors.append(
            f"one {'generation batch' if grpo else 'step'} takes {units_per_step} training {what} but the "
            f"data gives {size} (less the held-out ones and those left out for their length): raise data.n "
            f"(or give more data), or lower trainer."
            f"{'prompts_per_step' if t.prompts_per_step else 'per_device_train_batch_size'}")
    elif dropped:
        findings.notes.append(f"{dropped} of {train_units} training {what} left out of every epoch "
                              f"(incomplete final batch, dropped as verl does)")
    steps_per_epoch = rounds_per_epoch * per_round
    if t.max_steps == -1:
        optimizer_steps = math.ceil(t.num_train_epochs * steps_per_epoch)
    else:
        optimizer_steps = t.max_steps
    rounds = math.ceil(optimizer_steps / per_round) if grpo else optimizer_steps
    epochs = optimizer_steps / steps_per_epoch if steps_per_epoch else 0.0
    unit_rows = unit_size * g
    pairs = unit_size == 2
    return BatchPlan(
        stage=stage, world=world, train_units=train_units, unit_size=unit_size, estimated=estimated,
        grpo=batch,
        rows_per_step=rows, optimizer_steps_per_round=per_round, rounds_per_epoch=rounds_per_epoch,
        units_dropped_per_epoch=dropped, optimizer_steps=optimizer_steps, rounds=rounds, epochs=epochs,
        rollouts=rounds * batch.completions_per_step if batch else 0,
        pairs_per_step=units_per_step if pairs else 0,
        pairs_per_update=batch.completions_per_update // unit_rows if batch and pairs else 0,
        pairs_per_micro_batch=t.per_device_train_batch_size // unit_rows if batch and pairs else 0,
        warm_start_steps=ws_steps, warm_start_rows_per_step=ws_rows)


def template_call(tokenizer: Any) -> str | None:
    """The assistant turn the tokenizer's chat template writes for `PROBE_CALL` (None: it renders no call)."""
    user = {"role": "user", "content": "What is the weather in Paris?"}
    call = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": PROBE_CALL.name, "arguments": dict(PROBE_CALL.arguments)}}]}
    try:
        before = tokenizer.apply_chat_template([user], tools=[PROBE_TOOL], tokenize=False)
        whole = tokenizer.apply_chat_template([user, call], tools=[PROBE_TOOL], tokenize=False)
    except Exception:  # a template that cannot take tool calls: no call syntax to compare
        return None
    turn = whole[len(before):] if whole.startswith(before) else whole
    return turn if PROBE_CALL.name in turn else None


def call_text(format_name: str) -> str | None:
    """The text format `format_name` writes for `PROBE_CALL` (no reasoning block; None: it cannot)."""
    from cipr.formats import get_format

    try:
        return get_format(format_name).render_target([PROBE_CALL]).strip()
    except ValueError:
        return None


def template_formats(turn: str) -> list[str]:
    """The template-following formats whose call text for `PROBE_CALL` appears in `turn`."""
    from cipr.formats import FORMATS

    return [name for name, cls in FORMATS.items()
            if cls.uses_native_tools and (text := call_text(name)) is not None and text in turn]


def check_call_format(cfg: TrainConfig, tokenizer: Any, template: str, findings: Findings) -> str:
    """The run's call format name, checked against what the chat template (`template`, named in messages)
    renders for a call (module docstring); `auto` resolves from the template's text."""
    from cipr.formats import AUTO, FORMATS, detect_format

    key = "data.call_format" if getattr(cfg.data, "call_format", None) else "model.call_format"
    name = call_format_name(cfg)
    if name == AUTO:
        try:
            name = detect_format(tokenizer)
        except ValueError as e:
            findings.errors.append(f"{key}=auto with the chat template {template}: {e}")
            return name
    cls = FORMATS.get(name)
    if cls is None:
        findings.errors.append(f"{key}={name}: unknown call format (valid: {', '.join(sorted(FORMATS))})")
        return name
    turn = template_call(tokenizer)
    readers = template_formats(turn) if turn else []
    if not cls.uses_native_tools:
        syntax = f"its own call syntax ({', '.join(readers)})" if readers else "no call syntax of its own"
        findings.notes.append(f"{key}={name} writes the tools and calls into the prompt text; the chat "
                              f"template {template} has {syntax}, unused")
        return name
    if turn is None:
        findings.errors.append(f"{key}={name} renders tools through the chat template, but the template "
                               f"{template} renders no tool call: set model.chat_template to the model's own "
                               f"template, or a prompt format (toolrl, compact)")
    elif name not in readers:
        fix = f"set {key}={readers[0]}" if readers else "name the format this template writes"
        shown = call_text(readers[0]) if readers else turn.strip()[:160]
        findings.errors.append(
            f"{key}={name} contradicts the chat template {template}: the template renders a call as "
            f"{shown!r} ({' / '.join(readers) or 'no known format'}), not as {name} writes it "
            f"({call_text(name)!r}); the run would train and parse {name} calls while the prompt asks for "
            f"{readers[0] if readers else 'another syntax'}: {fix}")
    return name


def render_sample(cfg: TrainConfig, tokenizer: Any, format_name: str, examples: Sequence[Any]) -> Any:
    """`examples` rendered as training renders them (every one a training row: no held-out split)."""
    from cipr.formats import get_format
    from cipr.train.data import build_prompts

    data = dataclasses.replace(cfg.data, eval_examples=0)
    return build_prompts(examples, data, cfg.perturb, fmt=get_format(format_name), tokenizer=tokenizer)


def token_lengths(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """Tokens of each text as training counts them (no special tokens added)."""
    if not texts:
        return []
    return [len(ids) for ids in tokenizer(list(texts), add_special_tokens=False)["input_ids"]]


def check_lengths(cfg: TrainConfig, prompts: Sequence[int], targets: Sequence[int], findings: Findings,
                  max_left_out: float) -> dict[str, LengthStats]:
    """Prompt, target and prompt + target lengths against the limits that apply to the run's stages."""
    t, stage = cfg.trainer, _main_stage(cfg)
    limit_p = t.max_prompt_length if stage == "grpo" else None
    limit_c = cfg.rollout.max_completion_length if stage == "grpo" else None
    sft = stage in ("sft", "supervised") or (stage == "grpo" and t.warm_start.steps > 0)
    limit_s = t.warm_start.max_length if sft else None
    stats = {"prompt": length_stats(prompts, limit_p), "target": length_stats(targets, limit_c),
             "prompt_target": length_stats([p + c for p, c in zip(prompts, targets, strict=True)], limit_s)}
    meaning = {"prompt": ("trainer.max_prompt_length", "prompts over it: their units are left out of GRPO"),
               "target": ("rollout.max_completion_length",
                          "reference targets longer than a rollout may be (a completion that says as much "
                          "is cut off)"),
               "prompt_target": ("trainer.warm_start.max_length",
                                 "SFT rows cut at it (targets lose their end)")}
    for key, s in stats.items():
        if not s.over:
            continue
        option, why = meaning[key]
        message = (f"{s.over} of {s.count} sampled rows ({s.share:.1%}) exceed {option}={s.limit} tokens "
                   f"(longest {s.max}): {why}")
        if key != "target" and s.share > max_left_out:  # a rollout is sampled: its limit is the recipe's
            findings.errors.append(f"{message}; more than {max_left_out:.0%} of the sample (cipr-plan's "
                                   f"plan.max_left_out): raise {option}")
        else:
            findings.warnings.append(message)
    return stats


@dataclass
class Preflight:
    """The result of `preflight`: findings, the call format, lengths, the batch plan and the sample used."""

    findings: Findings
    call_format: str
    template: str
    template_call: str | None
    sample_rows: int
    rendered_rows: int
    skipped: dict[str, int]
    lengths: dict[str, LengthStats]
    prompt_lengths: list[int]
    target_lengths: list[int]
    batch: BatchPlan | None
    sample_prompt: str | None = None
    sample_target: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"errors": self.findings.errors, "warnings": self.findings.warnings,
                "notes": self.findings.notes, "call_format": self.call_format, "template": self.template,
                "template_call": self.template_call,
                "sample_rows": self.sample_rows, "rendered_rows": self.rendered_rows, "skipped": self.skipped,
                "lengths": {k: v.to_dict() for k, v in self.lengths.items()},
                "batch": self.batch.to_dict() if self.batch else None,
                "sample_prompt": self.sample_prompt, "sample_target": self.sample_target}


def training_units(cfg: TrainConfig, examples: Sequence[Any], total: int | None, kept_share: float) -> int:
    """Training units of `total` examples (default: all of `examples`): less the held-out and tool-less ones,
    times the share of sampled units that rendered and fit (`kept_share`)."""
    total = len(examples) if total is None else total
    no_tools = sum(len(e.interface) == 0 for e in examples)
    if total != len(examples) and examples:
        no_tools = round(no_tools * total / len(examples))
    usable = max(0, total - min(cfg.data.eval_examples, total) - no_tools)
    return int(usable * kept_share)


def episode_units(cfg: TrainConfig, findings: Findings) -> int:
    """Multi-turn GRPO's training units: the environment's train tasks it uses (`rollout.episode_tasks`, 0:
    all), whatever the data holds (the data feeds the warm start only); a note says so."""
    from cipr.train.episodes import env_factory

    try:
        n = len(env_factory(cfg.env)().tasks("train"))
    except (ConfigError, DataError, OSError, ValueError) as e:
        findings.errors.append(f"env={cfg.env.get('name')}: {e}")
        return 0
    used = min(n, cfg.rollout.episode_tasks) if cfg.rollout.episode_tasks else n
    findings.notes.append(f"rollout.mode=multi_turn: batches are the environment's train tasks ({used} of "
                          f"{n}); the lengths above are the data's (the warm start), not the episodes'")
    return used


def preflight(cfg: TrainConfig, tokenizer: Any, examples: Sequence[Any], *, world: int, template: str = "",
              rows: int = 256, total: int | None = None, max_left_out: float = 0.1) -> Preflight:
    """Checks 2 and 3 of the module docstring on the first `rows` of `examples` (`total`: the size of the
    data they come from when they are only a sample of it). Findings are collected, not raised: call
    `.findings.check()` to refuse a failing run."""
    from cipr.formats import FORMATS

    findings = Findings()
    template = template or "of the tokenizer"
    turn = template_call(tokenizer)
    if cfg.algo.name == "distill":
        findings.notes.append("algo=distill: its trajectories are not rendered here (cipr/distill/data.py "
                              "checks them when the run reads them)")
        size = len(examples) if total is None else total
        batch = None
        if size:
            batch = batch_plan(cfg, size - min(cfg.data.eval_examples, size), world, findings)
        else:
            findings.notes.append("algo=distill: the number of trajectories is not known before they are "
                                  "read")
        return Preflight(findings, call_format_name(cfg), template, turn, 0, 0, {}, {}, [], [], batch)
    name = check_call_format(cfg, tokenizer, template, findings)
    sample = list(examples[:rows])
    prompts_p: list[int] = []
    targets_c: list[int] = []
    skipped: dict[str, int] = {}
    rendered = 0
    first_prompt = first_target = None
    if name in FORMATS:
        try:
            rendered_set = render_sample(cfg, tokenizer, name, sample)
        except (ConfigError, DataError, ValueError) as e:
            findings.errors.append(f"rendering the first {len(sample)} examples with {name}: {e}")
        else:
            records = rendered_set.records
            rendered, skipped = len(records), dict(rendered_set.skipped)
            prompts_p = token_lengths(tokenizer, [r.prompt for r in records])
            targets_c = token_lengths(tokenizer, [r.target for r in records])
            if records:
                first_prompt, first_target = records[0].prompt, records[0].target
    lengths = check_lengths(cfg, prompts_p, targets_c, findings, max_left_out) if prompts_p else {}
    unit = cfg.perturb.unit_size
    kept = 1.0
    if sample and rendered:
        units_rendered = rendered // unit
        over = lengths["prompt"].over if lengths and lengths["prompt"].limit else 0
        no_tools = sum(len(e.interface) == 0 for e in sample)
        kept = max(0.0, (units_rendered - over / unit) / max(1, len(sample) - no_tools))
    units = training_units(cfg, sample if total is not None else examples, total, min(1.0, kept))
    estimated = total is not None or len(sample) < len(examples) or kept < 1.0
    if getattr(cfg.rollout, "multi_turn", False):
        units = episode_units(cfg, findings)
        estimated = False
    batch = batch_plan(cfg, units, world, findings, estimated=estimated)
    return Preflight(findings, name, template, turn, len(sample), rendered, skipped, lengths, prompts_p,
                     targets_c, batch, first_prompt, first_target)
