"""One evaluation run end to end: build items, load the model and backend, run, write the report.

`evaluate(cfg)` is what `cipr-eval` calls (tests and benchmarks pass a preloaded model). Models load
through `cipr.runtime.model.load_inference_model`.

run.json records the configuration; a rerun into the same directory must agree on model, benchmark,
format, backend, seed, max_new_tokens, split and replay mode (else it raises rather than mixing two
runs); it may add perturbations, names or items, but not select fewer (`check_same_selection`). A
run.json next to no results (a failed start) does not bind the rerun.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cipr.core.errors import ConfigError
from cipr.core.io import read_json, write_json_atomic, write_text_atomic
from cipr.core.run_folder import changed_keys
from cipr.eval.benchmarks import build, scorer_for
from cipr.eval.config import EvalConfig
from cipr.eval.replay import ReplayBackend
from cipr.eval.report import RESULTS, RUN_META, ReportConfig, write_report
from cipr.eval.runner import RunnerConfig, check_same_selection, run_items
from cipr.formats import AUTO, CallFormat, resolve_format
from cipr.runtime.backends import Backend, HFBackend, OpenAIBackend, VLLMBackend
from cipr.runtime.export import apply_manifest
from cipr.runtime.generation import GreedyConfig
from cipr.runtime.hub import resolve_model
from cipr.runtime.model import check_whole_model, load_inference_model, prepare_inference_tokenizer

log = logging.getLogger(__name__)


def load_model(cfg: EvalConfig) -> tuple[Any, Any]:
    """(model, tokenizer) for the HF backend, loaded as `cfg` says."""
    return load_inference_model(cfg.model, device=cfg.device, dtype=cfg.dtype, threads=cfg.threads,
                                attn_implementation=cfg.attn_implementation)


def make_backend(cfg: EvalConfig, fmt: CallFormat, model: Any = None, tokenizer: Any = None) -> Backend:
    """The configured backend (HF loads the model unless one is passed in)."""
    kind = cfg.resolved_backend
    if kind == "replay":
        return ReplayBackend(fmt, cfg.replay)  # type: ignore[arg-type]
    if kind == "openai":
        ocfg = cfg.openai
        if cfg.model.startswith(("http://", "https://")):
            ocfg.base_url = cfg.model
        ocfg.max_new_tokens = cfg.max_new_tokens
        return OpenAIBackend(fmt, ocfg)
    if kind == "vllm":
        cfg.vllm.max_new_tokens = cfg.max_new_tokens
        if cfg.model == "embedded":
            from cipr.runtime.embedded import embedded_hf_dir, load_embedded_tokenizer

            # vLLM reads the GGUF's transformers copy; the GGUF tokenizer keeps the HF backend's stop tokens
            tok = tokenizer or prepare_inference_tokenizer(load_embedded_tokenizer())
            return VLLMBackend(str(embedded_hf_dir()), tok, fmt, cfg.vllm)
        from transformers import AutoTokenizer

        tok = tokenizer or prepare_inference_tokenizer(AutoTokenizer.from_pretrained(cfg.model))
        return VLLMBackend(cfg.model, tok, fmt, cfg.vllm)
    if model is None or tokenizer is None:
        model, tokenizer = load_model(cfg)
    else:
        prepare_inference_tokenizer(tokenizer)
    return HFBackend(model, tokenizer, fmt, GreedyConfig(
        batch_size=cfg.batch_size, max_new_tokens=cfg.max_new_tokens, drop_finished=cfg.drop_finished,
        prefill=cfg.prefill, prefix_reuse=cfg.prefix_reuse))


def _template_tokenizer(cfg: EvalConfig) -> Any:
    """For `format=auto`, the tokenizer whose chat template names the format (None for a URL or a replay)."""
    if cfg.call_format != AUTO:
        return None
    if cfg.model == "embedded":
        from cipr.runtime.embedded import load_embedded_tokenizer

        return load_embedded_tokenizer()
    if cfg.resolved_backend not in ("hf", "vllm"):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(cfg.model))


def report_config(cfg: EvalConfig) -> ReportConfig:
    r = cfg.benchmark.report
    return ReportConfig(original=r.original, group_mode=r.group_mode,  # type: ignore[arg-type]
                        mean_groups=tuple(r.mean_groups) if r.mean_groups is not None else None)


def previous_meta(out_dir: Path, cfg: EvalConfig) -> dict[str, Any]:
    """run.json of the run in `out_dir` ({} without results); ConfigError if `cfg` differs from it."""
    path = out_dir / RUN_META
    has_results = (out_dir / RESULTS).is_file() and (out_dir / RESULTS).stat().st_size > 0
    # no results: a failed start
    old: dict[str, Any] = read_json(path) if path.exists() and has_results else {}
    clash = changed_keys(old, cfg.meta(), recorded_only=True)
    if clash:
        detail = "; ".join(f"{k}: {a!r} there, {b!r} now" for k, (a, b) in clash.items())
        raise ConfigError(f"{out_dir} holds a run with another configuration ({detail}); use a new out_dir")
    return old


def write_meta(out_dir: Path, cfg: EvalConfig, perts: list[tuple[str, str]], build_report: dict[str, Any],
               n_items: int) -> dict[str, Any]:
    """Create or extend run.json; raise if the directory holds a run with another configuration."""
    path = out_dir / RUN_META
    new = cfg.meta()
    old = previous_meta(out_dir, cfg)
    rc = report_config(cfg)
    meta = {**old, **new,
            "perturbations": list(dict.fromkeys([*old.get("perturbations", []), *(p for p, _ in perts)])),
            "groups": {**old.get("groups", {}), **dict(perts)},
            "names": list(dict.fromkeys([*old.get("names", []), *cfg.names_list])),
            "limit": cfg.limit, "partitions": cfg.partitions, "n_items_requested": n_items,
            "build": build_report,
            "report": {"original": rc.original, "group_mode": rc.group_mode,
                       "mean_groups": list(rc.mean_groups) if rc.mean_groups is not None else None},
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S")}
    meta.setdefault("created", meta["updated"])
    write_json_atomic(path, meta)
    return meta


def evaluate(cfg: EvalConfig, *, model: Any = None, tokenizer: Any = None, backend: Backend | None = None
             ) -> dict[str, Any]:
    """Run the evaluation `cfg` describes into `cfg.out_dir`; returns the summary. `backend`: an already
    built one (e.g. one vLLM engine reused over several runs) instead of `cfg`'s."""
    if cfg.model != "embedded" and cfg.resolved_backend in ("hf", "vllm") and model is None:
        check_whole_model(resolve_model(cfg.model))  # a missing folder, an uncached hub id or a trimmed
        # checkpoint fails here, before any output
    apply_manifest(cfg)  # an exported model's call format and tool naming (cipr-export's manifest)
    out_dir = Path(cfg.out_dir)
    try:
        fmt = resolve_format(cfg.call_format,
                             tokenizer if tokenizer is not None else _template_tokenizer(cfg))
    except ValueError as e:
        raise ConfigError(f"format={cfg.call_format!r}: {e}") from None
    items, perts, build_report = build(cfg)
    if not items:
        raise ConfigError("nothing to evaluate: the benchmark, perturbations and names select no item")
    from cipr.eval.config import MULTI_TURN

    if cfg.benchmark.name in MULTI_TURN:
        from cipr.eval.episodes import episode_plan

        log.info("benchmark=%s: %s", cfg.benchmark.name, episode_plan(items))
    previous_meta(out_dir, cfg)
    check_same_selection(items, out_dir)
    write_meta(out_dir, cfg, perts, build_report.to_json(), len(items))
    if not cfg.generate:
        return _consistency_only(cfg, items, fmt, out_dir, model, tokenizer)
    backend = backend or make_backend(cfg, fmt, model, tokenizer)
    rcfg = RunnerConfig(chunk_size=cfg.chunk_size, strict_parse=cfg.benchmark.strict_parse,
                        progress=cfg.progress)
    stats = run_items(items, backend, fmt, scorer_for(cfg), out_dir, rcfg)
    log.info("evaluated %d, skipped %d already done, %d correct", stats.evaluated, stats.skipped,
             stats.correct)
    if cfg.consistency.enabled:
        _consistency(cfg, items, backend, fmt, out_dir)
    from cipr.eval.config import MULTI_TURN
    from cipr.eval.consistency_metric import attach
    from cipr.eval.episodes import episode_section

    sections = (attach, episode_section) if cfg.benchmark.name in MULTI_TURN else (attach,)
    summary = write_report(out_dir, sections=sections)
    summary["run_stats"] = {"total": stats.total, "evaluated": stats.evaluated, "skipped": stats.skipped,
                            "torn_lines": stats.torn_lines}
    return summary


def _consistency_only(cfg: EvalConfig, items: list[Any], fmt: CallFormat, out_dir: Path, model: Any,
                      tokenizer: Any) -> dict[str, Any]:
    """`generate=false`: the consistency metric alone, its summary.json and report.md."""
    from cipr.eval.consistency_metric import read_records, render_consistency, summarize_consistency
    from cipr.eval.report import REPORT, SUMMARY, report_config_from_meta

    if model is None:
        _read_consistency(cfg, items, fmt, out_dir)  # refuses RoTBench before loading a model
        model, tokenizer = load_model(cfg)
    _read_consistency(cfg, items, fmt, out_dir, model, tokenizer)
    meta = read_json(out_dir / RUN_META)
    summary = {**{k: v for k, v in meta.items() if k != "report"},
               "consistency": summarize_consistency(read_records(out_dir), report_config_from_meta(meta))}
    write_json_atomic(out_dir / SUMMARY, summary)
    write_text_atomic(out_dir / REPORT, f"# Consistency of {cfg.model} on {cfg.benchmark.name} "
                      "(no generation)\n" + render_consistency(summary["consistency"]))
    return summary


def _consistency(cfg: EvalConfig, items: list[Any], backend: Backend, fmt: CallFormat, out_dir: Path) -> None:
    """The held-out consistency metric (`consistency.enabled`): the HF backend's model, else an HF load."""
    _read_consistency(cfg, items, fmt, out_dir)
    if isinstance(backend, HFBackend):
        model, tokenizer = backend.model, backend.tokenizer
    elif cfg.resolved_backend == "vllm":
        model, tokenizer = load_model(cfg)
    else:
        raise ConfigError(f"consistency.enabled=true reads the model's token probabilities: backend="
                          f"{cfg.resolved_backend} gives none; use backend=hf or vllm "
                          "(HF loads it for the read)")
    _read_consistency(cfg, items, fmt, out_dir, model, tokenizer)


def _read_consistency(cfg: EvalConfig, items: list[Any], fmt: CallFormat, out_dir: Path, model: Any = None,
                      tokenizer: Any = None) -> None:
    """Read the consistency of `items` with `model` (per turn for the multi-turn benchmarks); without a model
    only check that the benchmark has what the metric reads."""
    from cipr.eval.benchmarks import load_examples
    from cipr.eval.config import MULTI_TURN
    from cipr.eval.consistency_metric import run_consistency
    from cipr.eval.episodes import run_episode_consistency

    if cfg.benchmark.name == "rotbench":
        raise ConfigError("consistency.enabled=true reads held-out correspondences, which RoTBench's levels "
                          "lack; use bfcl, synthetic, toolrl_test, messages or a multi-turn benchmark")
    if model is None:
        return
    with reader_attention(model):
        if cfg.benchmark.name in MULTI_TURN:
            run_episode_consistency(items, model, tokenizer, fmt, out_dir, cfg.consistency,
                                    progress=cfg.progress)
        else:
            run_consistency(items, load_examples(cfg), model, tokenizer, fmt, out_dir, cfg.consistency,
                            cfg.seed, cfg.progress)


@contextlib.contextmanager
def reader_attention(model: Any) -> Iterator[None]:
    """SDPA instead of eager-style attention for the action reader's forwards, then back.

    Eager attention over sequences and their packed tries (tree-shaped mask) materializes [B, H, T, T]
    float32 scores and their softmax in every layer; SDPA computes the same without them. A model on
    any other attention runs unchanged."""
    before = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if before != "eager" or not hasattr(model, "set_attn_implementation"):
        yield
        return
    model.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        model.set_attn_implementation(before)
