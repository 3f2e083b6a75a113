"""The evaluation run's configuration (`cipr-eval`, configs/eval/eval.yaml and configs/eval/benchmark/*.yaml).

`EvalConfig` composes the options of the modules it drives: the benchmark (`BenchmarkConfig`), the
backends (`GreedyConfig` fields flat: `batch_size`, `max_new_tokens`), the OpenAI and vLLM backends,
and the report. `eval_config_from_dict` uses the strict loader (`cipr.core.config.from_dict`): a
misspelled key, a wrong type or a value outside a `Literal` fails before anything loads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from cipr.core.config import EVAL_CONFIG_DIR, from_dict
from cipr.core.errors import ConfigError
from cipr.data.synthetic import SyntheticConfig
from cipr.eval.consistency_metric import ConsistencyConfig
from cipr.guard.evaluate import GuardEvalConfig
from cipr.runtime.backends import OpenAIBackendConfig, VLLMBackendConfig

CONFIG_DIR = str(EVAL_CONFIG_DIR)
"""cipr-eval's Hydra config folder: eval.yaml and the benchmark/ group."""

Benchmark = Literal["bfcl", "rotbench", "toolrl_test", "synthetic", "messages", "bfcl_multi_turn", "toyshop",
                    "bfcl_irrelevance"]
MULTI_TURN: tuple[str, ...] = ("bfcl_multi_turn", "toyshop")
"""The benchmarks run as episodes in an environment (`cipr.eval.episodes`)."""
Backend = Literal["auto", "hf", "vllm", "openai", "replay"]
Names = Literal["original", "canonical"]
BENCHMARKS: tuple[str, ...] = get_args(Benchmark)
BACKENDS: tuple[str, ...] = get_args(Backend)


@dataclass
class BenchmarkReportConfig:
    """How the benchmark's records aggregate (see `cipr.eval.report.ReportConfig`)."""

    original: str = "original"
    group_mode: Literal["item_mean", "pool"] = "item_mean"
    mean_groups: list[str] | None = None


@dataclass
class BenchmarkConfig:
    """A benchmark: where its items come from, its call format and scorer, and its defaults.

    - `perturbations`: the default list of types and groups (`default` in `EvalConfig.perturbations`
      expands to it). Tokens: a type name, a group name, `held_out` (every held-out type), `original`.
    - `names`: the default tool names evaluated (`original`, `canonical`, or both).
    - `split` (RoTBench), `path` (ToolRL: a verl parquet or SFT JSON; default the test parquet under
      the data root; messages: the file or folder of `messages` + `tools` rows, required), `n`
      (synthetic: how many examples).
    - `data_format` (messages): the rows' format, `auto` (read from the first row) or `messages`, `xlam`,
      `hermes_fc`, `glaive` (`cipr.data.row_formats`).
    - `tools_per_example`, `parallel_fraction`, `no_call_fraction`, `same_domain_distractors`, `tools`
      (synthetic): the generator's options (`cipr.data.synthetic.SyntheticConfig`). Give the training
      run's `data.*` values: the test split drops items equal to a training item generated with these
      same options, so only then is "never trained on" checked.
    - `strict_parse`: a malformed response (per the call format) is wrong even if calls were read; off
      for RoTBench, whose own extraction decides, and for `bfcl_irrelevance`, where BFCL counts a reply it
      cannot decode as no call (correct).
    - `task_split` (multi-turn): the environment's tasks evaluated, `all`, `train` or `heldout` (its seeded
      split: evaluate a model trained in that environment on `heldout`).
    - `env` (multi-turn): the environment's options (`cipr.envs.toyshop.ToyShopConfig`,
      `cipr.envs.bfcl_multi_turn.BFCLMultiTurnConfig`); BFCL's categories come from `partitions`.
    """

    name: Benchmark = "bfcl"
    format: str = "toolrl"
    scorer: Literal["bfcl", "rotbench", "environment"] = "bfcl"
    perturbations: list[str] = field(default_factory=lambda: ["original", "held_out"])
    names: list[Names] = field(default_factory=lambda: ["original"])
    split: Literal["First_Turn", "Third_Turn"] = "First_Turn"
    path: str | None = None
    data_format: Literal["auto", "messages", "xlam", "hermes_fc", "glaive"] = "auto"
    n: int = 200
    tools_per_example: tuple[int, int] = SyntheticConfig.tools_per_example
    parallel_fraction: float = SyntheticConfig.parallel_fraction
    no_call_fraction: float = SyntheticConfig.no_call_fraction
    same_domain_distractors: float = SyntheticConfig.same_domain_distractors
    tools: tuple[str, ...] = SyntheticConfig.tools
    strict_parse: bool = True
    task_split: Literal["all", "train", "heldout"] = "all"
    env: dict[str, Any] = field(default_factory=dict)
    report: BenchmarkReportConfig = field(default_factory=BenchmarkReportConfig)


@dataclass
class EvalConfig:
    """One `cipr-eval` run (every field can be overridden on the command line, e.g. `limit=50`).

    - `model`: `embedded` (SmolLM2-135M-Instruct GGUF), a checkpoint folder (a LoRA adapter folder
      loads onto its base), a hub id (from the local cache when offline), or an `http(s)://.../v1`
      endpoint (OpenAI-compatible; `backend=auto` then picks `openai`).
    - `backend`: `auto` (openai for a URL, else hf), `hf`, `vllm`, `openai`, `replay`.
    - `perturbations`: None or `[default]` for the benchmark's default; else names and groups.
    - `names`: None for the benchmark's default; `[original]`, `[canonical]` or both.
    - `limit`: at most this many items, taken round-robin over partitions (BFCL) or per level
      (RoTBench), so a small run still covers every partition; on the episodic benchmarks (toyshop,
      bfcl_multi_turn) this many tasks, each played under every perturbation and naming (the count is
      logged before the run). None: all.
    - `partitions`: BFCL partitions to load (None: all ten); for `bfcl_multi_turn` its categories
      (`multi_turn_base` or `base`, ...; None: all four).
    - `drop_finished`: HF backend, remove ended sequences from the batch (see
      `cipr.runtime.generation.GreedyConfig`); False decodes with `model.generate`.
    - `prefill`: HF backend with `drop_finished`: `auto` (per item on CPU, batched on GPU), `per_item`,
      `batched` (see `GreedyConfig.prefill`).
    - `prefix_reuse`: HF per-item prefill, a prompt starting like the one before it in the same chunk
      computes only the rest (see `GreedyConfig.prefix_reuse`); false: every prompt in full.
    - `replay`: `reference` or `familiar` (see `cipr.eval.replay.ReplayBackend`).
    - `format`: call format name (None: the benchmark's).
    - `device` / `dtype`: `auto` = CUDA with bfloat16 when available, else CPU float32.
    - `threads`: torch CPU threads (None: torch's default); keep them within the free cores.
    - `attn_implementation`: passed to `from_pretrained` (`sdpa`, `eager`, `flash_attention_2`); None or
      `auto` keeps the model's default (SDPA for most families).
    - `plugins`: modules of your own imported first (from PYTHONPATH), e.g. one that registers a
      perturbation type (`cipr.perturb.register_perturbation`; docs/extending.md).
    - `generate`: false reads only the held-out consistency metric (`consistency.enabled=true`): no
      results.jsonl; summary.json / report.md hold the consistency section alone.
    """

    model: str = "embedded"
    benchmark: BenchmarkConfig = field(default_factory=BenchmarkConfig)
    backend: Backend = "auto"
    perturbations: list[str] | None = None
    names: list[Names] | None = None
    limit: int | None = None
    partitions: list[str] | None = None
    seed: int = 0
    batch_size: int = 8
    max_new_tokens: int = 512
    drop_finished: bool = True
    prefill: Literal["auto", "batched", "per_item"] = "auto"
    prefix_reuse: bool = True
    chunk_size: int = 64
    format: str | None = None
    out_dir: str = "evals/run"
    data_root: str | None = None
    device: str = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    threads: int | None = None
    attn_implementation: str | None = "auto"
    replay: Literal["reference", "familiar"] = "reference"
    guard: GuardEvalConfig = field(default_factory=GuardEvalConfig)  # the guard's drift evaluation
    progress: bool = True
    plugins: list[str] = field(default_factory=list)
    generate: bool = True
    openai: OpenAIBackendConfig = field(default_factory=OpenAIBackendConfig)
    vllm: VLLMBackendConfig = field(default_factory=VLLMBackendConfig)
    consistency: ConsistencyConfig = field(default_factory=ConsistencyConfig)  # held-out action consistency

    def __post_init__(self) -> None:
        """Checks a `Literal` cannot state (from_dict checks the choices; this catches direct use); imports
        the plugins, so that what they register is known to every check after it."""
        from cipr.core.plugins import import_plugins

        import_plugins(self.plugins)
        if self.benchmark.name not in BENCHMARKS:
            raise ConfigError(f"benchmark={self.benchmark.name!r}; choose one of {', '.join(BENCHMARKS)}")
        if self.backend not in BACKENDS:
            raise ConfigError(f"backend={self.backend!r}; choose one of {', '.join(BACKENDS)}")
        for n in self.names or []:
            if n not in get_args(Names):
                raise ConfigError(f"names={n!r}; use original, canonical or [original,canonical]")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"limit={self.limit} must be a positive number of items (or null for all)")
        for key in ("batch_size", "max_new_tokens", "chunk_size", "threads"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"{key}={value} must be >= 1")
        if self.benchmark.n < 1:
            raise ConfigError(f"benchmark.n={self.benchmark.n} must be >= 1")
        if not self.out_dir:
            raise ConfigError("out_dir is empty: give the folder to write the results into")
        if not self.generate and not self.consistency.enabled:
            raise ConfigError("generate=false evaluates nothing without the consistency metric: add "
                              "consistency.enabled=true (or drop generate=false)")

    @property
    def call_format(self) -> str:
        return self.format or self.benchmark.format

    @property
    def names_list(self) -> list[str]:
        return list(self.names or self.benchmark.names)

    @property
    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "openai" if self.model.startswith(("http://", "https://")) else "hf"

    def meta(self) -> dict[str, Any]:
        """What run.json records about this configuration (and what a resumed run must match)."""
        return {"model": self.model, "benchmark": self.benchmark.name, "format": self.call_format,
                "backend": self.resolved_backend, "seed": self.seed, "max_new_tokens": self.max_new_tokens,
                "split": self.benchmark.split if self.benchmark.name == "rotbench" else None,
                "replay": self.replay if self.resolved_backend == "replay" else None,
                "generate": self.generate,
                **({"task_split": self.benchmark.task_split, "env": dict(self.benchmark.env)}
                   if self.benchmark.name in MULTI_TURN else {})}


def eval_config_from_dict(data: Mapping[str, Any]) -> EvalConfig:
    """An EvalConfig from a composed (Hydra) config as plain dicts; bad keys and values raise ConfigError."""
    return from_dict(EvalConfig, {k: v for k, v in data.items() if k != "hydra"})


def to_eval_config(cfg: Any) -> EvalConfig:
    """A composed Hydra config (less its `hydra` node) as a validated EvalConfig (else ConfigError)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        data = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        reason = str(e).split("\n")[0]
        raise ConfigError(f"{key}: {reason}" if key else reason) from None
    return eval_config_from_dict(data)  # type: ignore[arg-type]


def compose_eval_config(overrides: Sequence[str]) -> EvalConfig:
    """cipr-eval's configuration for these command-line overrides (eval.yaml composed as cipr-eval does)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        return to_eval_config(compose(config_name="eval", overrides=list(overrides)))
