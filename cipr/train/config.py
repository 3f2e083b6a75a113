"""The run config of `cipr-train`: one section per option group, the algorithm's own sections chosen by it.

`TrainConfig` composes the sections, each owned by the module that uses it. `algo` and `data` are
per algorithm, picked by `algo.name`, and `rollout` belongs to the algorithms that sample:

| algo.name                                 | algo            | data                    | rollout |
|-------------------------------------------|-----------------|-------------------------|---------|
| sft, grpo, multi_interface, masking, cipr | `AlgoConfig`    | `DataConfig`: prompts   | used    |
| distill                                   | `DistillConfig` | `TrajectoryDataConfig`  | unused  |

`perturb` is the interfaces every regime trains on (names, pairing, the training perturbation and the
relabeling: `cipr.perturb.config`), its nulls filled with the algorithm's own.

`plugins` are modules of your own imported before anything is checked (from PYTHONPATH), e.g. one that
registers a training perturbation (`cipr.perturb.register_perturbation`, named by `perturb.preset`).

`env` is the environment of multi-turn GRPO (`rollout.mode=multi_turn`): `{"name": ..., **options}`, the
options being that environment's config (`cipr.envs.registry.env_config`, checked strictly); `name: none`
(the default) plays no episodes.

The other sections serve every algorithm. `trainer` is the recipe a comparison holds equal across
algorithms (the presets trainer=cpu|gpu|smoke); each algorithm uses the part it needs (sft and distill
have no GRPO objective and no warm start), so none of it is refused.

An option the chosen algorithm ignores (the other family's `algo` or `data` options; with
algo=distill every `rollout` option) is refused with a ConfigError naming it and why when it is *set*,
and dropped when it is not. *Set* means it differs from its value when nobody sets it: for `rollout`,
train.yaml's default group (`rollout=hf` over `RolloutConfig`'s defaults); for `algo` and `data`, the
declaring dataclass's default (`data=messages` holds `DataConfig`'s defaults). Nested options are
compared key by key; a key the input leaves out is never set.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cipr.core.config import TRAIN_CONFIG_DIR, ConfigError, compose_checked, from_dict, override_text, to_dict
from cipr.core.plugins import import_plugins
from cipr.distill.data import TrajectoryDataConfig, trajectory_section
from cipr.method.relabel import Relabeling
from cipr.perturb.config import MOVED, PerturbConfig, resolved
from cipr.runtime.model import ModelConfig
from cipr.train.algo import AlgoConfig, DistillConfig
from cipr.train.data import DataConfig
from cipr.train.metrics import LoggingConfig
from cipr.train.rollout import RolloutConfig
from cipr.train.schedule import LauncherConfig, TrainerConfig
from cipr.train.strategy import DistributedConfig

PROMPT_ALGOS = "the prompt-based algorithms (sft, grpo, multi_interface, masking, cipr)"
SECTIONS = {False: (AlgoConfig, DataConfig), True: (DistillConfig, TrajectoryDataConfig)}  # by algo=distill


@dataclass
class TrainConfig:
    """The whole run: one section per option group; `algo` and `data` per algorithm (module docstring)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig | TrajectoryDataConfig = field(default_factory=DataConfig)
    algo: AlgoConfig | DistillConfig = field(default_factory=AlgoConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    env: dict[str, Any] = field(default_factory=lambda: {"name": "none"})
    perturb: PerturbConfig = field(default_factory=PerturbConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    plugins: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.perturb = resolved(self.perturb, self.algo.name)  # the algorithm's names and pairing where null

    @property
    def relabeling(self) -> Relabeling:
        """The rescoring term's relabeling, its seed resolved once (`perturb.relabel.seed`, else
        `trainer.seed`): what every engine draws fresh names with."""
        return Relabeling.of(self.perturb.relabel, self.trainer.seed)


def config_from_dict(data: Mapping[str, Any]) -> TrainConfig:
    """A TrainConfig from a composed (Hydra) config; unknown keys, bad values and set options that the
    algorithm ignores (module docstring) raise ConfigError. `plugins` are imported first, so that what they
    register (a training perturbation named by `perturb.preset`) is known to every check."""
    data = {k: v for k, v in data.items() if k != "hydra"}
    import_plugins(data.get("plugins") or [])
    refuse_moved(data)
    algo, section = dict(data.pop("algo", None) or {}), dict(data.pop("data", None) or {})
    name = algo.get("name", AlgoConfig.name)
    distill = name == "distill"
    if distill:
        section = trajectory_section(section)
        _refuse("rollout", data.get("rollout") or {}, _default_rollout(),
                "algo=distill samples no rollouts (its student learns from the teacher on trajectories)")
        env = dict(data.get("env") or {})
        if env.get("name", "none") != "none" or set(env) - {"name"}:
            raise ConfigError(f"env={env.get('name')}: algo=distill plays no episodes (its live evaluation "
                              f"has its own settings, algo.eval); remove the env options")
    elif section.get("source") == "trajectories":
        raise ConfigError(f"data=trajectories is the data of algo=distill, not of algo={name}: choose "
                          f"algo=distill, or another data= (synthetic, toolrl, toolrl_sft, messages)")
    why = f"algo={name} does not use it (an option of {PROMPT_ALGOS if distill else 'algo=distill'})"
    (algo_cls, data_cls), (other_algo, other_data) = SECTIONS[distill], SECTIONS[not distill]
    algo = _without_foreign("algo", algo, algo_cls, other_algo, why)
    section = _without_foreign("data", section, data_cls, other_data, why)
    perturb = from_dict(PerturbConfig, data.pop("perturb", None), "perturb")  # resolved for the chosen algo
    return dataclasses.replace(from_dict(TrainConfig, data), algo=from_dict(algo_cls, algo, "algo"),
                               data=from_dict(data_cls, section, "data"), perturb=perturb)


TERM_OPTION = re.compile(r"^algo\.terms\.[A-Za-z_]\w*(\.|=)")


def term_overrides(overrides: Sequence[str], probe: Sequence[str] | None = None) -> list[str]:
    """`overrides` with each `algo.terms.NAME...=VALUE` whose key the composed config lacks written as
    `++...` (add): a term named on the command line need not exist in the algorithm's YAML
    (`algo.terms.js.fn=my_terms:js`, docs/extending.md). A key the config has stays as given, so a sweep
    over it (`algo.terms.rescore.weight=0,0.1`) replaces the sweep file's values instead of multiplying them;
    every other key stays checked by Hydra and the strict loader. `probe`: the overrides to compose with
    (default `overrides`; cipr-train passes each sweep's first value and its flags resolved)."""
    from omegaconf import OmegaConf

    if not any(TERM_OPTION.match(o) for o in overrides):
        return list(overrides)
    others = [o for o in (overrides if probe is None else probe) if not TERM_OPTION.match(o)]
    composed = compose_checked(TRAIN_CONFIG_DIR, "train", others, moved=MOVED, program="cipr-train")
    missing = object()

    def absent(option: str) -> bool:
        return OmegaConf.select(composed, option.split("=", 1)[0], default=missing) is missing

    return [f"++{o}" if TERM_OPTION.match(o) and absent(o) else o for o in overrides]


RENAMED = {"algo.rescore_weight": "algo.terms.rescore.weight",
           "algo.rollout_weight": "algo.terms.rollout.weight"}
"""The consistency weights' former keys -> each term's one key (`algo.terms.NAME.weight`)."""


def refuse_renamed(overrides: Sequence[str], sweep: Mapping[str, Any] | None = None) -> None:
    """ConfigError naming the term's key for a former weight key (`RENAMED`) among command-line `overrides`
    (with `+`, `++` or `~`, or as a sweep) or a sweep file's points (`sweep`: its `hydra.sweeper.params`)."""
    for key, value in [o.lstrip("+~").partition("=")[::2] for o in overrides] + list((sweep or {}).items()):
        if key in RENAMED:
            raise ConfigError(_renamed(key, value))


def sweep_params(overrides: Sequence[str]) -> dict[str, Any]:
    """The `hydra.sweeper.params` of the train config composed with `overrides` (a `+sweep=` file's points);
    {} when it does not compose (the check that follows reports why, in one line)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    try:
        with initialize_config_dir(config_dir=str(TRAIN_CONFIG_DIR), version_base="1.3"):
            composed = compose("train", overrides=[o for o in overrides if not TERM_OPTION.match(o)],
                               return_hydra_config=True)
    except HydraException:
        return {}
    return dict(OmegaConf.to_container(composed.hydra.sweeper.get("params") or {}))  # type: ignore[arg-type]


def _renamed(old: str, value: Any) -> str:
    new = RENAMED[old]
    if value is None or value == "":
        return f"{old} is now {new}: remove {old} (its null left the weight as {new} says)"
    return f"{old} is now {new}: set {new}={value if isinstance(value, str) else override_text(value)}"


def compose_train(overrides: Sequence[str]) -> TrainConfig:
    """A `TrainConfig` from cipr-train overrides, as `cipr-train` composes it (configs/train/train.yaml,
    a term of the user's own added as on its command line: `term_overrides`); a composition error or a
    former weight key (`refuse_renamed`) is one ConfigError line (`cipr.core.config.compose_checked`)."""
    from omegaconf import OmegaConf

    refuse_renamed(overrides)
    composed = compose_checked(TRAIN_CONFIG_DIR, "train", term_overrides(overrides), moved=MOVED,
                               program="cipr-train")
    return config_from_dict(OmegaConf.to_container(composed, resolve=True))  # type: ignore[arg-type]


def refuse_moved(data: Mapping[str, Any]) -> None:
    """ConfigError naming the new key for a key that moved into the `perturb` group (`MOVED`), or for a
    former weight key (`RENAMED`) that a YAML file or `+key=value` gave, null included."""
    for old, new in MOVED.items():
        section, key = old.split(".")
        given = data.get(section) or {}
        if key in given and given[key] is not None:
            raise ConfigError(f"{old} is now {new} (the perturbation settings' one group): set "
                              f"{new}={given[key]}")
    algo = data.get("algo") or {}
    for old in RENAMED:
        if old.split(".")[1] in algo:
            raise ConfigError(_renamed(old, algo[old.split(".")[1]]))


def call_format_name(cfg: TrainConfig) -> str:
    """The call format the run renders with: the trajectories' own (`data.call_format`), else the model's."""
    return getattr(cfg.data, "call_format", None) or cfg.model.call_format


def _without_foreign(where: str, given: dict[str, Any], own: type, other: type, why: str) -> dict[str, Any]:
    """`given` less the options only `other` declares: each dropped at `other`'s default, refused when set."""
    mine = {f.name for f in dataclasses.fields(own)}
    foreign = {k: v for k, v in to_dict(other()).items() if k not in mine}
    _refuse(where, {k: v for k, v in given.items() if k in foreign}, foreign, why)
    return {k: v for k, v in given.items() if k not in foreign}


def _refuse(where: str, given: Mapping[str, Any], defaults: Mapping[str, Any], why: str) -> None:
    for key, value in given.items():
        if key in defaults and _changed(value, defaults[key]):
            raise ConfigError(f"{where}.{key}={value}: {why}; remove it")


def _changed(value: Any, default: Any) -> bool:
    if isinstance(value, Mapping) and isinstance(default, Mapping):
        return any(k not in default or _changed(v, default[k]) for k, v in value.items())
    return to_dict(value) != default


def _default_rollout() -> dict[str, Any]:
    """The rollout options composed when nobody sets them: train.yaml's group over the defaults."""
    import yaml

    defaults = yaml.safe_load((TRAIN_CONFIG_DIR / "train.yaml").read_text())["defaults"]
    group = next(d["rollout"] for d in defaults if isinstance(d, dict) and "rollout" in d)
    chosen = yaml.safe_load((TRAIN_CONFIG_DIR / "rollout" / f"{group}.yaml").read_text())
    return {**to_dict(RolloutConfig()), **chosen}
