"""`make_plan`: a dry run of one cipr-train command on this CPU, without weights or network.

The overrides are composed exactly as cipr-train composes them, then: the model is built without weights
(`cipr.plan.model`), the prompts and the batches are checked as cipr-train checks them before loading
weights (`cipr.train.preflight`), the per-GPU memory is estimated under the strategy and number of
processes (`cipr.plan.memory`), and the time from stated throughputs (`cipr.plan.cost`). Every defect that
would stop or waste the GPU run is an error naming the option to change; `Plan.table` is the terminal
summary and `Plan.to_dict` is plan.json.

Where the GPU node has what this machine lacks (the weights, the data file, vLLM), the plan says so and
goes on: the architecture comes from the shipped config.json, the prompts from the shipped samples (ToolRL's
80-row test split for data.source=toolrl; generated examples for synthetic data), and the number of
training rows from the source's documented size (`DOCUMENTED_ROWS`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cipr.core.config import ConfigError
from cipr.plan import cost, memory
from cipr.plan.model import architecture, meta_model, model_name, shape, tokenizer_for
from cipr.train.preflight import Findings, Preflight, preflight

DOCUMENTED_ROWS = {"toolrl": 3920, "toolrl_sft": 400}
"""Rows of a source's full file when it is not here (configs/train/data/toolrl.yaml, toolrl_sft.yaml)."""
HEAD_TILE = (4096, 32768)
"""Positions x vocabulary columns of one tile of TRL's chunked output head (`trl.kernels.chunked_logprob`)."""


@dataclass
class PlanOptions:
    """cipr-plan's own options, given as `plan.KEY=VALUE` (everything else is a cipr-train override).

    - `gpu_memory_gb`: memory of one card in GB (2^30 bytes); each process's peak is compared with it.
    - `gpu`: the card whose datasheet throughputs the time estimate uses.
    - `rows`: data rows rendered and counted (the first ones of the configured data).
    - `max_left_out`: a share of sampled rows over a length limit above it is an error (below, a warning).
    - `out`: the plan.json to write; null: trainer.run_dir/plan.json; an empty string: none.
    """

    gpu_memory_gb: float = 80.0
    gpu: Literal["h100", "h200", "a100"] = "h100"
    rows: int = 64
    max_left_out: float = 0.1
    out: str | None = None


@dataclass
class Plan:
    """What `make_plan` found; `ok` when no error."""

    overrides: list[str]
    options: PlanOptions
    findings: Findings = field(default_factory=Findings)
    config: Any = None
    facts: dict[str, Any] = field(default_factory=dict)
    preflight: Preflight | None = None

    @property
    def ok(self) -> bool:
        return not self.findings.errors

    def to_dict(self) -> dict[str, Any]:
        from cipr.core.config import to_dict

        return {"overrides": self.overrides, "options": dataclasses.asdict(self.options), "ok": self.ok,
                "errors": self.findings.errors, "warnings": self.findings.warnings,
                "notes": self.findings.notes,
                **self.facts, "preflight": self.preflight.to_dict() if self.preflight else None,
                "config": to_dict(self.config) if self.config is not None else None}

    def table(self) -> str:
        """The terminal summary."""
        from cipr.plan.report import table

        return table(self)


def _compose(overrides: Sequence[str]) -> Any:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from cipr.train.config import compose_train

    try:
        return compose_train([o for o in overrides if not o.startswith("hydra.")])
    except ConfigError as e:
        raise ConfigError(str(e).replace("`cipr-train --help`", "`cipr-plan --help`")) from None
    except (HydraException, OmegaConfBaseException) as e:
        text = " ".join(str(e).split()) or type(e).__name__
        raise ConfigError(f"the overrides do not compose as cipr-train's: {text}") from None


def _strategy(cfg: Any, world: int, findings: Findings) -> str:
    """The strategy as run (none on several processes is DDP); a sharded one on one process is an error."""
    from cipr.train.strategy import strategy_mismatch, validate_distributed

    try:
        validate_distributed(cfg.distributed)
    except ConfigError as e:
        findings.errors.append(str(e))
    strategy = cfg.distributed.strategy
    if strategy == "none" and world > 1:
        strategy = "ddp"
    problem = strategy_mismatch(strategy, world, strategy, world) if strategy != "none" else None
    if problem:
        findings.errors.append(problem)
    return strategy


def _sample(cfg: Any, rows: int, findings: Findings) -> tuple[list[Any], int | None, str]:
    """The first `rows` examples of the configured data (or of the shipped sample), the full data's size when
    it differs from what was read (None: what was read is all), and what was read."""
    from cipr.data.paths import data_root
    from cipr.train.data import check_source, load_source

    data = cfg.data
    if cfg.algo.name == "distill":
        return [], (data.n if data.path is None else None), "algo=distill trajectories (not rendered)"
    try:
        path = check_source(data)
    except ConfigError as e:
        if data.source not in DOCUMENTED_ROWS and data.source != "messages":
            findings.errors.append(str(e))
            return [], 0, "none"
        shipped = {"toolrl": data_root() / "toolrl" / "rlla_4k" / "test.parquet"}.get(data.source)
        total = data.n or DOCUMENTED_ROWS.get(data.source, 0)
        findings.notes.append(f"data.path: {e} The plan renders the shipped sample instead and assumes "
                              f"{total} rows (the source's documented size); pass data.path= on the GPU "
                              f"node.")
        if shipped is not None and shipped.is_file():
            sample = dataclasses.replace(data, path=str(shipped), n=rows)
            return load_source(sample)[0][:rows], total, f"shipped sample {shipped} (data.path absent)"
        from cipr.data.synthetic import SyntheticConfig

        findings.warnings.append("no sample of the configured data here: the prompts are generated examples")
        return SyntheticConfig(n=rows, seed=data.seed).generate(), total, "generated examples (no data here)"
    examples = load_source(data)[0]
    where = str(path) if path else f"{data.source} (generated, n={data.n})"
    return examples, None, where


def _checks_without_data(cfg: Any, findings: Findings) -> None:
    """cipr-train's `validate` checks that hold on any machine (weights, vLLM and precision are the
    node's)."""
    from cipr.runtime.model import resolve_source
    from cipr.train.algo import DistillConfig, validate_algo, validate_distill

    try:
        if isinstance(cfg.algo, DistillConfig):
            validate_distill(cfg.algo, cfg.model.lora.enabled, cfg.perturb)
        else:
            validate_algo(cfg.algo, cfg.perturb)
    except ConfigError as e:
        findings.errors.append(str(e))
    if cfg.algo.reads_actions and cfg.model.attn_implementation not in ("sdpa", "eager"):
        findings.errors.append(f"algo={cfg.algo.name} reads action distributions with a tree-shaped mask, "
                               f"which needs model.attn_implementation=sdpa or eager")
    try:
        resolve_source(cfg.model)
    except ConfigError:
        findings.notes.append(f"the weights of {model_name(cfg.model)} are not here: the GPU node needs them "
                              f"(hf download {model_name(cfg.model)}, with the same HF_HOME)")


def _precision(cfg: Any) -> tuple[str, int, int]:
    """(precision on a GPU, bytes of the weights' dtype, bytes of the compute dtype)."""
    precision = "bf16" if cfg.trainer.precision == "auto" else cfg.trainer.precision
    dtype = cfg.model.dtype if cfg.model.dtype != "auto" else "bfloat16"
    weight_bytes = memory.DTYPE_BYTES[dtype]
    return precision, weight_bytes, 2 if precision in ("bf16", "fp16") else weight_bytes


def supervised_activations(*, rows: int, read_rows: int, seq: int, target: int, trained_layers: int,
                           hidden: int, intermediate: int, kv_dim: int, vocab: int, compute_bytes: int,
                           action_supervision: bool, checkpointing: bool) -> memory.Activations:
    """Activations of one micro-batch of the supervised regime (`cipr.train.supervised`): `rows` sequences of
    `seq` tokens, `target` of each scored, and `read_rows` of them (the canonical ones, when a rescoring term
    trains) read again relabeled, with gradients. With c = `compute_bytes`, b = rows, r = read_rows, s = seq,
    t = target, Lt = `trained_layers` and A1(n) = c·n·s·(12h + 3kv + 4I) (`cipr.plan.memory`):

        layers = Lt·c·(b + r)·s·h + 2·A1(b)   the trained layers keep only their inputs, in the SFT forward
                                              and in the relabeled read, and are recomputed in backward one
                                              at a time (the regime does so without
                                              trainer.gradient_checkpointing, bit-identically)
        logits = 2·4·b·t·V                    with action supervision (`algo.action_weight` > 0): the
                                              reader's float32 logits and log-softmax at the target tokens
               = 2·4·min(b·t, 4096)·min(V, 32768)   else TRL's chunked head at the target positions: one
                                              float32 tile forward and one in backward
        mask   = c·(r or b)·s²                the reader's tree mask under trainer.gradient_checkpointing (its
                                              "packed" mode); else 0 (a mask over the name tries only)

    The canonical read of the term without gradients and the name tries are left out (small)."""
    c, b, r, s = compute_bytes, rows, read_rows, seq
    per_layer = c * b * s * (12 * hidden + 3 * kv_dim + 4 * intermediate)
    stored = trained_layers * c * (b + r) * s * hidden + 2 * per_layer
    if action_supervision:
        logits = 2 * 4 * b * target * vocab
    else:
        logits = 2 * 4 * min(b * target, HEAD_TILE[0]) * min(vocab, HEAD_TILE[1])
    mask = c * (r or b) * s * s if checkpointing and (r or action_supervision) else 0
    return memory.Activations(b, s, target, float(stored), float(logits), float(mask))


def _supervised(cfg: Any, s: Any, *, rows: int, seq: int, target: int, compute: int, action_weight: float,
                reads: bool) -> memory.Activations:
    """`supervised_activations` of a supervised stage (or a warm start with action supervision) of `cfg`."""
    model = cfg.model
    trained = s.layers if model.lora.enabled else s.layers - (model.freeze_bottom_layers or 0)
    read_rows = rows // cfg.perturb.unit_size if reads else 0
    return supervised_activations(rows=rows, read_rows=read_rows, seq=seq, target=target,
                                  trained_layers=trained, hidden=s.hidden, intermediate=s.intermediate,
                                  kv_dim=s.kv_dim, vocab=s.vocab, compute_bytes=compute,
                                  action_supervision=action_weight > 0,
                                  checkpointing=cfg.trainer.gradient_checkpointing)


def _trains_rescore(cfg: Any) -> bool:
    """Whether a rescoring term of `cfg.algo` trains (weight > 0): its relabeled read keeps a graph."""
    try:
        terms = cfg.algo.objective().terms
    except ConfigError:
        return False
    return any(t.kind == "rescore" and t.weight > 0 for t in terms)


def _stage_activations(cfg: Any, pre: Preflight, s: Any, compute: int) -> dict[str, memory.Activations]:
    """Activations of each stage's micro-batch at its length limits (or the sample's longest row); the
    supervised regime's (`supervised_activations`) at the sample's longest row, up to the limit."""
    t, batch = cfg.trainer, pre.batch
    lengths = pre.lengths
    longest = lengths["prompt_target"].max if lengths else t.warm_start.max_length or 2048
    target = min(lengths["target"].max, longest) if lengths else longest
    padded = min(t.warm_start.max_length or longest, longest)
    common = {"layers": s.layers, "hidden": s.hidden, "intermediate": s.intermediate, "kv_dim": s.kv_dim,
              "vocab": s.vocab, "compute_bytes": compute, "checkpointing": t.gradient_checkpointing}
    out = {}
    stage = batch.stage if batch else "grpo"
    if stage == "grpo":
        prompt = t.max_prompt_length or (lengths["prompt"].max if lengths else 2048)
        completion = cfg.rollout.max_completion_length
        out["grpo"] = memory.activations(batch=t.per_device_train_batch_size, seq=prompt + completion,
                                         scored=completion, tree_mask=cfg.algo.reads_actions, **common)
    else:
        per_device = t.per_device_train_batch_size * (batch.unit_size if stage == "supervised" and
                                                      cfg.algo.pairing_budget == "prompts" else 1)
        seq = t.warm_start.max_length or longest
        if stage == "supervised":
            out[stage] = _supervised(cfg, s, rows=per_device, seq=padded, target=target, compute=compute,
                                     action_weight=cfg.algo.action_weight, reads=_trains_rescore(cfg))
        else:
            out[stage] = memory.activations(batch=per_device, seq=seq, scored=seq,
                                            tree_mask=cfg.algo.reads_actions, **common)
    if batch and batch.warm_start_steps:
        seq = t.warm_start.max_length or longest
        ws_rows = t.warm_start.per_device_train_batch_size
        if t.warm_start.action_weight > 0:  # the supervised trainer, on the canonical rows only
            out["warm_start"] = _supervised(cfg, s, rows=ws_rows, seq=padded, target=target, compute=compute,
                                            action_weight=t.warm_start.action_weight, reads=False)
        else:
            out["warm_start"] = memory.activations(batch=ws_rows, seq=seq, scored=seq, tree_mask=False,
                                                   **common)
    return out


def _memory(plan: Plan, cfg: Any, s: Any, strategy: str, world: int, pre: Preflight) -> None:
    """Per-GPU memory, vLLM's share and the verdict against plan.gpu_memory_gb (cipr.plan.memory)."""
    findings, card = plan.findings, plan.options.gpu_memory_gb * memory.GB
    precision, weight_bytes, compute = _precision(cfg)
    states = memory.model_states(strategy, world, s.params, s.trainable, weight_bytes,
                                 sixteen_bit=precision in ("bf16", "fp16"), largest_module=s.largest_module,
                                 largest_block=s.largest_block, tail=s.embedding)
    teacher = 0.0
    if cfg.algo.name == "distill":  # the frozen released model, whole on every process
        teacher = s.params * (2 if cfg.algo.teacher_dtype == "bfloat16" else weight_bytes)
    extra = memory.buffers(strategy, world, s.trainable, weight_bytes)
    acts = _stage_activations(cfg, pre, s, compute)
    peak_stage = max(acts, key=lambda k: acts[k].total)
    trainer = states.total + teacher + extra + acts[peak_stage].total + memory.CONTEXT_GB * memory.GB
    share = None
    batch = pre.batch
    if cfg.rollout.backend == "vllm_colocate" and batch is not None and batch.grpo is not None:
        lengths = pre.lengths
        prompt = cfg.trainer.max_prompt_length or (lengths["prompt"].max if lengths else 2048)
        seq = prompt + cfg.rollout.max_completion_length
        max_len = cfg.rollout.max_model_length or s.max_positions
        share = memory.vllm_share(card=card, utilization=cfg.rollout.gpu_memory_utilization,
                                  weights=s.params * weight_bytes / cfg.rollout.tensor_parallel_size,
                                  kv_bytes_per_token=s.kv_bytes_per_token,
                                  state_bytes_per_seq=s.state_bytes_per_seq,
                                  max_model_len=max_len, seq_len=seq,
                                  seqs_per_process=batch.grpo.completions_per_step // world)
        need = max_len * s.kv_bytes_per_token + s.state_bytes_per_seq
        if share.kv_cache < need:
            findings.errors.append(
                f"vLLM's share (rollout.gpu_memory_utilization={cfg.rollout.gpu_memory_utilization} x "
                f"{plan.options.gpu_memory_gb:g} GB = {memory.gb(share.share)} GB) leaves "
                f"{memory.gb(share.kv_cache)} GB of KV cache after the weights ({memory.gb(share.weights)} "
                f"GB) and overhead, less than one sequence of max_model_len={max_len} tokens needs "
                f"({memory.gb(need)} GB): vLLM refuses to start. Raise rollout.gpu_memory_utilization or set "
                f"rollout.max_model_length={seq}")
        if cfg.rollout.max_model_length is not None and cfg.rollout.max_model_length < seq:
            findings.errors.append(f"rollout.max_model_length={cfg.rollout.max_model_length} is shorter than "
                                   f"a prompt ({prompt}) plus a completion "
                                   f"({cfg.rollout.max_completion_length})")
    budget = card - (share.share if share else 0.0)
    verdict = "fits" if trainer <= budget else "does not fit"
    if trainer > budget:
        shared = f" after vLLM's {memory.gb(share.share)} GB" if share else ""
        fixes = ["shard it (distributed=zero2, zero3 or fsdp with launcher.num_processes=N)",
                 "lower trainer.per_device_train_batch_size"]
        if not cfg.trainer.gradient_checkpointing:
            fixes.insert(0, "set trainer.gradient_checkpointing=true")
        if share:
            fixes.append("lower rollout.gpu_memory_utilization")
        findings.errors.append(
            f"distributed={strategy} on {world} process(es) needs {memory.gb(trainer)} GB per GPU for "
            f"training (model states {memory.gb(states.total)}, activations "
            f"{memory.gb(acts[peak_stage].total)} in {peak_stage}), more than the {memory.gb(budget)} GB "
            f"left{shared} on a {plan.options.gpu_memory_gb:g} GB card (plan.gpu_memory_gb): "
            + ", or ".join(fixes))
    elif trainer > 0.9 * budget:
        findings.warnings.append(
            f"tight: training needs {memory.gb(trainer)} of the {memory.gb(budget)} GB left per GPU; the "
            f"activation estimate is approximate (not measured on a GPU), so leave room: a smaller "
            f"trainer.per_device_train_batch_size, rollout.gpu_memory_utilization or a sharded strategy")
    plan.facts["memory"] = {
        "unit": "GB = 2^30 bytes", "strategy": strategy, "processes": world, "precision": precision,
        "model_states": {k: memory.gb(v) for k, v in states.to_dict().items()}, "teacher": memory.gb(teacher),
        "buffers": memory.gb(extra),
        "activations": {k: {f: memory.gb(v) if isinstance(v, float) else v for f, v in a.to_dict().items()}
                        for k, a in acts.items()},
        "peak_stage": peak_stage, "context": memory.CONTEXT_GB, "trainer_peak": memory.gb(trainer),
        "vllm": ({k: memory.gb(v) if isinstance(v, float) else v for k, v in share.to_dict().items()}
                 if share else None),
        "budget": memory.gb(budget), "card": plan.options.gpu_memory_gb, "verdict": verdict}


def _time(plan: Plan, cfg: Any, s: Any, world: int, pre: Preflight) -> None:
    """The GRPO stage's tokens per round and wall-time range (cipr.plan.cost); an estimate."""
    batch = pre.batch
    if batch is None or batch.grpo is None or not pre.lengths:
        return
    card = cost.CARDS[plan.options.gpu]
    t, g = cfg.trainer, batch.grpo
    _, weight_bytes, _ = _precision(cfg)
    vllm = (plan.facts.get("memory") or {}).get("vllm") or {}
    old = (g.steps_per_generation > g.gradient_accumulation_steps or t.num_iterations > 1
           or (cfg.rollout.uses_vllm and cfg.rollout.importance_sampling_correction))
    k = cost.train_flops_factor(checkpointing=t.gradient_checkpointing, old_logps=old,
                                second_read=cfg.algo.reads_actions and t.entropy_coeff > 0)
    seqs = g.completions_per_step // world
    completion = (min(pre.lengths["target"].mean, cfg.rollout.max_completion_length),
                  float(cfg.rollout.max_completion_length))
    step = cost.step_time(card, params=s.params, weight_bytes=s.params * weight_bytes, seqs=seqs,
                          prompt=pre.lengths["prompt"].mean, completion=completion,
                          kv_bytes_per_token=s.kv_bytes_per_token, concurrent=vllm.get("concurrent") or seqs,
                          k=k)
    fast, slow = step.total_s
    plan.facts["time"] = {
        "estimate": True, "card": dataclasses.asdict(card), "processes": world,
        "efficiencies": {"train": cost.TRAIN_EFFICIENCY, "prefill": cost.PREFILL_EFFICIENCY,
                         "decode": cost.DECODE_EFFICIENCY},
        "per_round": step.to_dict(), "rounds": batch.rounds,
        "run_hours": (cost.hours(fast * batch.rounds), cost.hours(slow * batch.rounds)),
        "gpu_hours": (cost.hours(fast * batch.rounds * world), cost.hours(slow * batch.rounds * world))}


def make_plan(overrides: Sequence[str], options: PlanOptions | None = None) -> Plan:
    """The plan of one cipr-train command (module docstring). Bad overrides raise ConfigError; every defect of
    a composed config is collected in `Plan.findings`."""
    options = options or PlanOptions()
    if options.gpu_memory_gb <= 0 or options.rows < 1 or not 0 <= options.max_left_out <= 1:
        raise ConfigError("plan.gpu_memory_gb must be > 0, plan.rows >= 1 and plan.max_left_out in [0, 1]")
    plan = Plan(list(overrides), options)
    cfg = plan.config = _compose(overrides)
    findings = plan.findings
    world = cfg.launcher.num_processes
    strategy = _strategy(cfg, world, findings)
    _checks_without_data(cfg, findings)
    arch = architecture(cfg.model)
    s = shape(meta_model(arch), cfg.model)
    tok = tokenizer_for(cfg.model, arch)
    if s.attention_layers < s.layers:
        findings.notes.append(
            f"{s.layers - s.attention_layers} of {s.layers} layers are linear attention: transformers "
            f"runs them with hub kernels (flash-linear-attention, causal-conv1d) where it can fetch them, "
            f"else with a slow torch fallback (fetch them before going offline); the activation estimate "
            f"counts them as attention layers and vLLM keeps their fixed state per sequence")
    examples, total, read = _sample(cfg, options.rows, findings)
    pre = plan.preflight = preflight(cfg, tok.tokenizer, examples, world=world, template=tok.template,
                                     rows=options.rows, total=total, max_left_out=options.max_left_out)
    findings.errors += pre.findings.errors
    findings.warnings += pre.findings.warnings
    findings.notes += pre.findings.notes
    plan.facts.update({
        "model": {"name": arch.name, "architecture": arch.source, "class": type(meta_model(arch)).__name__,
                  **s.to_dict()},
        "tokens": {"tokenizer": tok.label, "exact": tok.exact, "chat_template": tok.template},
        "data": {"source": cfg.data.source, "read": read, "rows_assumed": total}})
    _memory(plan, cfg, s, strategy, world, pre)
    _time(plan, cfg, s, world, pre)
    return plan


def write_plan(plan: Plan) -> Path | None:
    """plan.json where `plan.out` says (default: the run folder); None when none is written."""
    out = plan.options.out
    if out == "":
        return None
    path = Path(out) if out else Path(plan.config.trainer.run_dir) / "plan.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(plan.to_dict(), indent=2, default=str) + "\n", encoding="utf-8")
    return path
