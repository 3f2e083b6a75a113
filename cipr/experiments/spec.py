"""A study as data: the spec a researcher writes (`configs/study/NAME.yaml`, or `DIR/study/NAME.yaml` with
`--config-dir DIR`) and the options of one `cipr-study` invocation.

A spec names what every point trains (`base`, `arms`: plain cipr-train overrides, so a GPU node or Slurm
trains a point the same way), the pairing (`control`, `seeds`), what is read (`read_at`, `items`,
`measures`), and how the answer is decided (`decision`, as data). `cipr.experiments.study` runs it,
`cipr.experiments.study_report` analyses it. A study whose report predates the engine keeps its analysis as
one named function (`analysis`), which `cipr-study report` calls.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, Literal

from cipr.core.config import CONFIG_ROOT
from cipr.core.errors import ConfigError

STUDY_CONFIG = "cipr_study"
"""The command's primary config (configs/cipr_study.yaml); the specs are its `study` group."""


@dataclass(frozen=True)
class Measure:
    """A per-item quantity of the records, summarized per point as a mean over items times `scale`."""

    field: str
    scale: float
    lower_is_better: bool
    unit: str


MEASURES: dict[str, Measure] = {
    "heldin_kl": Measure("kl", 1.0, True, "nats"),
    "action_accuracy": Measure("correct", 100.0, False, "points"),
    "p_reference": Measure("p_ref", 1.0, False, "probability"),
}
"""The measures read from the calibration items: the held-in KL(unperturbed ‖ relabeled) averaged over an
item's decisions; whether the unperturbed side's most likely action is the reference's at every scored
decision (`correct`, 0/1, reported in points); the unperturbed side's probability of the reference action
(`p_ref`, averaged over the scored decisions: a continuous accuracy with less item noise)."""


@dataclass
class ItemsSpec:
    """How the calibration items are drawn (`cipr.experiments.study.draw_items`).

    - `source`: `synthetic` (the training generator's test stream with the training data's options).
    - `split`: the splits drawn: `near` (held-in: the called tool and query template, and every listed tool,
      occur in training) and/or `hard` (the called tool or its template never occurs in training).
    - `n`: items per split.
    - `seed`: the test stream's seed (one no study has read).
    - `exclude`: earlier studies' streams, each `{seed, n}`: every item of both splits of
      `transfer_items(data, n, seed)` is excluded (with every training-pool item, always).
    - `perturbation`: the held-in relabeling each item is read under, against its unperturbed side (the
      measures read it).
    - `also`: more perturbation types read on every item; `secondary`: types read on the first
      `secondary_items` items of each split (records only: a named analysis reads them).
    - `perturbation_seed`: the seed of the perturbed copies.
    """

    source: Literal["synthetic"] = "synthetic"
    split: list[Literal["near", "hard"]] = field(default_factory=lambda: ["near"])
    n: int = 64
    seed: int = 0
    exclude: list[dict[str, int]] = field(default_factory=list)
    perturbation: str = "relabel_function"
    also: list[str] = field(default_factory=list)
    secondary: list[str] = field(default_factory=list)
    secondary_items: int = 0
    perturbation_seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 1 or self.secondary_items < 0:
            raise ConfigError(f"study.items.n={self.n} must be >= 1 and secondary_items >= 0")
        if not self.split or len(set(self.split)) != len(self.split):
            raise ConfigError(f"study.items.split={self.split}: give near and/or hard, once each")
        types = [self.perturbation, *self.also, *self.secondary]
        if len(set(types)) != len(types):
            raise ConfigError(f"study.items: perturbation, also and secondary name {types}: each type once")
        for k, stream in enumerate(self.exclude):
            if set(stream) != {"seed", "n"}:
                raise ConfigError(f"study.items.exclude[{k}]={stream}: give {{seed: S, n: N}}")
            if stream["seed"] == self.seed:
                raise ConfigError(f"study.items.seed={self.seed} is excluded stream {k}: choose a stream no "
                                  f"study has read")


OPS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt}


@dataclass
class Condition:
    """One condition of a decision rule, on a comparison at the decision's step.

    - `measure`: a measure of the spec.
    - `stat`: `mean` (the paired mean difference), `relative` (it divided by the reference's mean), `low` /
      `high` (the interval's ends).
    - `interval`: `two_way` (seed × item bootstrap) or `t` (paired t over seeds), for `low` / `high`.
    - `op`, `value`: the test, e.g. `{stat: high, op: "<", value: 0}`.
    - `against`: the reference arm (null: the control).
    """

    measure: str
    stat: Literal["mean", "relative", "low", "high"]
    op: Literal["<=", ">=", "<", ">"]
    value: float
    interval: Literal["two_way", "t"] = "two_way"
    against: str | None = None

    def text(self, control: str) -> str:
        what = {"mean": "mean difference", "relative": "relative difference",
                "low": f"lower end of the {'seed x item bootstrap' if self.interval == 'two_way' else 't'} "
                       f"95% interval", "high": f"upper end of the "
                       f"{'seed x item bootstrap' if self.interval == 'two_way' else 't'} 95% interval"}
        return f"{self.measure} vs {self.against or control}: {what[self.stat]} {self.op} {self.value:g}"


@dataclass
class DecisionSpec:
    """The rule: an arm qualifies when every condition holds at `step`; the chosen arm is the first
    qualifying one in `arms` (null: every arm but the control, in the spec's order); none if none does.

    - `step`: the read step the rule looks at (null: the last of `read_at`).
    - `then`: what follows from a chosen arm, and from none (one sentence each, printed in the report).
    """

    conditions: list[Condition] = field(default_factory=list)
    step: int | None = None
    arms: list[str] | None = None
    then: dict[str, str] = field(default_factory=dict)


@dataclass
class BootstrapSpec:
    """The seed × item bootstrap: `draws` resamples, generator seeded with `seed`."""

    draws: int = 4000
    seed: int = 0


@dataclass
class StudySpec:
    """One study (module docstring).

    - `name`: the report's file stem (REPORT/NAME.json, .md, ...).
    - `title`, `question`: the report's heading and its question, in words.
    - `preregistration`: the pre-registration file, relative to the report folder (linked from the report).
    - `base`: cipr-train overrides every point gets (e.g. `+sweep=cpu_dose`).
    - `arms`: arm name -> its cipr-train overrides.
    - `control`: the arm every other is compared with, paired by seed.
    - `contrasts`: more comparisons, each `[arm, reference arm]`.
    - `seeds`: the design's seeds; seed s sets trainer.seed and perturb.seed (each seed draws its own data and
      copies, the same in every arm).
    - `read_at`: the optimizer steps whose checkpoints are read (the largest is trained); a study without
      items may leave it empty (its points train for as long as `base` says; evaluations read `final/`).
    - `items`: the calibration items (`ItemsSpec`); null: none read (a study of `evaluations` only).
    - `measures`: the names of `MEASURES` read on them.
    - `evaluations`: name -> cipr-eval overrides, run on each point's final weights after its reads (the
      arm's `labels` fill `{key}` placeholders, e.g. `names=[{names}]`); their per-item records are for a
      named `analysis`.
    - `options`: parameters of a named analysis (e.g. which perturbation type is held in).
    - `trace_term`: the consistency term whose per-step trace (before and after each update, on the step's own
      pairs) is the positive control; every point gets `logging.trace=true`.
    - `decision`: the rule (`DecisionSpec`); null: no decision.
    - `threads`: torch threads of the whole process, from the first step of training to the last read.
    - `pythonpath`: folders put on sys.path first (a term of your own, `algo.terms.NAME.fn=module:function`).
    - `bootstrap`: the two-way bootstrap's draws and seed.
    - `labels`: arm -> fields written into each of its records and trace lines (e.g. `{lambda: 3}`), for a
      named analysis that groups by them (the labels of arms not in `arms` are left out: a run that gives
      `study.arms={...}` anew keeps the spec's labels of the arms it keeps).
    - `analysis`: a module whose analysis writes the report instead of the engine's (a report from before
      the engine, kept as it was): `study_report(records, traces, meta, report_dir)` after a run and
      `recompute(report_dir, name)` for `cipr-study report`; null: the engine's analysis.
    - `run`: false for a report kept without a runnable design (only `cipr-study report` applies).
    """

    name: str
    title: str = ""
    question: str = ""
    preregistration: str | None = None
    base: list[str] = field(default_factory=list)
    arms: dict[str, list[str]] = field(default_factory=dict)
    control: str = ""
    contrasts: list[list[str]] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    read_at: list[int] = field(default_factory=list)
    items: ItemsSpec | None = field(default_factory=ItemsSpec)
    measures: list[str] = field(default_factory=lambda: list(MEASURES))
    evaluations: dict[str, list[str]] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    trace_term: str | None = "rescore"
    decision: DecisionSpec | None = None
    threads: int | None = 1
    pythonpath: list[str] = field(default_factory=list)
    bootstrap: BootstrapSpec = field(default_factory=BootstrapSpec)
    labels: dict[str, dict[str, Any]] = field(default_factory=dict)
    analysis: str | None = None
    run: bool = True

    def __post_init__(self) -> None:
        if not self.run:
            return  # a report kept from before the engine: only its analysis runs
        where = f"study {self.name!r}"
        if self.control not in self.arms or len(self.arms) < 2:
            raise ConfigError(f"{where}: study.control={self.control!r} must be one of study.arms "
                              f"({', '.join(self.arms) or 'none'}), with at least one other arm")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"{where}: study.seeds={self.seeds}: give distinct seeds")
        if (self.items is not None and not self.read_at) or sorted(set(self.read_at)) != list(self.read_at) \
                or (self.read_at and self.read_at[0] < 1):
            raise ConfigError(f"{where}: study.read_at={self.read_at}: give ascending positive steps (only a "
                              f"study without items may give none: its points train as the base says)")
        unknown = [m for m in self.measures if m not in MEASURES]
        if unknown or (self.items is not None and not self.measures):
            raise ConfigError(f"{where}: study.measures {unknown or '[]'}; choose from {', '.join(MEASURES)}")
        if self.items is None and (self.measures or not self.evaluations):
            raise ConfigError(f"{where}: without study.items there is nothing to measure: give items, or "
                              f"evaluations and measures: []")
        for k, pair in enumerate(self.contrasts):
            if len(pair) != 2 or not set(pair) <= set(self.arms) or pair[0] == pair[1]:
                raise ConfigError(f"{where}: study.contrasts[{k}]={pair}: give [arm, reference arm], two "
                                  f"different arms of study.arms")
        self.labels = {a: v for a, v in self.labels.items() if a in self.arms}  # arms given anew keep theirs
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"{where}: study.threads={self.threads} must be >= 1 (null: torch's default)")
        if self.decision is not None:
            self._check_decision(where)

    def _check_decision(self, where: str) -> None:
        d = self.decision
        assert d is not None
        if d.step is not None and d.step not in self.read_at:
            raise ConfigError(f"{where}: study.decision.step={d.step} is not in study.read_at {self.read_at}")
        for arm in d.arms or []:
            if arm not in self.arms or arm == self.control:
                raise ConfigError(f"{where}: study.decision.arms: {arm!r} is not an arm other than the "
                                  f"control")
        for k, c in enumerate(d.conditions):
            if c.measure not in self.measures:
                raise ConfigError(f"{where}: study.decision.conditions[{k}].measure={c.measure!r} is not in "
                                  f"study.measures")
            if c.against is not None and c.against not in self.arms:
                raise ConfigError(f"{where}: study.decision.conditions[{k}].against={c.against!r} is not an "
                                  f"arm")
            if c.against not in (None, self.control):
                missing = [a for a in self.candidates
                           if a != c.against and [a, c.against] not in self.contrasts]
                if missing:
                    raise ConfigError(f"{where}: study.decision.conditions[{k}] compares against "
                                      f"{c.against!r}; add {[[a, c.against] for a in missing]} to "
                                      f"study.contrasts")

    @property
    def candidates(self) -> list[str]:
        chosen = self.decision.arms if self.decision and self.decision.arms else None
        return chosen or [a for a in self.arms if a != self.control]


@dataclass
class StudyOptions:
    """`cipr-study run|report study=NAME [--config-dir DIR] [key=value ...]`.

    - `study`: the spec (`StudySpec`; its keys are overridden as `study.KEY=VALUE`).
    - `out_dir`: run folders, per-point records, traces and timings (null: runs/study/NAME).
    - `report_dir`: where the report's files go (REPORT/NAME.json, .md, .png, records and traces).
    - `run_arms` / `run_seeds`: what this invocation trains and reads (null: all), for pieces of the run.
    - `report`: write the report after the points (`run`).
    - `keep_weights`: keep each point's checkpoints after they are read.
    - `batch_size`: sequences per forward pass of the action reader.
    - `train`: more cipr-train overrides for every point (e.g. `train.model=tiny` for a quick run).
    - `eval`: more cipr-eval overrides for every evaluation (e.g. `eval.benchmark=bfcl eval.backend=vllm`).
    """

    study: StudySpec
    out_dir: str | None = None
    report_dir: str = "docs/results"
    run_arms: list[str] | None = None
    run_seeds: list[int] | None = None
    report: bool = True
    keep_weights: bool = False
    batch_size: int = 8
    train: dict[str, Any] = field(default_factory=dict)
    eval: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.study.run:
            return
        for key, given, design in (("run_arms", self.run_arms, list(self.study.arms)),
                                   ("run_seeds", self.run_seeds, self.study.seeds)):
            if given is not None and not set(given) <= set(design):
                raise ConfigError(f"{key} {sorted(set(given) - set(design))} are not in the study's design "
                                  f"({design})")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size={self.batch_size} must be >= 1")

    @property
    def out(self) -> str:
        return self.out_dir or f"runs/study/{self.study.name}"


def load_options(overrides: list[str]) -> StudyOptions:
    """The invocation's options from `study=NAME`, `--config-dir DIR` (a search path) and key=value
    overrides, composed by Hydra (configs/cipr_study.yaml + the `study` group) and read strictly."""
    from omegaconf import OmegaConf

    from cipr.core.config import compose_checked, from_dict

    if not any(o.split("=", 1)[0].lstrip("+") == "study" for o in overrides):
        raise ConfigError("no study given: add study=NAME (configs/study/NAME.yaml, or DIR/study/NAME.yaml "
                          "with --config-dir DIR)")
    maps = ("study.arms", "study.labels", "study.evaluations", "study.options")
    added = ("train.", "eval.", *(f"{m}." for m in maps))
    given, overrides = overrides, []
    for o in given:  # a map's key is added or replaced; a whole map given replaces the spec's
        if o.split("=", 1)[0] in maps:
            overrides += [f"~{o.split('=', 1)[0]}", f"+{o}"]
        else:
            overrides.append(f"++{o}" if o.startswith(added) else o)
    composed = compose_checked(CONFIG_ROOT, STUDY_CONFIG, overrides, program="cipr-study")
    data = OmegaConf.to_container(composed, resolve=True)
    assert isinstance(data, dict)
    return from_dict(StudyOptions, data)
