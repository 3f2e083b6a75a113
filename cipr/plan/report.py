"""The terminal table of a plan: one line per part, then its errors, warnings and notes."""

from __future__ import annotations

import textwrap
from typing import Any


def _b(n: float) -> str:
    return f"{n / 1e9:.2f}B"


def _range(pair: Any, unit: str = "h") -> str:
    return f"{pair[0]:g}-{pair[1]:g} {unit}"


def _memory_line(m: dict[str, Any]) -> list[str]:
    s, a = m["model_states"], m["activations"][m["peak_stage"]]
    lines = [f"weights {s['weights']} + gradients {s['gradients']} + optimizer {s['optimizer']}"
             f" + buffers {m['buffers']}" + (f" + teacher {m['teacher']}" if m["teacher"] else "")
             + f" + activations {a['total']} ({m['peak_stage']}: {a['batch']} x {a['seq']} tokens)"
             f" + context {m['context']:g} = {m['trainer_peak']} GB"]
    v = m["vllm"]
    if v:
        lines.append(f"vLLM colocate {v['share']} GB (weights {v['weights']}, KV cache {v['kv_cache']}: "
                     f"{v['concurrent']} sequences of {v['seq_len']} at once, {v['waves']} wave(s) for "
                     f"{v['seqs_per_process']})")
    lines.append(f"{m['trainer_peak']} GB of {m['budget']} GB left for training on a {m['card']:g} GB card: "
                 f"{m['verdict'].upper()}")
    return lines


def _batch_lines(b: dict[str, Any]) -> list[str]:
    g = b["grpo"]
    size = f"{'~' if b['estimated'] else ''}{b['train_units']}"
    unit = "pairs" if b["unit_size"] == 2 else "rows"
    lines = []
    if g:
        lines.append(f"{g['prompts_per_step']} {unit}/round x G={g['num_generations']} = "
                     f"{g['completions_per_step']} completions; {g['updates_per_generation']} updates of "
                     f"{g['completions_per_update']} = {g['per_device_train_batch_size']}/GPU x {b['world']} "
                     f"x accumulation {g['gradient_accumulation_steps']}")
        if b["pairs_per_step"]:
            lines.append(f"CIPR pairs: {b['pairs_per_step']}/round, {b['pairs_per_update']}/update, "
                         f"{b['pairs_per_micro_batch']}/micro-batch")
    else:
        lines.append(f"{b['rows_per_step']} rows per optimizer step ({b['stage']})")
    lines.append(f"{size} training {unit}: {b['rounds_per_epoch']} round(s)/epoch, {b['optimizer_steps']} "
                 f"optimizer steps = {b['rounds']} round(s), {b['epochs']:.2f} epochs, "
                 f"{b['rollouts']} rollouts"
                 + (f"; warm start {b['warm_start_steps']} steps x {b['warm_start_rows_per_step']} rows"
                    if b["warm_start_steps"] else ""))
    return lines


def table(plan: Any) -> str:
    """Rows `part  text` (module docstring)."""
    facts, pre = plan.facts, plan.preflight
    rows: list[tuple[str, str]] = [("command", "cipr-train " + " ".join(plan.overrides))]
    if "model" in facts:
        mo = facts["model"]
        rows.append(("model", f"{mo['name']} ({mo['class']}): {_b(mo['params'])} parameters, "
                              f"{_b(mo['trainable'])} trained; config {mo['architecture']}"))
    if "memory" in facts:
        m = facts["memory"]
        rows.append(("strategy", f"{m['strategy']} on {m['processes']} process(es), {m['precision']}"))
        rows += [("memory/GPU", line) for line in _memory_line(m)]
    if pre is not None:
        rows.append(("format", f"{pre.call_format} with chat template {pre.template}"))
        if pre.batch:
            rows += [("batch", line) for line in _batch_lines(pre.batch.to_dict())]
        if "data" in facts:
            rows.append(("data", f"{facts['data']['read']}: {pre.sample_rows} examples rendered into "
                                 f"{pre.rendered_rows} rows"))
        for key, label in (("prompt", "prompts"), ("target", "targets"), ("prompt_target", "prompt+target")):
            s = pre.lengths.get(key)
            if s is not None:
                limit = f"limit {s.limit}: {s.share:.1%} over" if s.limit else "no limit"
                rows.append(("tokens", f"{label} mean {s.mean:.0f}, p50 {s.p50}, p95 {s.p95}, max {s.max} "
                                       f"({limit})"))
        if "tokens" in facts:
            rows.append(("tokens", f"counted with {facts['tokens']['tokenizer']}"))
    if "time" in facts:
        t = facts["time"]
        r = t["per_round"]
        rows.append(("time", f"ESTIMATE on {t['processes']} x {t['card']['name']}: per round "
                             f"{r['total_s'][0] / 60:.1f}-{r['total_s'][1] / 60:.1f} min (generate "
                             f"{r['generated_tokens'][0]:.0f}-{r['generated_tokens'][1]:.0f} tokens/GPU, "
                             f"train "
                             f"{r['trained_tokens'][0]:.0f}-{r['trained_tokens'][1]:.0f}); run {t['rounds']} "
                             f"rounds: {_range(t['run_hours'])} ({_range(t['gpu_hours'], 'GPU-h')})"))
    verdict = "OK" if plan.ok else f"{len(plan.findings.errors)} ERROR(S)"
    rows.append(("verdict", f"{verdict}, {len(plan.findings.warnings)} warning(s)"))
    width = max(len(k) for k, _ in rows) + 2
    out = []
    for key, text in rows:
        wrapped = textwrap.wrap(text, 110 - width) or [""]
        out.append(key.ljust(width) + wrapped[0])
        out += [" " * width + w for w in wrapped[1:]]
    for kind, items in (("ERROR", plan.findings.errors), ("warning", plan.findings.warnings),
                        ("note", plan.findings.notes)):
        for item in items:
            wrapped = textwrap.wrap(f"{kind}: {item}", 108)
            out += [wrapped[0]] + ["  " + w for w in wrapped[1:]]
    return "\n".join(out)
