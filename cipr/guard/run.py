"""The guard's drift evaluation from a command (`cipr-eval guard.enabled=true ...` calls `run_guard`).

It picks the items, refuses an `out_dir` holding another run before loading the model
(`load_inference_model`), and runs `evaluate_guard` (resuming). `call_format=json` uses the tokenizer's
native tools template with JSON calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cipr.core.errors import ConfigError
from cipr.guard.evaluate import SUMMARY, GuardEvalConfig, GuardEvalResult, check_out_dir, evaluate_guard


def _call_format(name: str) -> Any:
    from cipr.formats import FORMATS, get_format

    if name == "json":
        return None
    if name not in FORMATS:
        raise ConfigError(f"format={name!r}: expected json or one of {', '.join(sorted(FORMATS))}")
    return get_format(name)


def run_guard(config: GuardEvalConfig, *, model: str, out_dir: str, call_format: str, seed: int = 0,
              limit: int | None = None, partitions: Sequence[str] | None = None, data_root: str | None = None,
              batch_size: int = 8, max_new_tokens: int = 512, progress: Callable[[str], None] | None = None,
              **load: Any) -> GuardEvalResult:
    """Run the drift evaluation `config` describes on `model`; results go to `out_dir`. `load`: the
    model's `device`, `dtype`, `threads`, `attn_implementation` (`load_inference_model`)."""
    from cipr.guard.evaluate import guard_examples
    from cipr.runtime.backends import HFBackend
    from cipr.runtime.generation import GreedyConfig
    from cipr.runtime.model import load_inference_model

    fmt = _call_format(call_format)
    examples = guard_examples(config, seed=seed, data_root=data_root, partitions=partitions, limit=limit)
    run = {"call_format": fmt, "identity": {"model": str(model), "sample": config.sample}, "seed": seed,
           "max_new_tokens": max_new_tokens}
    check_out_dir(out_dir, examples, config, **run)  # before the model is loaded
    greedy = GreedyConfig(batch_size=batch_size, max_new_tokens=max_new_tokens)
    backend = HFBackend(*load_inference_model(model, **load), fmt, greedy)
    result = evaluate_guard(examples, backend, config, out_dir=out_dir, progress=progress, **run)
    print(f"guard drift evaluation ({config.setting}, {len(examples)} items): {Path(out_dir) / SUMMARY}")
    for policy, summary in result.summaries.items():
        print(f"{policy}: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                        for k, v in summary.items()))
    return result
