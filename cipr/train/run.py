"""One training run of any algorithm: validate, then its stages (an SFT warm start first where configured).

    run_dir/
      config.json, config.yaml   the resolved configuration
      stages.json      the stages this run trains, in order, and the one whose final/ is its result (read by
                       cipr-export and the experiment drivers: `cipr.core.run_folder.read_result_stage`)
      metrics.jsonl    one line per optimizer step of every stage, plus eval and stage-end lines
      summary.json     what ran, final metrics per stage, held-out probes (before/after the warm start and
                       GRPO) or algo=distill's evaluation, peak memory, wall time of the invocation that
                       wrote it and over every invocation of the run (a stopped and resumed run adds up)
      wall_time.json   that total and how many invocations made it, kept across resumes
                       (`cipr.core.run_folder.read_wall_time`)
      warm_start/      SFT stage: checkpoint-<step>/ (HF format), latest.json, final/, stage.json (or a
                       folder shared by many runs: trainer.warm_start.shared_dir, cipr/train/warm_start.py)
      grpo/, sft/, supervised/ or distill/   the algorithm's stage, same layout (supervised/:
                       algo.regime=supervised; distill/ and its eval/ folder: cipr/train/distill.py)

With `model.freeze_bottom_layers`, checkpoint-<step>/ and final/ hold the trainable tensors only
(cipr/train/checkpoint.py); `cipr-export` of the run folder writes the full model.

Everything that can be checked without a model is checked first (`validate`): unknown keys,
impossible combinations, model and data paths, call format, rollout backend, resume target.
`trainer.resume=auto` continues the first unfinished stage and skips finished ones; a run folder
started with a different model, data, algorithm or rollout config is refused rather than mixed.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from cipr.core.config import ConfigError, to_dict
from cipr.core.run_folder import prepare, read_wall_time, write_stages, write_wall_time
from cipr.distill.data import check_data
from cipr.runtime.model import resolve_source
from cipr.train.algo import DistillConfig, validate_algo, validate_distill
from cipr.train.checkpoint import (
    drop_step_checkpoints,
    latest_complete,
    load_trained,
    resolve_resume,
    stage_done,
)
from cipr.train.config import TrainConfig, call_format_name, config_from_dict
from cipr.train.data import PromptSet, build_prompts, check_source, load_source
from cipr.train.metrics import MetricsWriter, peak_memory_gb
from cipr.train.rollout import check_backend, grpo_kwargs
from cipr.train.schedule import (
    GrpoBatch,
    common_args,
    grpo_batch,
    precision_flags,
    validate_schedule,
    world_size,
)
from cipr.train.stage import run_stage
from cipr.train.strategy import sharded, validate_distributed
from cipr.train.warm_start import claim, stage_dir, validate_shared, warm_start_prompts

if TYPE_CHECKING:
    from cipr.train.grpo import RolloutSource

__all__ = ["TrainConfig", "batch_geometry", "config_from_dict", "grpo_args", "result_stage", "run",
           "validate"]

log = logging.getLogger("cipr.train")

COMPARED_SECTIONS = ("model", "data", "algo", "perturb", "rollout")  # algo=distill: all but rollout


def _stages(cfg: TrainConfig) -> list[str]:
    if cfg.algo.name in ("sft", "distill"):
        return [cfg.algo.name]
    main = "supervised" if cfg.algo.supervised else "grpo"
    return (["warm_start"] if cfg.trainer.warm_start.steps > 0 else []) + [main]


def result_stage(cfg: TrainConfig) -> str:
    """The stage whose `final/` holds the run's result (the last one: sft, grpo, supervised or distill)."""
    return _stages(cfg)[-1]


def _stage_dir(cfg: TrainConfig, run_dir: Path, stage: str) -> Path:
    return stage_dir(cfg, run_dir) if stage == "warm_start" else run_dir / stage


def _own_stages(cfg: TrainConfig) -> list[str]:
    """The stages trained in this run's folder (a shared warm start is not one)."""
    return [s for s in _stages(cfg) if s != "warm_start" or not cfg.trainer.warm_start.shared_dir]


def validate(cfg: TrainConfig) -> None:
    """Every check that needs neither model nor data in memory; raises ConfigError with the fix."""
    if isinstance(cfg.algo, DistillConfig):
        validate_distill(cfg.algo, cfg.model.lora.enabled, cfg.perturb)
        check_data(cfg.data)
        validate_schedule(cfg.trainer, 1)
    else:
        validate_algo(cfg.algo, cfg.perturb)
        check_source(cfg.data)
        if cfg.perturb.mask_length < 2:
            raise ConfigError("perturb.mask_length must be >= 2")
        generations = cfg.rollout.num_generations if cfg.algo.uses_grpo else 1
        validate_schedule(cfg.trainer, 1 if cfg.algo.name == "sft" else cfg.perturb.unit_size * generations)
        if cfg.algo.uses_grpo:
            batch_geometry(cfg)
            check_backend(cfg.rollout)
        from cipr.train.episodes import validate_env

        validate_env(cfg.env, cfg.rollout, cfg.algo)
    validate_distributed(cfg.distributed)
    validate_shared(cfg)
    if cfg.logging.trace and (isinstance(cfg.algo, DistillConfig) or not cfg.algo.supervised
                              or not cfg.algo.objective().uses("rescore")):
        raise ConfigError("logging.trace=true traces the rescoring terms of the supervised regime on each "
                          "step's own pairs (algo=cipr_sft, or algo=cipr algo.regime=supervised); this run "
                          "has none: set logging.trace=false")
    precision_flags(cfg.trainer.precision)
    resolve_source(cfg.model)
    from cipr.formats import AUTO, get_format

    try:
        if call_format_name(cfg) != AUTO:  # auto: read from the tokenizer's chat template once it is loaded
            get_format(call_format_name(cfg))
    except ValueError as e:
        raise ConfigError(f"{_format_key(cfg)}: {e}") from e
    if cfg.logging.wandb.mode != "disabled":
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            raise ConfigError("logging.wandb.mode is not disabled but wandb is not installed: pip install "
                              "wandb, or set logging.wandb.mode=disabled")
    if cfg.trainer.resume not in ("auto", "never"):
        resolve_resume(cfg.trainer.resume, Path(cfg.trainer.run_dir))
    if cfg.algo.reads_actions and cfg.model.attn_implementation not in ("sdpa", "eager"):
        raise ConfigError(f"algo={cfg.algo.name} reads action distributions with a tree-shaped attention "
                          f"mask, which needs model.attn_implementation=sdpa or eager (got "
                          f"{cfg.model.attn_implementation})")
    if cfg.trainer.resume == "never":
        for stage in _own_stages(cfg):
            resolve_resume("never", Path(cfg.trainer.run_dir) / stage)
    elif cfg.trainer.resume == "auto":  # a damaged checkpoint without a complete one before it fails here
        for stage in _stages(cfg):
            if not stage_done(_stage_dir(cfg, Path(cfg.trainer.run_dir), stage)):
                latest_complete(_stage_dir(cfg, Path(cfg.trainer.run_dir), stage))


def _format_key(cfg: TrainConfig) -> str:
    return "data.call_format" if getattr(cfg.data, "call_format", None) else "model.call_format"


def _call_format(cfg: TrainConfig, tokenizer: Any) -> Any:
    """The run's call format, `auto` read from the tokenizer's chat template."""
    from cipr.formats import resolve_format

    try:
        fmt = resolve_format(call_format_name(cfg), tokenizer)
    except ValueError as e:
        raise ConfigError(f"{_format_key(cfg)}: {e}") from e
    log.info("call format %s (%s=%s)", fmt.name, _format_key(cfg), call_format_name(cfg))
    return fmt


def _started(cfg: TrainConfig, run_dir: Path) -> bool:
    """Whether `run_dir` holds progress of this run's stages (a complete checkpoint or a finished stage)."""
    return any(latest_complete(run_dir / s) or stage_done(run_dir / s) for s in _own_stages(cfg))


def _records(writer: MetricsWriter, **match: Any) -> list[dict[str, Any]]:
    return [r for r in writer.read() if all(r.get(k) == v for k, v in match.items())]


def run(cfg: TrainConfig, *, rollout_source: RolloutSource | None = None) -> Path:
    """Run every stage of `cfg` (resuming where a previous run stopped) and return the run folder.
    `rollout_source`: what stands in for GRPO's sampling (`cipr.train.grpo`; e.g. `cipr.train.replay`)."""
    validate(cfg)
    started = time.time()
    if cfg.trainer.torch_threads:
        torch.set_num_threads(cfg.trainer.torch_threads)
    run_dir = Path(cfg.trainer.run_dir).expanduser()
    compared = tuple(s for s in COMPARED_SECTIONS if s != "rollout" or cfg.algo.name != "distill")
    if cfg.rollout.multi_turn:
        compared = (*compared, "env")
    main = prepare(run_dir, to_dict(cfg), compared, lambda: _started(cfg, run_dir))
    if main:
        write_stages(run_dir, _stages(cfg))
    earlier = read_wall_time(run_dir) if main else (0.0, 0)  # a malformed record stops the run here
    writer = MetricsWriter(run_dir, cfg.logging.wandb, to_dict(cfg), enabled=main)
    unrecorded = main  # this invocation's time is still to be added to wall_time.json
    try:
        if cfg.algo.name == "distill":
            from cipr.train.distill import run_distill

            entries = run_distill(cfg, run_dir, writer, lambda tokenizer: _call_format(cfg, tokenizer))
        else:
            entries = _run_prompts(cfg, run_dir, writer, rollout_source)
        if entries is None:  # every stage was already complete: this invocation did no work
            unrecorded = False
        elif writer.enabled:
            seconds = time.time() - started
            total, invocations = write_wall_time(run_dir, earlier, seconds)
            unrecorded = False
            _write_summary(cfg, run_dir, writer, entries, seconds, total, invocations)
        return run_dir
    finally:
        writer.close()
        if unrecorded:  # stopped (a preemption signal) or failed: its time still counts toward the total
            write_wall_time(run_dir, earlier, time.time() - started)


def _write_summary(cfg: TrainConfig, run_dir: Path, writer: MetricsWriter, entries: dict[str, Any],
                   seconds: float, total: float, invocations: int) -> None:
    """summary.json: what ran, each stage's last step line, the algorithm's `entries`, memory, and the wall
    time of this invocation (`seconds`) and of all `invocations` of the run (`total`, wall_time.json)."""
    stages = _stages(cfg)
    steps = [r for r in writer.read() if r.get("kind") == "step"]
    summary = {"run_dir": str(run_dir), "algo": cfg.algo.name,
               "stages": {s: stage_done(_stage_dir(cfg, run_dir, s)) for s in stages},
               "final": {s: next((r for r in reversed(steps) if r["stage"] == s), None) for s in stages},
               **entries, "peak_memory_gb": peak_memory_gb(),
               "wall_seconds_this_invocation": seconds, "wall_seconds_total": total,
               "invocations": invocations}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))


def _preflight(cfg: TrainConfig, examples: list[Any]) -> None:
    """cipr-plan's prompt and batch checks (cipr/train/preflight.py) with the run's tokenizer, before any
    weights load: a run that fails them is refused (ConfigError), its warnings logged. Every rank runs it
    and gets the same answer."""
    from cipr.runtime.model import load_tokenizer
    from cipr.train.preflight import preflight

    result = preflight(cfg, load_tokenizer(cfg.model), examples, world=world_size(cfg.launcher))
    for warning in result.findings.warnings:
        log.warning("preflight: %s", warning)
    result.findings.check()


def _run_prompts(cfg: TrainConfig, run_dir: Path, writer: MetricsWriter,
                 rollout_source: RolloutSource | None = None) -> dict[str, Any] | None:
    """The stages of a prompt-based algorithm; the summary's entries of the run (None: it was complete)."""
    stages = _stages(cfg)
    pending = [s for s in stages if not stage_done(_stage_dir(cfg, run_dir, s))]
    if not pending:
        log.info("every stage of %s is already complete; nothing to do", run_dir)
        return None

    examples, load_skipped = load_source(cfg.data)
    _preflight(cfg, examples)  # cipr-plan's prompt and batch checks, before any weights load
    source = cfg.model.name_or_path or f"{cfg.model.gguf_package}/{cfg.model.gguf_file}"
    log.info("loading model (%s)", source)
    weights = None
    if stages[0] == "warm_start" and "warm_start" not in pending:  # the main stage starts from its final/
        weights = _stage_dir(cfg, run_dir, "warm_start") / "final"
    model, tokenizer = load_trained(cfg.model, weights)
    fmt = _call_format(cfg, tokenizer)
    prompts = build_prompts(examples, cfg.data, cfg.perturb, fmt=fmt, tokenizer=tokenizer,
                            skipped=load_skipped)
    if cfg.algo.uses_grpo and cfg.trainer.max_prompt_length is not None:
        prompts = prompts.without_long_prompts(tokenizer, cfg.trainer.max_prompt_length)
    if prompts.skipped:
        log.warning("skipped %d of %d examples: %s", sum(prompts.skipped.values()), len(examples),
                    dict(prompts.skipped))
    log.info("%d training prompts (%d units of %d), %d held out", len(prompts.records),
             len(prompts.records) // prompts.unit_size, prompts.unit_size, len(prompts.eval_records))

    if "warm_start" in pending or "sft" in pending:
        stage = "sft" if cfg.algo.name == "sft" else "warm_start"
        sft_prompts = warm_start_prompts(cfg, examples, fmt, tokenizer, prompts) if stage == "warm_start" \
            else prompts
        shared = stage == "warm_start" and cfg.trainer.warm_start.shared_dir
        sft_writer = MetricsWriter(stage_dir(cfg, run_dir), None, to_dict(cfg), enabled=writer.enabled) \
            if shared else writer
        with claim(cfg) if stage == "warm_start" else contextlib.nullcontext():
            final = _stage_dir(cfg, run_dir, stage) / "final"
            if shared and stage_done(final.parent):  # another run finished it while this one waited
                del model
                gc.collect()
                model, tokenizer = load_trained(cfg.model, final)
            else:
                _run_sft(cfg, stage, model, tokenizer, sft_prompts, fmt, run_dir, sft_writer)
                if sharded(cfg.distributed.strategy) and ("grpo" in pending or "supervised" in pending):
                    del model  # split across the processes in place: the next stage starts from final/
                    gc.collect()
                    torch.distributed.barrier()  # rank 0 has written final/
                    model, tokenizer = load_trained(cfg.model, final)
        if shared:
            sft_writer.close()
        gc.collect()
    if "grpo" in pending:
        _run_grpo(cfg, model, tokenizer, prompts, fmt, run_dir, writer, rollout_source)
    if "supervised" in pending:
        _run_sft(cfg, "supervised", model, tokenizer, prompts, fmt, run_dir, writer)

    meta = ("stage", "kind", "tag", "time")
    evals = {f"{r['stage']}/{r['tag']}": {k: v for k, v in r.items() if k not in meta}
             for r in writer.read() if r.get("kind") == "eval"}
    _log_probes(evals)
    return {"warm_start_dir": str(stage_dir(cfg, run_dir)) if "warm_start" in stages else None, "eval": evals,
            "train_prompts": len(prompts.records),
            "twin_wordings": cfg.perturb.twin_wordings if cfg.perturb.paired else None,
            "grpo_batch": batch_geometry(cfg).to_dict() if cfg.algo.uses_grpo else None,
            "held_out_prompts": len(prompts.eval_records), "skipped_examples": dict(prompts.skipped)}


PROBE_KEYS = ("format", "correctness", "reward", "no_call_rate", "completion_tokens")


def _log_probes(evals: dict[str, dict[str, Any]]) -> None:
    """Print the held-out probes of the run side by side (before/after the warm start and GRPO)."""
    if not evals:
        return
    lines = [f"held-out probes (greedy, {next(iter(evals.values())).get('examples')} prompts):",
             f"  {'':<18}" + "".join(f"{k:>18}" for k in PROBE_KEYS)]
    for name, record in evals.items():
        values = (record.get(f"eval/{k}", float("nan")) for k in PROBE_KEYS)
        lines.append(f"  {name:<18}" + "".join(f"{v:>18.3f}" for v in values))
    log.info("\n".join(lines))


def _evaluate(cfg: TrainConfig, model: Any, tokenizer: Any, prompts: PromptSet, fmt: Any,
              writer: MetricsWriter, stage: str, tag: str, step: int) -> None:
    from cipr.train.evaluate import evaluate_prompts

    n = cfg.trainer.warm_start.eval_examples
    if not n or not prompts.eval_records or not writer.enabled or _records(writer, stage=stage, kind="eval",
                                                                           tag=tag):
        return
    if sharded(cfg.distributed.strategy):  # the probe generates on rank 0 alone, where weights are not whole
        log.info("%s %s: held-out probe skipped under distributed=%s (evaluate the export with cipr-eval)",
                 stage, tag, cfg.distributed.strategy)
        return
    examples = min(n, len(prompts.eval_records))
    # GRPO starts from the weights the warm start ended with: its probe in this folder is reused, not rerun
    reused = (stage, tag) == ("grpo", "before")
    same = _records(writer, stage="warm_start", kind="eval", tag="after") if reused else []
    if same and same[-1]["examples"] == examples:
        result = {k.removeprefix("eval/"): v for k, v in same[-1].items() if k.startswith("eval/")}
    else:
        result = evaluate_prompts(model, tokenizer, prompts.eval_records[:n], fmt,
                                  max_new_tokens=cfg.rollout.max_completion_length)
    writer.write({"stage": stage, "kind": "eval", "tag": tag, "step": step, "examples": examples,
                  **{f"eval/{k}": v for k, v in result.items()}})
    log.info("%s %s: %s", stage, tag, {k: round(v, 3) for k, v in result.items()})


def _naming_base(cfg: TrainConfig, build: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    """`build`, its Trainer told the model this run started from, which the stage folder's model card names
    (`CheckpointMixin.create_model_card`): every stage's, also after a warm start."""
    from cipr.runtime.export import base_model_name

    base = base_model_name(to_dict(cfg.model))

    def named(callbacks: list[Any]) -> Any:
        trainer = build(callbacks)
        trainer.cipr_base_model = base
        return trainer

    return named


def _run_sft(cfg: TrainConfig, stage: str, model: Any, tokenizer: Any, prompts: PromptSet, fmt: Any,
             run_dir: Path, writer: MetricsWriter) -> int:
    from cipr.train.sft import build_sft_trainer
    from cipr.train.supervised import build_supervised_trainer

    ws = cfg.trainer.warm_start
    folder = _stage_dir(cfg, run_dir, stage)

    def build(callbacks: list[Any]) -> Any:
        args = common_args(cfg.trainer, cfg.distributed, output_dir=str(folder),
                           progress_bar=cfg.logging.progress_bar, warm_start=stage == "warm_start")
        args["include_num_input_tokens_seen"] = "non_padding"
        if stage == "supervised" and cfg.algo.pairing_budget == "prompts":
            # the same examples a step as an unpaired algorithm, each with its copy
            args["per_device_train_batch_size"] *= prompts.unit_size
        if stage == "supervised":
            return build_supervised_trainer(
                model, tokenizer, prompts.records, args, ws.max_length, fmt=fmt, unit_size=prompts.unit_size,
                action_weight=cfg.algo.action_weight, objective=cfg.algo.objective(),
                relabeling=cfg.relabeling, trace=cfg.logging.trace, callbacks=callbacks)
        if stage == "warm_start" and ws.action_weight > 0:
            return build_supervised_trainer(model, tokenizer, prompts.records, args, ws.max_length, fmt=fmt,
                                            unit_size=1, action_weight=ws.action_weight, callbacks=callbacks)
        return build_sft_trainer(model, tokenizer, prompts.records, args, ws.max_length, callbacks=callbacks)

    _evaluate(cfg, model, tokenizer, prompts, fmt, writer, stage, "before", 0)
    done, trainer = run_stage(cfg, stage, folder, writer, _naming_base(cfg, build))
    if stage == "warm_start" and trainer.args.should_save:  # never resumed again: the next stage loads final/
        drop_step_checkpoints(folder)
    _evaluate(cfg, model, tokenizer, prompts, fmt, writer, stage, "after", done)
    del trainer
    return done


def batch_geometry(cfg: TrainConfig, world: int | None = None) -> GrpoBatch:
    """The GRPO stage's prompts, completions and accumulation on `world` processes (default: this run's)."""
    return grpo_batch(cfg.trainer, num_generations=cfg.rollout.num_generations,
                      unit_size=cfg.perturb.unit_size, pairing_budget=cfg.algo.pairing_budget,
                      world=world if world is not None else world_size(cfg.launcher))


def grpo_args(cfg: TrainConfig, output_dir: str, world: int | None = None) -> dict[str, Any]:
    """GRPOConfig fields for the GRPO stage (accumulation and steps_per_generation from `batch_geometry`)."""
    t = cfg.trainer
    batch = batch_geometry(cfg, world)
    args = common_args(t, cfg.distributed, output_dir=output_dir, progress_bar=cfg.logging.progress_bar)
    args.update(grpo_kwargs(cfg.rollout))
    args.update({"gradient_accumulation_steps": batch.gradient_accumulation_steps,
                 "include_num_input_tokens_seen": "no", "beta": t.beta, "num_iterations": t.num_iterations,
                 "epsilon": t.epsilon, "epsilon_high": t.epsilon_high, "loss_type": t.loss_type,
                 "scale_rewards": t.scale_rewards,
                 "mask_truncated_completions": t.mask_truncated_completions, "shuffle_dataset": True,
                 "steps_per_generation": batch.steps_per_generation, "entropy_coef": t.entropy_coeff,
                 "remove_unused_columns": False, "log_completions": cfg.logging.log_completions})
    return args


def _episodes(cfg: TrainConfig, tokenizer: Any, fmt: Any) -> tuple[PromptSet, Any]:
    """Multi-turn GRPO's rows (one per training task and side) and the runner that plays them."""
    from cipr.train.episodes import EpisodeOptions, EpisodeRunner, build_episodes, env_factory

    rollout = cfg.rollout
    factory = env_factory(cfg.env)
    episodes = build_episodes(rollout.episode_tasks, cfg.data, cfg.perturb, fmt, tokenizer, factory)
    if cfg.trainer.max_prompt_length is not None:
        episodes = episodes.without_long_prompts(tokenizer, cfg.trainer.max_prompt_length)
    if episodes.skipped:
        log.warning("skipped %d tasks: %s", sum(episodes.skipped.values()), dict(episodes.skipped))
    log.info("env=%s: %d episode rows (%d units of %d)", cfg.env.get("name"), len(episodes.records),
             len(episodes.records) // episodes.unit_size, episodes.unit_size)
    options = EpisodeOptions(rollout.episode_tasks, rollout.max_turn_tokens, rollout.format_weight)
    runner = EpisodeRunner(episodes, fmt, tokenizer, options, factory,
                           max_completion_length=rollout.max_completion_length)
    return episodes, runner


def _run_grpo(cfg: TrainConfig, model: Any, tokenizer: Any, prompts: PromptSet, fmt: Any, run_dir: Path,
              writer: MetricsWriter, rollout_source: RolloutSource | None = None) -> int:
    from datasets import Dataset
    from trl import GRPOConfig

    from cipr.train.episodes import EpisodeScorer
    from cipr.train.grpo import CIPRGRPOTrainer
    from cipr.train.reward import RolloutScorer

    stage_dir = run_dir / "grpo"
    batch = batch_geometry(cfg)
    episodes = None
    if cfg.rollout.multi_turn:  # GRPO's rows are the environment's tasks (cipr/train/episodes.py)
        prompts, episodes = _episodes(cfg, tokenizer, fmt)

    def build(callbacks: list[Any]) -> Any:
        args = GRPOConfig(**grpo_args(cfg, str(stage_dir)))
        if args.generation_batch_size != batch.completions_per_step:
            raise ConfigError(f"TRL sees {args.world_size} process(es) and a generation batch of "
                              f"{args.generation_batch_size} completions, but the schedule was computed for "
                              f"{batch.world_size} ({batch.completions_per_step}); launch with "
                              f"launcher.num_processes={args.world_size} or set WORLD_SIZE")
        unit_rows = prompts.unit_size * cfg.rollout.num_generations
        units_per_batch = args.generation_batch_size // unit_rows
        units = len(prompts.records) // prompts.unit_size
        if units < units_per_batch:
            raise ConfigError(f"one generation batch needs {units_per_batch} training prompts"
                              f"{' pairs' if prompts.unit_size == 2 else ''}, but the data has only {units}: "
                              f"raise data.n or lower trainer.per_device_train_batch_size")
        stop_ids = [i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None]
        rollout = cfg.rollout
        scorer = EpisodeScorer() if episodes is not None else \
            RolloutScorer(prompts.records, fmt, tokenizer, stop_ids)
        trainer = CIPRGRPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(prompts.rows()),
                                  processing_class=tokenizer, prompts=prompts, algo=cfg.algo, fmt=fmt,
                                  objective=cfg.algo.objective(), relabeling=cfg.relabeling,
                                  scorer=scorer, episodes=episodes, rollout_source=rollout_source,
                                  fold_allowed=not (rollout.uses_vllm
                                                    and rollout.importance_sampling_correction),
                                  share_prefill=rollout.share_prompt_prefill,
                                  vllm_enforce_eager=rollout.enforce_eager,
                                  sample_log=lambda step, rows: writer.write_samples("grpo", step, rows),
                                  samples_per_step=cfg.logging.rollout_samples, callbacks=callbacks)
        # after the Trainer is built, which moves the model to its device
        _evaluate(cfg, model, tokenizer, prompts, fmt, writer, "grpo", "before", 0)
        return trainer

    done, trainer = run_stage(cfg, "grpo", stage_dir, writer, _naming_base(cfg, build))
    _evaluate(cfg, model, tokenizer, prompts, fmt, writer, "grpo", "after", done)
    del trainer
    return done
