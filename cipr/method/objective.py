"""CIPR's consistency objective in one place: which terms run, on which pairs, with which weights.

Every training engine (GRPO single- and multi-turn, the supervised regime, self-distillation) reads the
action distributions of its batch, describes the batch to `cipr.method.pairing` (which builds every pair the
terms compare) and calls `Objective`; the engine adds what it returns to its task loss (scaled by gradient
accumulation as it scales its own). A researcher changes the method here, or from their own file, never in a
trainer.

Terms. Every term has the signature of `cipr.method.consistency.mean_kl`:

    fn(p_ref [N, A], p_other [N, A], segments [N], **options) -> (scalar tensor, dict[str, float])

over paired rows of action distributions (one index set of equivalence classes, ∅ last; rows renormalized
to sum to 1 in float64). Its kind says which rows it is given (`cipr.method.pairing`):
- `rescore`: the decisions of responses to the canonical prompt (GRPO's canonical rollouts, the supervised
  regime's reference targets, distillation's trajectories, every turn of an episode): `p_ref` read under the
  canonical prompt, `p_other` at the same decision of the same pair relabeled with fresh neutral names
  (`cipr.method.relabel`), `segments` the response of each decision (each response weighs once).
- `rollout`: GRPO's G responses under each interface: per group (a pair; in multi-turn episodes a (pair,
  turn) group), `p_ref` the canonical responses' average action distribution and `p_other` the perturbed
  ones', `segments` the pair of each group (a pair's turns weigh 1/n_turns, pairs equally). Only GRPO has
  rollouts (`REGIME_KINDS`); the supervised regime and distillation refuse a rollout term.
With `detach_reference` (the default) `p_ref` carries no gradient: the canonical policy moves only under the
task loss. Built in: `rescore` and `rollout`, both `cipr.method.consistency.mean_kl` (KL(ref ‖ other) per
row, averaged per segment, then over segments).

Context. A term that declares any of these keyword parameters also gets them (the built-ins declare none):
- `step` (int): the optimizer step being taken, 0-based (the trace's after-read gets the same step), and
  `max_steps` (int): the stage's number of optimizer steps; what a schedule of the weight needs;
- `targets` [N] (long): per row, the column of the reference action on the canonical side, -1 where the
  engine knows none. The supervised regime gives the reference target's choice at every call (and the ∅ of a
  target without calls; the end of turn after calls is -1, as `action_nll` scores it); GRPO, episodes and
  distillation give -1 everywhere (a sampled response has no reference action per decision). What a gate on
  correctness needs.

Rows. `pairs` (`module:function`) chooses which rows a term compares: `select(pairs: Pairs) -> rows`, a bool
mask [N] or long indices into the N rows, given the term's `Pairs` (targets filled with -1 where unknown);
the term then sees those rows only (a segment keeps its kept rows; a term left with none adds 0 and is not
called). Logged as `consistency/<term>/rows_kept`.

Configuration: `algo.terms`, one `TermConfig` per name. A bad `fn` or `pairs` (no module, no function, not
callable, a wrong signature or return) is a ConfigError naming `algo.terms.<name>.fn` or `.pairs` before any
training (`resolve_terms` calls each once on a small example).

Metrics (into metrics.jsonl): `consistency/<term>/<name>` for every name a term returns (the built-ins:
`kl`, `max`, `tv`, `argmax_agree`, `none_canon`, `none_other`, `rows`, `segments`), `consistency/<term>/value`
its returned scalar, and the pairs' own counts (`consistency/rescore/decisions`, `.../responses`,
`consistency/relabel_failures`, `consistency/rollout/groups`, `consistency/pairs_skipped`, ...).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from cipr.core.errors import ConfigError
from cipr.method.consistency import group_distribution, mean_kl, renormalized

Kind = Literal["rescore", "rollout"]
KINDS: tuple[str, ...] = ("rescore", "rollout")
TermFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]
CONTEXT: tuple[str, ...] = ("step", "max_steps", "targets")
"""The keyword parameters a term may declare: the step, the stage's steps, the reference actions."""
BUILTINS: dict[str, tuple[TermFn, str]] = {"rescore": (mean_kl, "rescore"), "rollout": (mean_kl, "rollout")}
"""Built-in terms by name: (function, kind)."""
REGIME_KINDS: dict[str, tuple[str, ...]] = {"rl": KINDS, "supervised": ("rescore",), "distill": ("rescore",)}
"""The kinds of term each regime has pairs for: only GRPO samples the rollouts a rollout term compares."""
Select = Callable[["Pairs"], torch.Tensor]


@dataclass
class TermConfig:
    """One consistency term (module docstring).

    - `weight`: its λ in the loss; null: off (not computed); 0: computed and logged, not trained on.
    - `fn`: `module:function` of a term from your own file; null: the built-in term of this name.
    - `kind`: `rescore` or `rollout` (which pairs the term sees); null: the built-in's, else `rescore`.
    - `options`: keyword arguments passed to the function.
    - `pairs`: `module:function` choosing the rows the term compares (module docstring); null: all.
    """

    weight: float | None = 0.0
    fn: str | None = None
    kind: Kind | None = None
    options: dict[str, Any] = field(default_factory=dict)
    pairs: str | None = None


@dataclass(frozen=True)
class Term:
    """A resolved term: its name, function, kind, weight, options, the context it declares and the rows it
    compares (`select`; None: all)."""

    name: str
    fn: TermFn
    kind: str
    weight: float
    options: Mapping[str, Any]
    context: tuple[str, ...] = ()
    select: Select | None = None


def _import(text: str, where: str) -> Callable[..., Any]:
    module_name, sep, attr = text.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{where}={text!r}: write it as module:function (the module importable from "
                          f"PYTHONPATH)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"{where}={text!r}: cannot import module {module_name!r} ({e}); is its folder on "
                          f"PYTHONPATH?") from None
    fn: Any = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise ConfigError(f"{where}={text!r}: module {module_name!r} has no {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise ConfigError(f"{where}={text!r}: {attr!r} is not callable")
    return fn


def wanted_context(fn: Callable[..., Any]) -> tuple[str, ...]:
    """The `CONTEXT` names `fn` declares as parameters (module docstring)."""
    try:
        params = inspect.signature(fn).parameters
    except ValueError:  # a builtin without a signature
        return ()
    return tuple(name for name in CONTEXT if name in params)


def _probe_context(rows: int) -> dict[str, Any]:
    return {"step": 0, "max_steps": 10, "targets": torch.tensor(([0, 1, -1] * rows)[:rows])}


def _check_signature(fn: Callable[..., Any], options: Mapping[str, Any], where: str) -> None:
    context = {k: v for k, v in _probe_context(1).items() if k in wanted_context(fn)}
    try:
        inspect.signature(fn).bind(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, dtype=torch.long),
                                   **options, **context)
    except TypeError as e:
        raise ConfigError(f"{where}: the function must take (p_ref, p_other, segments, **options) "
                          f"like mean_kl (and, if it wants them, step, max_steps, targets); calling it "
                          f"with the configured options fails: {e}") from None
    except ValueError:  # a builtin without a signature: the probe call decides
        pass


def _probe(fn: TermFn, options: Mapping[str, Any], where: str) -> None:
    """Call `fn` once on two 3-row distributions with gradient and check what it returns."""
    p = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.5, 0.25, 0.25]], dtype=torch.float64)
    logits = torch.zeros(3, 3, dtype=torch.float64, requires_grad=True)
    q = torch.softmax(logits + torch.tensor([[0.1, 0.0, 0.0], [0.0, 0.2, 0.0], [0.0, 0.0, 0.3]],
                                            dtype=torch.float64), -1)
    context = {k: v for k, v in _probe_context(3).items() if k in wanted_context(fn)}
    try:
        out = fn(p, q, torch.tensor([0, 0, 1]), **options, **context)
    except Exception as e:  # noqa: BLE001 - the user's code: any failure is reported as this one error
        raise ConfigError(f"{where}: the function fails on a small example: {type(e).__name__}: "
                          f"{e}") from None
    if not (isinstance(out, tuple) and len(out) == 2):
        raise ConfigError(f"{where}: the function must return (scalar tensor, dict of floats); it returned "
                          f"{type(out).__name__}")
    value, metrics = out
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else ""
        raise ConfigError(f"{where}: the first return value must be a scalar tensor, got "
                          f"{type(value).__name__}{shape}")
    if not isinstance(metrics, Mapping) or not all(
            isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool)
            for k, v in metrics.items()):
        raise ConfigError(f"{where}: the second return value must be a dict of str to float")
    if not value.requires_grad:
        raise ConfigError(f"{where}: the returned value carries no gradient from p_other (compute it with "
                          f"torch operations on the inputs)")


def resolve_terms(terms: Mapping[str, TermConfig], *, where: str = "algo.terms",
                  allowed: Sequence[str] = KINDS) -> list[Term]:
    """The terms that are on (weight not null), each function imported and checked (module docstring);
    ConfigError naming the option otherwise. `allowed`: the kinds the engine has pairs for."""
    out = []
    for name, cfg in terms.items():
        key = f"{where}.{name}"
        if cfg.weight is None:
            continue
        if cfg.weight < 0 or cfg.weight != cfg.weight:
            raise ConfigError(f"{key}.weight={cfg.weight} must be >= 0 (null turns the term off)")
        if cfg.fn is None:
            if name not in BUILTINS:
                raise ConfigError(f"{key}: no built-in term is named {name!r} (built in: "
                                  f"{', '.join(BUILTINS)}); set {key}.fn=module:function for your own")
            fn, kind = BUILTINS[name]
        else:
            fn, kind = _import(cfg.fn, f"{key}.fn"), "rescore"
            _check_signature(fn, cfg.options, f"{key}.fn={cfg.fn}")
            _probe(fn, cfg.options, f"{key}.fn={cfg.fn}")
        kind = cfg.kind or kind
        if kind not in KINDS:
            raise ConfigError(f"{key}.kind={kind!r}; choose rescore or rollout")
        if kind not in allowed:
            if not cfg.weight:  # nothing to compute and nothing trained on: the term does not apply here
                continue
            raise ConfigError(f"{key}: a {kind} term needs pairs this regime does not have (it has "
                              f"{' and '.join(allowed) or 'none'}); set {key}.weight=0 or null")
        select = None
        if cfg.pairs is not None:
            select = _import(cfg.pairs, f"{key}.pairs")
            _probe_select(select, f"{key}.pairs={cfg.pairs}")
        out.append(Term(name, fn, kind, float(cfg.weight), dict(cfg.options), wanted_context(fn), select))
    return out


def _probe_select(select: Select, where: str) -> None:
    """Call `select` once on three pairs (targets 0, 1, -1) and check that it returns rows of them."""
    p = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.2, 0.6], [0.5, 0.25, 0.25]], dtype=torch.float64)
    pairs = Pairs(p, p.flip(-1), torch.tensor([0, 0, 1]), {}, torch.tensor([0, 1, -1]))
    try:
        chosen_rows(pairs, select(pairs))
    except Exception as e:  # noqa: BLE001 - the user's code: any failure is reported as this one error
        raise ConfigError(f"{where}: the function must take the term's Pairs and return the rows to compare "
                          f"(a bool mask [N] or long indices); on a small example: {type(e).__name__}: "
                          f"{e}") from None


def chosen_rows(pairs: Pairs, rows: Any) -> torch.Tensor:
    """The long indices [K] of `rows` (a bool mask [N] or long indices into `pairs`' N rows); ValueError
    for anything else."""
    n = pairs.segments.shape[0]
    if not isinstance(rows, torch.Tensor) or rows.dim() != 1:
        raise ValueError(f"expected a 1-D tensor, got {type(rows).__name__}"
                         f"{tuple(rows.shape) if isinstance(rows, torch.Tensor) else ''}")
    if rows.dtype == torch.bool:
        if rows.shape[0] != n:
            raise ValueError(f"a bool mask needs one entry per row ({n}), got {rows.shape[0]}")
        return rows.nonzero().squeeze(1).to(pairs.segments.device)
    if rows.dtype.is_floating_point or rows.dtype.is_complex:
        raise ValueError(f"rows must be bool or integer, got {rows.dtype}")
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= n):
        raise ValueError(f"row indices must be in [0, {n}), got {rows.tolist()}")
    return rows.long().to(pairs.segments.device)


def weighted_sum(parts: Sequence[tuple[float, torch.Tensor]], zero: torch.Tensor) -> torch.Tensor:
    """Σ weight · value over `parts` whose weight is not 0 (a weight-0 part is computed and logged by its
    caller, not trained on), or `zero * 0` (keeping its graph) when none is: the one weighted sum of the
    consistency terms and of distillation's task terms."""
    total: torch.Tensor | None = None
    for weight, value in parts:
        if weight:
            total = weight * value if total is None else total + weight * value
    return zero.sum() * 0.0 if total is None else total


@dataclass(frozen=True)
class Pairs:
    """One kind's paired rows for the terms: p_ref, p_other [N, A], segments [N] (module docstring), the
    counts of how they were built (logged as `consistency/<name>`) and the reference action of each row
    (targets [N], -1 unknown; None: unknown everywhere)."""

    p_ref: torch.Tensor
    p_other: torch.Tensor
    segments: torch.Tensor
    metrics: Mapping[str, float] = field(default_factory=dict)
    targets: torch.Tensor | None = None

    def filled(self) -> Pairs:
        """These pairs with `targets` a tensor (-1 everywhere when unknown)."""
        if self.targets is not None:
            return self
        return dataclasses.replace(self, targets=torch.full(self.segments.shape, -1, dtype=torch.long,
                                                            device=self.segments.device))

    def rows(self, index: torch.Tensor) -> Pairs:
        """These pairs at rows `index` [K] (long) only."""
        targets = None if self.targets is None else self.targets[index.to(self.targets.device)]
        return Pairs(self.p_ref[index.to(self.p_ref.device)], self.p_other[index.to(self.p_other.device)],
                     self.segments[index], self.metrics, targets)


def rescore_pairs(p_canon: torch.Tensor, p_relabeled: torch.Tensor, segments: torch.Tensor,
                  metrics: Mapping[str, float] | None = None, targets: torch.Tensor | None = None) -> Pairs:
    """The rescoring pairs from the canonical decisions [D, A] and the relabeled ones [D, A] (decision d of
    both the same one), segments [D] the response of each; rows renormalized in float64 (`renormalized`:
    float32 rows sum to 1 only within ~1e-7, which makes the KL of nearly equal rows slightly negative);
    targets [D] the reference action of each decision (-1 unknown), for a term that declares `targets`."""
    if p_canon.shape != p_relabeled.shape:
        raise RuntimeError(f"relabeled decisions {tuple(p_relabeled.shape)} do not match the canonical ones "
                           f"{tuple(p_canon.shape)}")
    p_canon, p_relabeled = renormalized(p_canon), renormalized(p_relabeled)
    counts = {"rescore/decisions": float(len(segments)),
              "rescore/responses": float(len(torch.unique(segments)))}
    if targets is not None and targets.shape != segments.shape:
        raise ValueError(f"targets {tuple(targets.shape)} must be [D] = [{segments.shape[0]}]")
    return Pairs(p_canon, p_relabeled, segments, {**counts, **(metrics or {})}, targets)


def rollout_pairs(p_canon: torch.Tensor, canon_units: torch.Tensor, canon_groups: torch.Tensor,
                  p_pert: torch.Tensor, pert_units: torch.Tensor, pert_groups: torch.Tensor,
                  group_pairs: torch.Tensor, metrics: Mapping[str, float] | None = None) -> Pairs:
    """The rollout pairs: each side's decisions [Ds, A] (renormalized in float64) averaged per unit (a
    response, or an episode's turn: `*_units` [Ds]), then per group (`*_groups` [Us], ids 0..Gn-1 shared by
    both sides); segments = `group_pairs` [Gn], the pair of each group."""
    if p_canon.shape[1:] != p_pert.shape[1:]:
        raise ValueError(f"the two sides need one action index set, got A={p_canon.shape[1]} and "
                         f"A={p_pert.shape[1]}")
    canon_avg, canon_ids = group_distribution(renormalized(p_canon), canon_units, canon_groups)
    pert_avg, pert_ids = group_distribution(renormalized(p_pert), pert_units, pert_groups)
    if not torch.equal(canon_ids.cpu(), pert_ids.cpu()):
        raise ValueError(f"the two sides have different groups: {canon_ids.tolist()} vs {pert_ids.tolist()}")
    segments = group_pairs.to(canon_ids.device)[canon_ids]
    counts = {"rollout/groups": float(len(canon_ids)), "rollout/pairs": float(len(torch.unique(segments)))}
    return Pairs(canon_avg, pert_avg, segments, {**counts, **(metrics or {})})


class Objective:
    """The consistency terms of a run (module docstring): `objective(rescore=..., rollout=...)` -> (Σ λ·term,
    metrics)."""

    def __init__(self, terms: Sequence[Term], *, detach_reference: bool = True, eps: float = 1e-6) -> None:
        self.terms = list(terms)
        self.detach_reference = detach_reference
        self.eps = eps

    @classmethod
    def from_config(cls, terms: Mapping[str, TermConfig], *, regime: str = "rl",
                    detach_reference: bool = True, eps: float = 1e-6, where: str = "algo.terms") -> Objective:
        """The terms of `regime` (`REGIME_KINDS`: the kinds it has pairs for), resolved and checked."""
        return cls(resolve_terms(terms, where=where, allowed=REGIME_KINDS[regime]),
                   detach_reference=detach_reference, eps=eps)

    @classmethod
    def builtin(cls, *, detach_reference: bool = True, eps: float = 1e-6, **weights: float) -> Objective:
        """The built-in terms at the given weights, e.g. `Objective.builtin(rescore=1.0)`."""
        return cls([Term(name, *BUILTINS[name], float(w), {}) for name, w in weights.items()],
                   detach_reference=detach_reference, eps=eps)

    def uses(self, kind: str) -> bool:
        """Whether any term of `kind` runs (so the engine builds its pairs)."""
        return any(t.kind == kind for t in self.terms)

    def __bool__(self) -> bool:
        return bool(self.terms)

    def __call__(self, zero: torch.Tensor, *, rescore: Pairs | None = None, rollout: Pairs | None = None,
                 step: int = 0, max_steps: int = 0) -> tuple[torch.Tensor, dict[str, float]]:
        """Σ weight · value over the terms whose pairs are given (`weighted_sum`), and the metrics. `step` and
        `max_steps` reach the terms that declare them; each term sees the rows it selects (module
        docstring)."""
        pairs = {"rescore": rescore, "rollout": rollout}
        metrics: dict[str, float] = {}
        for given in pairs.values():
            if given is not None:
                metrics.update({f"consistency/{k}": float(v) for k, v in given.metrics.items()})
        parts: list[tuple[float, torch.Tensor]] = []
        for term in self.terms:
            given = pairs[term.kind]
            if given is None:
                continue
            prefix = f"consistency/{term.name}/"
            if term.select is not None:
                given = given.filled()
                given = given.rows(chosen_rows(given, term.select(given)))
                metrics[prefix + "rows_kept"] = float(given.segments.shape[0])
                if not given.segments.shape[0]:  # nothing left to compare: the term adds nothing
                    metrics[prefix + "value"] = 0.0
                    parts.append((term.weight, given.p_other.sum() * 0.0))
                    continue
            ref = given.p_ref.detach() if self.detach_reference else given.p_ref
            options = dict(term.options)
            if term.fn is mean_kl:
                options.setdefault("eps", self.eps)
            if term.context:
                known = {"step": int(step), "max_steps": int(max_steps), "targets": given.filled().targets}
                options.update({k: known[k] for k in term.context})
            value, term_metrics = term.fn(ref, given.p_other, given.segments, **options)
            metrics[prefix + "value"] = float(value.detach())
            metrics.update({prefix + k.removeprefix(f"{term.name}/"): float(v)
                            for k, v in term_metrics.items()})
            parts.append((term.weight, value))
        return weighted_sum(parts, zero), metrics
