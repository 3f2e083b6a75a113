"""Held-out consistency read from the model: action distributions under the unperturbed and the perturbed
interface at the decisions of one teacher-forced reference response (no generation).

For an item (example, held-out perturbation, tool order, tool names) the reference response is the
reference calls rendered by the call format, in the unperturbed and in the perturbed interface's names.
`cipr.method.actions` reads the action distribution at every decision of both on one index set:
unperturbed tool i is class i; a perturbed tool takes its equivalent's class, and an added tool
(distractor, costlier or slower equivalent, training twin) a class of its own, so mass on it counts as
disagreement. Per item:

- `kl`: KL(unperturbed || perturbed) per decision (`cipr.method.consistency.kl_rows`, the training loss's
  smoothing), averaged over the response's decisions (nats).
- `argmax_agree`: share of decisions whose most likely action (∅ included) is the same on both sides.
- `added_mass`: mean probability the perturbed side puts on added tools (None when it adds none).
- `action_acc_ref` / `action_acc_pert`: share of the reference's calls whose decision has the called
  tool's class as its most likely action (a reference without calls: ∅ at its one decision), per side:
  accuracy without generation, not of a whole call with arguments (the runner's `correct`).

"Unperturbed" is the interface the model is deployed with under the item's names: the original example
under original names, its canonicalization under canonical names (the adapter). Choices:
- A same-name duplicate: the text cannot tell the two declarations apart and a call to the name is
  accepted, so both take the equivalent's class (the reader splits the name's mass): same-name types
  show up in `kl`, never in `added_mass`.
- Items whose two responses have different numbers of decisions (a refactor that merges calls) and
  RoTBench (its levels corrupt names by construction, without a held-out correspondence) are skipped,
  each with its reason in `consistency.jsonl` and counted in the summary.
- Aggregation follows `cipr.eval.report` (orders, types, groups and Mean per item); intervals are
  normal (or t) over per-item values, differences between runs paired over items.

`consistency.jsonl` holds one line per (id, names, perturbation, order), appended as chunks finish; a
rerun reads only what is missing.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cipr.core.errors import ConfigError, DataError
from cipr.core.io import read_jsonl
from cipr.eval.report import ReportConfig, fmt, layout, table
from cipr.eval.runner import EvalItem, Key, existing_keys
from cipr.eval.stats import mean_estimate, paired_difference
from cipr.formats.base import CallFormat
from cipr.method.consistency import kl_rows
from cipr.tools.canonical import canonicalize
from cipr.tools.interface import Example

log = logging.getLogger(__name__)

CONSISTENCY = "consistency.jsonl"
METRICS = ("kl", "argmax_agree", "added_mass", "action_acc_ref", "action_acc_pert", "none_ref", "none_pert")
SCALE = {"kl": 1.0, **{m: 100.0 for m in METRICS[1:]}}
UNITS = {"kl": "nats", **{m: "%" for m in METRICS[1:]}}
LABELS = {"kl": "KL(unperturbed ‖ perturbed)", "argmax_agree": "argmax agreement",
          "added_mass": "mass on added tools", "action_acc_ref": "action accuracy, unperturbed",
          "action_acc_pert": "action accuracy, perturbed", "none_ref": "mass on no call, unperturbed",
          "none_pert": "mass on no call, perturbed"}
NOT_COMPARED = ("original",)


@dataclass
class ConsistencyConfig:
    """`cipr-eval consistency.enabled=true`: the held-out consistency metric (module docstring).

    - `batch_size`: sequences per forward pass of the action reader.
    - `chunk_size`: items per flush of consistency.jsonl.
    - `eps`: smoothing of both distributions before the KL (as the training loss).
    """

    enabled: bool = False
    batch_size: int = 8
    chunk_size: int = 64
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.chunk_size < 1:
            raise ConfigError("consistency.batch_size and consistency.chunk_size must be >= 1")
        if not (self.eps >= 0 and math.isfinite(self.eps)):
            raise ConfigError(f"consistency.eps={self.eps} must be >= 0")


def pair_consistency(p_ref: torch.Tensor, p_pert: torch.Tensor, segments: torch.Tensor, added: torch.Tensor,
                     num_pairs: int, *, eps: float = 1e-6, target_ref: torch.Tensor | None = None,
                     target_pert: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-pair KL, agreement and action accuracy from aligned decisions (pure; no model).

    Shapes: p_ref, p_pert [D, A] (decision d of the unperturbed and of the perturbed response of one
    pair, ∅ last, one index set); segments [D] (long) the pair of each decision, in [0, num_pairs);
    added [D, A] (bool) the classes that are added tools on the perturbed side of that decision's pair;
    target_ref, target_pert [D] (long, optional) the reference action's column on each side, -1 for a
    decision that accuracy does not score.
    Returns the per-pair mean KL(ref || pert) over its decisions [P], and per-pair [P] metrics
    `argmax_agree`, `added_mass` (NaN for a pair without added tools), `none_ref`, `none_pert`,
    `decisions`, and with targets `action_acc_ref` / `action_acc_pert` (share of the scored decisions whose
    argmax is the target; NaN without one), `correct_ref` (1 when every scored decision of the unperturbed
    side has the target as argmax, else 0) and `p_target_ref` (the unperturbed side's probability of the
    target, averaged over the scored decisions). A pair without decisions gets NaN everywhere but
    `decisions` = 0.
    """
    if p_ref.shape != p_pert.shape or p_ref.dim() != 2 or added.shape != p_ref.shape:
        raise ValueError(f"p_ref, p_pert and added must be one [D, A] shape, got {tuple(p_ref.shape)}, "
                         f"{tuple(p_pert.shape)}, {tuple(added.shape)}")
    if segments.shape != p_ref.shape[:1]:
        raise ValueError(f"segments must be [D] = [{p_ref.shape[0]}], got {tuple(segments.shape)}")
    if segments.numel() and (int(segments.min()) < 0 or int(segments.max()) >= num_pairs):
        raise ValueError(f"segment ids must lie in [0, {num_pairs})")
    dtype = torch.float64
    ref, pert = p_ref.detach().to(dtype), p_pert.detach().to(dtype)
    per_decision = {
        "kl": kl_rows(ref, pert, eps=eps),
        "argmax_agree": (ref.argmax(-1) == pert.argmax(-1)).to(dtype),
        "added_mass": (pert * added.to(dtype)).sum(-1),
        "none_ref": ref[:, -1],
        "none_pert": pert[:, -1],
    }
    scored: dict[str, torch.Tensor] = {}
    for key, probs, target in (("action_acc_ref", ref, target_ref), ("action_acc_pert", pert, target_pert)):
        if target is not None:
            if target.shape != segments.shape:
                raise ValueError(f"{key} targets must be [D] = [{segments.shape[0]}], "
                                 f"got {tuple(target.shape)}")
            scored[key] = (probs.argmax(-1) == target).to(dtype)
            scored[key + "/n"] = (target >= 0).to(dtype)
            scored[key + "/p"] = probs.gather(1, target.clamp(min=0)[:, None]).squeeze(1)
    counts = torch.zeros(num_pairs, dtype=dtype).index_add(0, segments,
                                                           torch.ones_like(segments, dtype=dtype))
    has_added = torch.zeros(num_pairs, dtype=dtype).index_add(0, segments, added.any(-1).to(dtype)) > 0

    def mean(values: torch.Tensor) -> torch.Tensor:
        sums = torch.zeros(num_pairs, dtype=dtype).index_add(0, segments, values)
        return torch.where(counts > 0, sums / counts.clamp(min=1), torch.full_like(sums, float("nan")))

    out = {k: mean(v) for k, v in per_decision.items()}
    for key in ("action_acc_ref", "action_acc_pert"):
        if key in scored:  # over the scored decisions only (target -1: not scored)
            n = torch.zeros(num_pairs, dtype=dtype).index_add(0, segments, scored[key + "/n"])
            hits = torch.zeros(num_pairs, dtype=dtype).index_add(0, segments,
                                                                 scored[key] * scored[key + "/n"])
            out[key] = torch.where(n > 0, hits / n.clamp(min=1), torch.full_like(n, float("nan")))
            if key == "action_acc_ref":  # the unperturbed side: every choice right, and the reference's mass
                mass = torch.zeros(num_pairs, dtype=dtype).index_add(0, segments,
                                                                     scored[key + "/p"] * scored[key + "/n"])
                nan = torch.full_like(n, float("nan"))
                out["correct_ref"] = torch.where(n > 0, (hits == n).to(dtype), nan)
                out["p_target_ref"] = torch.where(n > 0, mass / n.clamp(min=1), nan)
    out["added_mass"] = torch.where(has_added, out["added_mass"], torch.full_like(counts, float("nan")))
    out["decisions"] = counts
    value = out.pop("kl")
    return value, out


@dataclass(frozen=True)
class ConsistencyPair:
    """One item's two sides on one action index set (`classes[i]` of declared tool i; `added`: classes of
    added tools on the perturbed side; `num_actions`: classes in all, ∅ excluded)."""

    item: EvalItem
    reference: Example
    perturbed: Example
    ref_classes: tuple[int, ...]
    pert_classes: tuple[int, ...]
    added: tuple[int, ...]
    num_actions: int

    @property
    def key(self) -> Key:
        return self.item.key


def _first_positions(names: Sequence[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for i, n in enumerate(names):
        out.setdefault(n, i)
    return out


def make_pair(source: Example, item: EvalItem, seed: int) -> ConsistencyPair:
    """The pair of `item` (a held-out or in-distribution item built from `source`); ValueError if none."""
    from cipr.perturb import apply_perturbation
    from cipr.perturb.registry import AFTER_ADAPTER

    if item.perturbation in NOT_COMPARED:
        raise ValueError("the original interface has nothing to compare with")
    if item.perturbation in AFTER_ADAPTER:
        names = item.names
    else:
        names = "canonical" if item.perturbation == "in_distribution" else "original"
    _, corr = apply_perturbation(source, item.perturbation, seed=seed, names=names, order=item.order)
    shown = item.shown
    if len(corr) != len(shown.interface):
        raise ValueError(f"the correspondence has {len(corr)} tools, "
                         f"the shown interface {len(shown.interface)}")
    reference = canonicalize(source)[0] if item.names == "canonical" else source
    position = _first_positions(corr.source_names or source.interface.names)
    ref_position = _first_positions(source.interface.names)
    ref_classes = tuple(ref_position[n] for n in source.interface.names)
    n = len(source.interface)
    equivalent_of_name: dict[str, int] = {}
    for j, srcs in enumerate(corr.sources):
        if srcs:
            equivalent_of_name.setdefault(shown.interface.names[j], position[srcs[0]])
    classes: list[int] = []
    added: list[int] = []
    for j, srcs in enumerate(corr.sources):
        name = shown.interface.names[j]
        if srcs:
            classes.append(position[srcs[0]])
        elif name in equivalent_of_name:  # a same-name duplicate: the text cannot tell it from its equivalent
            classes.append(equivalent_of_name[name])
        else:
            classes.append(n + len(added))
            added.append(n + len(added))
    return ConsistencyPair(item, reference, shown, ref_classes, tuple(classes), tuple(added), n + len(added))


def build_pairs(examples: Iterable[Example], items: Sequence[EvalItem], seed: int
                ) -> tuple[list[ConsistencyPair], list[tuple[EvalItem, str]]]:
    """Pairs for every non-original item, and the items skipped with their reason."""
    by_id = {e.id: e for e in examples}
    pairs: list[ConsistencyPair] = []
    skipped: list[tuple[EvalItem, str]] = []
    for it in items:
        if it.perturbation in NOT_COMPARED:
            continue
        source = by_id.get(it.id)
        if source is None:
            skipped.append((it, "no source example (RoTBench levels carry no held-out correspondence)"))
            continue
        try:
            pairs.append(make_pair(source, it, seed))
        except (ValueError, KeyError, DataError) as e:
            skipped.append((it, f"{type(e).__name__}: {e}"[:300]))
    return pairs, skipped


def _queries(pair: ConsistencyPair, fmt: CallFormat, tokenizer: Any) -> tuple[Any, Any]:
    from cipr.method.actions import ActionQuery

    out = []
    for ex, classes in ((pair.reference, pair.ref_classes), (pair.perturbed, pair.pert_classes)):
        prompt = fmt.render_prompt(tokenizer, ex.messages, ex.interface)
        response = fmt.render_target(ex.reference, response=ex.response)
        out.append(ActionQuery.from_format(fmt, prompt, response, ex.interface.names, classes))
    return out[0], out[1]


def reference_targets(query: Any, width: int) -> torch.Tensor:
    """[d] the column of each decision's reference action in a [d, width + 1] row, for accuracy: the tool of
    each call; ∅ (= `width`) only where the reference calls nothing, else -1 (the end-of-turn ∅ after the
    calls is not a choice among tools, and scoring it would lift every accuracy toward 1)."""
    first = _first_positions(query.tools)
    calls = any(d.taken is not None for d in query.decisions)
    return torch.tensor([query.classes[first[d.taken]] if d.taken is not None else (-1 if calls else width)
                         for d in query.decisions], dtype=torch.long)


def _read(model: Any, tokenizer: Any, queries: Sequence[Any], num_actions: Sequence[int], batch_size: int
          ) -> list[torch.Tensor]:
    """Per query, its [d, num_actions + 1] distributions (∅ last)."""
    from cipr.method.actions import read_actions

    out: list[torch.Tensor] = []
    for start in range(0, len(queries), batch_size):
        batch = list(queries[start:start + batch_size])
        width = max(num_actions[start:start + batch_size])
        with torch.no_grad():
            reading = read_actions(model, tokenizer, batch, width)
        probs = reading.probs.detach().float().cpu()
        for b in range(len(batch)):
            rows = probs[reading.sequence.cpu() == b]
            a = num_actions[start + b]
            out.append(torch.cat([rows[:, :a], rows[:, -1:]], dim=1))
    return out


def _pad(p: torch.Tensor, width: int) -> torch.Tensor:
    """[d, a + 1] (∅ last) to [d, width + 1]: zero columns for the classes this side does not have."""
    a = p.shape[1] - 1
    return torch.cat([p[:, :a], p.new_zeros(p.shape[0], width - a), p[:, -1:]], dim=1)


def _record(it: EvalItem, **values: Any) -> dict[str, Any]:
    return {"id": it.id, "partition": it.partition, "names": it.names, "perturbation": it.perturbation,
            "group": it.group, "order": it.order, **values}


def measure(model: Any, tokenizer: Any, fmt: CallFormat, pairs: Sequence[ConsistencyPair],
            config: ConsistencyConfig) -> list[dict[str, Any]]:
    """The consistency.jsonl records of `pairs` (unperturbed sides read once per item and names)."""
    refs: dict[tuple[str, str], int] = {}
    queries: list[Any] = []
    widths: list[int] = []
    sides: list[tuple[int, int]] = []
    for pair in pairs:
        ref_q, pert_q = _queries(pair, fmt, tokenizer)
        ref_key = (pair.item.id, pair.item.names)
        if ref_key not in refs:
            refs[ref_key] = len(queries)
            queries.append(ref_q)
            widths.append(len(pair.reference.interface))
        queries.append(pert_q)
        widths.append(pair.num_actions)
        sides.append((refs[ref_key], len(queries) - 1))
    probs = _read(model, tokenizer, queries, widths, config.batch_size) if queries else []
    records: list[dict[str, Any]] = []
    keep: list[int] = []
    p_ref, p_pert, segs, added, t_ref, t_pert = [], [], [], [], [], []
    width = max((p.num_actions for p in pairs), default=0)
    for k, (pair, (r, q)) in enumerate(zip(pairs, sides, strict=True)):
        ref, pert = probs[r], probs[q]
        if ref.shape[0] != pert.shape[0]:
            records.append(_record(pair.item, skipped=f"{ref.shape[0]} decisions unperturbed, "
                                                      f"{pert.shape[0]} perturbed"))
            continue
        keep.append(k)
        p_ref.append(_pad(ref, width))
        p_pert.append(_pad(pert, width))
        segs.append(torch.full((ref.shape[0],), len(keep) - 1, dtype=torch.long))
        mask = torch.zeros(ref.shape[0], width + 1, dtype=torch.bool)
        mask[:, list(pair.added)] = True
        added.append(mask)
        t_ref.append(reference_targets(queries[r], width))
        t_pert.append(reference_targets(queries[q], width))
    if keep:
        kl, metrics = pair_consistency(torch.cat(p_ref), torch.cat(p_pert), torch.cat(segs), torch.cat(added),
                                       len(keep), eps=config.eps, target_ref=torch.cat(t_ref),
                                       target_pert=torch.cat(t_pert))
        for i, k in enumerate(keep):
            values = {"kl": float(kl[i]), **{m: float(v[i]) for m, v in metrics.items()}}
            values = {m: (None if isinstance(v, float) and math.isnan(v) else v) for m, v in values.items()}
            values["decisions"] = int(metrics["decisions"][i])
            values["n_added"] = len(pairs[k].added)
            records.append(_record(pairs[k].item, **values))
    return records


def run_consistency(items: Sequence[EvalItem], examples: Iterable[Example], model: Any, tokenizer: Any,
                    fmt: CallFormat, out_dir: str | Path, config: ConsistencyConfig, seed: int,
                    progress: bool = True) -> dict[str, int]:
    """Append the records of every item not yet in `out_dir/consistency.jsonl`; counts."""
    from tqdm import tqdm

    path = Path(out_dir) / CONSISTENCY
    done, _ = existing_keys(path)
    todo = [it for it in items if it.perturbation not in NOT_COMPARED and it.key not in done]
    pairs, skipped = build_pairs(examples, todo, seed)
    pairs.sort(key=lambda p: (p.item.names, p.item.id))
    was_training = getattr(model, "training", False)
    model.eval()
    written = 0
    try:
        with path.open("a", encoding="utf-8") as f, tqdm(total=len(pairs),
                                                         desc=f"consistency {Path(out_dir).name}",
                                                         unit="pair", disable=not progress) as bar:
            for it, reason in skipped:
                f.write(json.dumps(_record(it, skipped=reason), ensure_ascii=False) + "\n")
            for start in range(0, len(pairs), config.chunk_size):
                chunk = pairs[start:start + config.chunk_size]
                for rec in measure(model, tokenizer, fmt, chunk, config):
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
                    written += 1
                f.flush()
                bar.update(len(chunk))
    finally:
        model.train(was_training)
    log.info("consistency: %d items read, %d skipped, %d already in %s", written, len(skipped), len(done),
             path)
    return {"read": written, "skipped": len(skipped), "already_done": len(done)}


def read_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """The complete lines of `run_dir/consistency.jsonl` ([] without one)."""
    path = Path(run_dir) / CONSISTENCY
    if not path.is_file():
        return []
    return read_jsonl(path, torn="skip")


def item_values(records: Sequence[Mapping[str, Any]], lay: Any) -> dict[str, dict[str, Any]]:
    """names -> metric -> {"types": type -> item -> value, "groups": group -> item -> value,
    "mean": item -> value}."""
    raw: dict[tuple[str, str, str, str], list[float]] = defaultdict(list)
    for r in records:
        for m in METRICS:
            if r.get(m) is not None:
                raw[(r["names"], m, r["perturbation"], r["id"])].append(float(r[m]))
    types: dict[str, dict[str, dict[str, dict[str, float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(dict)))
    for (names, m, t, item), v in raw.items():
        types[names][m][t][item] = math.fsum(v) / len(v)
    out: dict[str, dict[str, Any]] = {}
    for names, per_metric in types.items():
        out[names] = {}
        for m, by_type in per_metric.items():
            groups: dict[str, dict[str, float]] = {}
            for g in lay.groups:
                per_item: dict[str, list[float]] = defaultdict(list)
                for t in lay.members[g]:
                    for i, v in by_type.get(t, {}).items():
                        per_item[i].append(v)
                if per_item:
                    groups[g] = {i: math.fsum(v) / len(v) for i, v in per_item.items()}
            held: dict[str, list[float]] = defaultdict(list)
            for g in lay.mean_groups:
                for i, v in groups.get(g, {}).items():
                    held[i].append(v)
            out[names][m] = {"types": dict(by_type), "groups": groups,
                             "mean": {i: math.fsum(v) / len(v) for i, v in held.items()}}
    return out


def _estimate(values: Mapping[Any, float], metric: str, config: ReportConfig) -> dict[str, Any]:
    return mean_estimate(list(values.values()), method=config.mean_method,
                         confidence=config.confidence).to_json(scale=SCALE[metric])


def _layout(records: Sequence[Mapping[str, Any]], config: ReportConfig, preferred: Sequence[str]) -> Any:
    return layout([r for r in records if "perturbation" in r], config, preferred)


def summarize_consistency(records: Sequence[Mapping[str, Any]], config: ReportConfig | None = None,
                          preferred: Sequence[str] = ()) -> dict[str, Any]:
    """summary.json's `consistency`: per names, each metric per type, group and Mean with intervals."""
    config = config or ReportConfig()
    measured = [r for r in records if "skipped" not in r]
    lay = _layout(records, config, preferred)
    values = item_values(measured, lay)
    by_names: dict[str, Any] = {}
    for names in sorted(values, key=lambda n: (n != "original", n)):
        v = values[names]
        entry: dict[str, Any] = {"types": {}, "groups": {}, "mean": {}}
        for t in lay.types:
            row = {m: _estimate(v[m]["types"][t], m, config) for m in METRICS
                   if t in v.get(m, {}).get("types", {})}
            if row:
                entry["types"][t] = {"group": lay.group_of[t], **row}
        for g in lay.groups:
            row = {m: _estimate(v[m]["groups"][g], m, config) for m in METRICS
                   if g in v.get(m, {}).get("groups", {})}
            if row:
                entry["groups"][g] = row
        entry["mean"] = {m: _estimate(v[m]["mean"], m, config) for m in METRICS if v.get(m, {}).get("mean")}
        entry["mean_groups"] = [g for g in lay.mean_groups if g in entry["groups"]]
        by_names[names] = entry
    return {"n_records": len(records), "n_measured": len(measured),
            "skipped": dict(Counter(r["skipped"].split(":")[0] for r in records if "skipped" in r)),
            "units": {m: UNITS[m] for m in METRICS}, "groups": {g: list(lay.members[g]) for g in lay.groups},
            "names": by_names}


def format_cell(e: Mapping[str, Any] | None, metric: str = "accuracy", signed: bool = False) -> str:
    """One table cell: an estimate with its CI half-width (KL in nats, others through `stats.fmt`), or n/a."""
    if not e or e.get("value") is None:
        return "n/a"
    if metric == "kl":
        v = f"{e['value']:+.3f}" if signed else f"{e['value']:.3f}"
        return v if e.get("half_width") is None else f"{v} ± {e['half_width']:.3f}"
    return fmt(e, signed=signed)


def render_consistency(cons: Mapping[str, Any]) -> str:
    """report.md's consistency section: per names, rows = metrics, columns = groups and Mean."""
    groups = list(cons["groups"])
    out = ["", "## Held-out consistency (teacher-forced reference response)", "",
           f"{cons['n_measured']} items read; KL in nats, agreement and mass in %, "
           "95% half-widths over items."]
    if cons["skipped"]:
        out.append("Skipped (reasons in consistency.jsonl): "
                   + ", ".join(f"{k} {n}" for k, n in cons["skipped"].items()) + ".")
    for names, e in cons["names"].items():
        rows = [[LABELS[m]] + [format_cell(e["groups"].get(g, {}).get(m), m) for g in groups]
                + [format_cell(e["mean"].get(m), m)] for m in METRICS]
        out += ["", f"### {names} names", "", table(["", *groups, "Mean"], rows)]
        type_rows = [[t, v["group"], *(format_cell(v.get(m), m) for m in METRICS)]
                     for t, v in e["types"].items()]
        out += ["", table(["type", "group", *(LABELS[m] for m in METRICS)], type_rows)]
    out.append("")
    return "\n".join(out)


def attach(run_dir: str | Path, summary: dict[str, Any], config: ReportConfig) -> str:
    """Add `consistency` to a run's summary when it has consistency.jsonl; the report section ('' if not)."""
    records = read_records(run_dir)
    if not records:
        return ""
    summary["consistency"] = summarize_consistency(records, config, summary.get("types", ()))
    return render_consistency(summary["consistency"])


def compare_consistency(run_a: str | Path, run_b: str | Path, config: ReportConfig) -> dict[str, Any] | None:
    """B − A per names, metric, type, group and Mean, paired over items (None unless both have records)."""
    rec_a, rec_b = read_records(run_a), read_records(run_b)
    if not rec_a or not rec_b:
        return None
    lay = _layout(rec_a + rec_b, config, ())
    va = item_values([r for r in rec_a if "skipped" not in r], lay)
    vb = item_values([r for r in rec_b if "skipped" not in r], lay)
    out: dict[str, Any] = {}
    for names in [n for n in va if n in vb]:
        entry: dict[str, Any] = {}
        for m in METRICS:
            a, b = va[names].get(m), vb[names].get(m)
            if not a or not b:
                continue

            def diff(x: Mapping[Any, float], y: Mapping[Any, float], metric: str = m) -> dict[str, Any]:
                est, unpaired = paired_difference(x, y, method=config.mean_method,
                                                  confidence=config.confidence)
                return {**est.to_json(scale=SCALE[metric]), "unpaired": unpaired}

            entry[m] = {"types": {t: diff(b["types"][t], a["types"][t]) for t in lay.types
                                  if t in a["types"] and t in b["types"]},
                        "groups": {g: diff(b["groups"][g], a["groups"][g]) for g in lay.groups
                                   if g in a["groups"] and g in b["groups"]}}
            if a["mean"] and b["mean"]:
                entry[m]["mean"] = diff(b["mean"], a["mean"])
        out[names] = entry
    return out


def render_consistency_comparison(cmp: Mapping[str, Any]) -> str:
    """compare.md's consistency section: B − A per metric, groups and Mean."""
    out = ["", "## Held-out consistency, B − A (paired over items)"]
    for names, entry in cmp.items():
        groups = list(dict.fromkeys(g for v in entry.values() for g in v["groups"]))
        rows = [[LABELS[m]] + [format_cell(v["groups"].get(g), m, signed=True) for g in groups]
                + [format_cell(v.get("mean"), m, signed=True)] for m, v in entry.items()]
        out += ["", f"### {names} names", "", table(["", *groups, "Mean"], rows)]
    out.append("")
    return "\n".join(out)
