"""The one path of the guard's drift evaluation from a command: `cipr-eval guard.enabled=true ...` and
`cipr-guard eval ...` (which only spells the same options as flags) both call `run_guard`.

It takes an `EvalConfig` (model, format, seed, limit, batch size, device, data root, out_dir) whose
`guard` section is a `GuardEvalConfig`; picks the items (`guard_examples`), refuses an `out_dir` holding
another run before loading the model, loads the model the way `cipr-eval` does
(`cipr.eval.evaluate.load_model`: embedded, a folder or a cached hub id), and runs
`evaluate_guard`, which resumes what an earlier run of the same configuration left.
`format=json` uses the tokenizer's native tools template with JSON calls.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from cipr.core.errors import ConfigError
from cipr.guard.evaluate import GuardEvalResult, check_out_dir, evaluate_guard, guard_examples


def _call_format(name: str) -> Any:
    from cipr.formats import FORMATS, get_format

    if name == "json":
        return None
    if name not in FORMATS:
        raise ConfigError(f"format={name!r}: expected json or one of {', '.join(sorted(FORMATS))}")
    return get_format(name)


def run_guard(ecfg: Any, progress: Callable[[str], None] | None = None) -> GuardEvalResult:
    """Run the drift evaluation `ecfg.guard` describes on `ecfg`'s model; results go to `ecfg.out_dir`."""
    from cipr.eval.evaluate import load_model
    from cipr.guard.backend import HFBackend

    config = ecfg.guard
    call_format = _call_format(ecfg.call_format)
    examples = guard_examples(config, seed=ecfg.seed, data_root=ecfg.data_root, partitions=ecfg.partitions,
                              limit=ecfg.limit)
    identity = {"model": str(ecfg.model), "sample": config.sample}
    run = {"call_format": call_format, "identity": identity, "seed": ecfg.seed, "max_new_tokens": ecfg.max_new_tokens}
    check_out_dir(ecfg.out_dir, examples, config, **run)  # before the model is loaded
    model, tokenizer = load_model(ecfg)
    backend = HFBackend(model, tokenizer, call_format, batch_size=ecfg.batch_size)
    result = evaluate_guard(examples, backend, config, out_dir=ecfg.out_dir, progress=progress, **run)
    print(f"guard drift evaluation ({config.setting}, {len(examples)} items): {Path(ecfg.out_dir) / 'summary.json'}")
    for policy, summary in result.summaries.items():
        print(f"{policy}: " + ", ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                        for k, v in summary.items()))
    return result
