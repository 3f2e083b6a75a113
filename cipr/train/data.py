"""Training prompts: examples from the project's loaders, under the names an algorithm trains with.

Sources (`data.source`): `synthetic` (`cipr.data.synthetic`, `tools_per_example` tools per interface),
`toolrl` (a ToolRL verl parquet: the 3,920-row `train.parquet` by `data.path`; the 80-row
`test.parquet` here), `toolrl_sft` (ToolRL's 400-example SFT JSON), `messages` (your own `messages` +
`tools` rows, TRL / OpenAI chat style, from the file or folder `data.path`: `cipr.data.messages`;
`data.on_bad_row=skip` counts and skips malformed rows instead of stopping at the first). Names
(`perturb.names`, `cipr.perturb.config`): `original`; `canonical` (`cipr.tools.canonical.canonicalize`);
`masked`, function masking (Lin et al., 2025): every tool and argument name becomes a random string (a
letter then `perturb.mask_length - 1` letters and digits) drawn from (seed, example id), applied as
canonicalization is; training only.

With `perturb.paired`, every canonical example is followed by its perturbed copy
(`cipr.perturb.training.perturb_for_training`: twins, relabeling, reordering; `perturb.preset` picks the
ablation variant and `perturb.twin_wordings` the twin wordings: `default`, never a cost cue, or the
`with_cost` ablation), and the two rows share a `pair_id`. Each row records the equivalence
class of each declared tool: canonical tool i has class i; a perturbed tool has the class of the
canonical tool it is equivalent to, and each added twin a class of its own after the n canonical ones
(`num_actions` = n + twins), so the two sides' action distributions live on one index set.

Choices:
- A held-out slice (`eval_examples`, drawn with the data seed) is kept out of training; the run
  scores greedy responses on it before and after the warm start.
- SFT targets are the reference calls (and reference response) rendered by the call format, with the
  format's placeholder reasoning: ToolRL's own reasoning text names the original tools, so it is used
  only with original names (`sft_think: example`).
- An example that cannot be used is never dropped silently: examples without any declared tool (no
  action distribution exists), those the perturbation rejects and the rows the loader skipped
  (`bad row: <reason>`) are counted by reason in `PromptSet.skipped`, logged and in `summary.json`.
"""

from __future__ import annotations

import dataclasses
import random
import string
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cipr.core.config import ConfigError
from cipr.core.errors import DataError
from cipr.data.row_formats import check_messages_options
from cipr.data.synthetic import SyntheticConfig
from cipr.formats.base import CallFormat
from cipr.perturb.config import PerturbConfig
from cipr.tools.canonical import NameMap, apply_name_map, canonicalize
from cipr.tools.interface import Example, Interface, Tool

Side = Literal["canonical", "perturbed", "single"]


@dataclass
class DataConfig:
    """Where training prompts come from and how they are prepared (module docstring).

    `n` (how many examples; 0 = all of a file) and `seed` (held-out split, masking, perturbation) mean the
    same for every source. The synthetic source hands them with `tools_per_example`, `parallel_fraction`,
    `no_call_fraction`, `same_domain_distractors`, `tools` (a narrower catalog) and `exclude` (tools and
    templates held back) to `cipr.data.synthetic.SyntheticConfig` (defaults and checks). `format` (`auto`,
    `messages`, `xlam`, `hermes_fc`, `glaive`) and `on_bad_row` (`raise` or `skip`) are the messages source's
    (`cipr.data.row_formats.load_rows`: published formats read as messages rows); the other sources always
    raise.
    """

    source: Literal["synthetic", "toolrl", "toolrl_sft", "messages"] = "synthetic"
    path: str | None = None
    format: Literal["auto", "messages", "xlam", "hermes_fc", "glaive"] = "auto"
    on_bad_row: Literal["raise", "skip"] = "raise"
    n: int = 64
    seed: int = 0
    tools_per_example: tuple[int, ...] = SyntheticConfig.tools_per_example
    parallel_fraction: float = SyntheticConfig.parallel_fraction
    no_call_fraction: float = SyntheticConfig.no_call_fraction
    same_domain_distractors: float = SyntheticConfig.same_domain_distractors
    tools: tuple[str, ...] = SyntheticConfig.tools
    exclude: tuple[str, ...] = SyntheticConfig.exclude
    eval_examples: int = 8
    sft_think: Literal["placeholder", "example"] = "placeholder"


@dataclass(frozen=True)
class PromptRecord:
    """One training prompt (a dataset row), with what the reward and the action reader need.

    `classes[i]` is the equivalence class of declared tool i, `twins[i]` whether it is an added twin,
    `twin_of[i]` (twins only) the name, in this interface, of the tool it degrades.
    """

    row: int
    pair_id: int
    side: Side
    example: Example
    prompt: str
    target: str
    classes: tuple[int, ...]
    twins: tuple[bool, ...]
    num_actions: int
    twin_of: tuple[str | None, ...] = ()

    @property
    def tools(self) -> tuple[str, ...]:
        return self.example.interface.names

    @property
    def expects_response(self) -> bool:
        return self.example.response is not None


@dataclass
class PromptSet:
    """Training rows (pairs adjacent when paired), held-out eval rows, and the skip counts."""

    records: list[PromptRecord]
    eval_records: list[PromptRecord]
    unit_size: int
    skipped: Counter = field(default_factory=Counter)

    def without_long_prompts(self, tokenizer: Any, max_tokens: int) -> PromptSet:
        """A copy without the training units (prompt or pair) holding a prompt over `max_tokens` tokens,
        counted in `skipped`, rows renumbered: verl's `filter_overlong_prompts` on whole pairs."""
        lengths = [len(ids) for ids in tokenizer([r.prompt for r in self.records],
                                                 add_special_tokens=False)["input_ids"]]
        keep: list[PromptRecord] = []
        skipped = Counter(self.skipped)
        for start in range(0, len(self.records), self.unit_size):
            unit = self.records[start:start + self.unit_size]
            if max(lengths[start:start + self.unit_size]) > max_tokens:
                skipped[f"prompt over trainer.max_prompt_length={max_tokens} tokens"] += 1
                continue
            base = len(keep)
            keep.extend([dataclasses.replace(r, row=base + i) for i, r in enumerate(unit)])
        return PromptSet(keep, self.eval_records, self.unit_size, skipped)

    def rows(self) -> list[dict[str, Any]]:
        """The columns of the HF dataset the trainers read."""
        return [{"prompt": r.prompt, "completion": r.target, "row_id": r.row, "pair_id": r.pair_id,
                 "side": r.side} for r in self.records]


def default_path(source: str, root: Path | None = None) -> Path | None:
    """The file a source reads when `data.path` is not given (None: the source needs no file)."""
    from cipr.data.paths import data_root

    root = data_root(root)
    if source == "toolrl":
        return root / "toolrl" / "rlla_4k" / "train.parquet"
    if source == "toolrl_sft":
        return root / "toolrl" / "rlla_4k_raw" / "rlla_sft.json"
    return None


def synthetic_config(cfg: DataConfig) -> SyntheticConfig:
    """The generator's config for `data.source=synthetic` (ValueError naming a bad range)."""
    return SyntheticConfig(n=cfg.n, seed=cfg.seed, tools_per_example=tuple(cfg.tools_per_example),  # type: ignore[arg-type]
                           parallel_fraction=cfg.parallel_fraction, no_call_fraction=cfg.no_call_fraction,
                           same_domain_distractors=cfg.same_domain_distractors, tools=tuple(cfg.tools),
                           exclude=tuple(cfg.exclude))


def check_source(cfg: DataConfig) -> Path | None:
    """The input file, checked before any work (ConfigError saying what to pass when it is missing)."""
    if cfg.n < 0 or cfg.eval_examples < 0:
        raise ConfigError("data.n and data.eval_examples must be >= 0")
    check_messages_options(cfg.source, on_bad_row=cfg.on_bad_row, format=cfg.format)
    if cfg.source == "synthetic":
        if cfg.path is not None:
            raise ConfigError("data.path is not used by data.source=synthetic "
                              "(it generates its examples); remove it")
        try:
            synthetic_config(cfg)
        except ValueError as e:
            raise ConfigError(f"data.{e}") from None
        if cfg.n <= cfg.eval_examples:
            raise ConfigError(f"data.n={cfg.n} must exceed data.eval_examples={cfg.eval_examples}")
        return None
    if cfg.source == "messages":
        from cipr.data.messages import checked_path

        return checked_path(cfg.path, "data.source=messages", "data.path")
    path = Path(cfg.path).expanduser() if cfg.path else default_path(cfg.source)
    if path is None or not path.is_file():
        hint = ""
        if cfg.source == "toolrl":
            hint = (" ToolRL's 3,920-row train.parquet is not in the shared data: pass data.path=<your copy>,"
                    " or data.path=<data root>/toolrl/rlla_4k/test.parquet for a smoke run.")
        raise ConfigError(f"data.source={cfg.source} needs the file {path}, which does not exist.{hint} "
                          f"Set data.path (or CIPR_DATA_ROOT).")
    return path


def load_source(cfg: DataConfig) -> tuple[list[Example], Counter]:
    """The source's examples in file (or generation) order, capped at `n` (0: all) for file sources, and
    the rows the loader skipped by reason (`bad row: <reason>`; only `data.on_bad_row=skip` skips)."""
    path = check_source(cfg)
    if cfg.source == "synthetic":
        return synthetic_config(cfg).generate(), Counter()
    assert path is not None
    skipped: Counter = Counter()
    if cfg.source == "messages":
        from cipr.data.row_formats import load_rows

        data = load_rows(path, cfg.format, on_bad_row=cfg.on_bad_row)
        examples = data.examples
        skipped.update({f"bad row: {k}": n for k, n in data.skipped.items()})
    else:
        from cipr.data.toolrl import load_toolrl_parquet, load_toolrl_sft

        examples = load_toolrl_parquet(path) if cfg.source == "toolrl" else load_toolrl_sft(path)
    return (examples[:cfg.n] if cfg.n else examples), skipped


def load_examples(cfg: DataConfig) -> list[Example]:
    """The source's examples (`load_source`, without the skip counts, which its loader logs)."""
    return load_source(cfg)[0]


def _random_name(rng: random.Random, length: int, taken: set[str]) -> str:
    alphabet = string.ascii_lowercase + string.digits
    while True:
        name = rng.choice(string.ascii_lowercase) + "".join(rng.choice(alphabet) for _ in range(length - 1))
        if name not in taken:
            taken.add(name)
            return name


def mask_example(example: Example, *, seed: int, length: int = 8,
                 rewrite: Literal["identifiers", "all", "none"] = "identifiers") -> tuple[Example, NameMap]:
    """Function masking: random-string tool and argument names, applied like canonicalization."""
    if length < 2:
        raise ConfigError("perturb.mask_length must be >= 2")
    rng = random.Random(f"{seed}\x1f{example.id}\x1fmask")
    taken: set[str] = set()
    tools: list[Tool] = []
    pairs: list[tuple[str, str]] = []
    args: dict[str, dict[str, str]] = {}
    for tool in example.interface:
        new = _random_name(rng, length, taken)
        amap = {orig: _random_name(rng, length, taken) for orig in tool.properties}
        params = dict(tool.parameters)
        params["properties"] = {amap[k]: v for k, v in tool.properties.items()}
        if "required" in params:
            params["required"] = [amap.get(r, r) for r in params["required"]]
        tools.append(Tool(new, tool.description, params))
        pairs.append((new, tool.name))
        args[new] = {c: o for o, c in amap.items()}
    nmap = NameMap(tuple(pairs), args)
    return apply_name_map(example, Interface(tuple(tools)), nmap, rewrite), nmap


def _record(row: int, pair_id: int, side: Side, example: Example, fmt: CallFormat, tokenizer: Any,
            classes: Sequence[int], twins: Sequence[bool], num_actions: int, think: str | None,
            twin_of: Sequence[str | None] = ()) -> PromptRecord:
    prompt = fmt.render_prompt(tokenizer, example.messages, example.interface)
    target = fmt.render_target(example.reference, response=example.response, think=think)
    return PromptRecord(row, pair_id, side, example, prompt, target, tuple(classes), tuple(twins),
                        num_actions, tuple(twin_of) or (None,) * len(classes))


def build_prompts(examples: Sequence[Example], cfg: DataConfig, perturb: PerturbConfig, *, fmt: CallFormat,
                  tokenizer: Any, skipped: Mapping[str, int] | None = None) -> PromptSet:
    """Render every usable example under `perturb.names` (paired with its perturbed copy when
    `perturb.paired`; `perturb` resolved, `cipr.perturb.config.resolved`); `skipped`: what the loader skipped
    (`load_source`), carried into `PromptSet.skipped`."""
    names, perturbed, rewrite = perturb.names, bool(perturb.paired), perturb.rewrite_text or "identifiers"
    if perturbed and names != "canonical":
        raise ConfigError("perturbed copies are built from canonical names: set perturb.names=canonical")
    skipped = Counter(skipped or {})
    order = list(range(len(examples)))
    random.Random(f"{cfg.seed}\x1fheld-out").shuffle(order)
    held_out = set(order[:cfg.eval_examples])
    train: list[PromptRecord] = []
    evals: list[PromptRecord] = []
    for index, source in enumerate(examples):
        if len(source.interface) == 0:
            skipped["no declared tools"] += 1
            continue
        if names == "canonical":
            example, _ = canonicalize(source, rewrite)
        elif names == "masked":
            example, _ = mask_example(source, seed=cfg.seed, length=perturb.mask_length, rewrite=rewrite)
        else:
            example = source
        think = source.meta.get("think") if cfg.sft_think == "example" and names == "original" else None
        n = len(example.interface)
        side: Side = "canonical" if perturbed else "single"
        if index in held_out:
            evals.append(_record(len(evals), index, side, example, fmt, tokenizer, range(n), [False] * n, n,
                                 think))
            continue
        if not perturbed:
            train.append(_record(len(train), index, side, example, fmt, tokenizer, range(n), [False] * n, n,
                                 think))
            continue
        from cipr.perturb.registry import training_copy

        try:
            seed = cfg.seed if perturb.seed is None else perturb.seed
            copy, corr = training_copy(example, perturb.preset, seed=seed,
                                       twin_wordings=perturb.twin_wordings)
        except (ValueError, DataError) as e:
            skipped[f"perturbation failed: {type(e).__name__}"] += 1
            continue
        position = {name: i for i, name in enumerate(example.interface.names)}
        classes: list[int] = []
        twins: list[bool] = []
        added = 0
        for i in range(len(corr)):
            source_name = corr.equivalent(i)
            if source_name is None:
                classes.append(n + added)
                added += 1
                twins.append(True)
            else:
                classes.append(position[source_name])
                twins.append(False)
        total = n + added
        written = {src[0]: corr.names[i] for i, src in enumerate(corr.sources) if src}
        twin_of = [written.get(corr.twin_of[i]) if twins[i] else None for i in range(len(corr))]
        train.append(_record(len(train), index, "canonical", example, fmt, tokenizer, range(n), [False] * n,
                             total, think))
        train.append(_record(len(train), index, "perturbed", copy, fmt, tokenizer, classes, twins, total,
                             None, twin_of))
    if not train:
        raise DataError(f"no training examples left out of {len(examples)} (held out {len(evals)}; skipped "
                        f"{dict(skipped)}): raise data.n or lower data.eval_examples", file=cfg.source)
    return PromptSet(train, evals, 2 if perturbed else 1, skipped)
