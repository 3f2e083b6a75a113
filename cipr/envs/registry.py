"""Environments by name: `make_env("toyshop", seed=1)`, `make_env("bfcl_multi_turn", categories=["base"])`.

Each environment's options are a config dataclass owned by its module (`ToyShopConfig`,
`BFCLMultiTurnConfig`); `env_config(name, options)` checks them strictly (a misspelled key or a bad value is
a ConfigError naming it), `make_env` builds the environment. A training or evaluation config composes the
`env` section as `{"name": ..., **options}`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cipr.core.errors import ConfigError
from cipr.envs.base import Environment


def _toyshop() -> type:
    from cipr.envs.toyshop import ToyShopConfig

    return ToyShopConfig


def _bfcl() -> type:
    from cipr.envs.bfcl_multi_turn import BFCLMultiTurnConfig

    return BFCLMultiTurnConfig


ENVIRONMENTS: dict[str, Callable[[], type]] = {"toyshop": _toyshop, "bfcl_multi_turn": _bfcl}
"""name -> its config class (imported when asked for); the class's `build()` makes the environment."""


def config_class(name: str) -> type:
    """The config dataclass of environment `name` (ConfigError listing the names for an unknown one)."""
    if name not in ENVIRONMENTS:
        raise ConfigError(f"env={name!r} is not an environment; choose one of {', '.join(ENVIRONMENTS)}")
    return ENVIRONMENTS[name]()


def env_config(name: str, options: Mapping[str, Any] | None = None) -> Any:
    """The checked config of environment `name` from plain options (`name` itself may be among them)."""
    from cipr.core.config import from_dict

    opts = {k: v for k, v in (options or {}).items() if k != "name"}
    try:
        return from_dict(config_class(name), opts, "env")
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(f"env={name}: {e}") from None


def make_env(name: str, **options: Any) -> Environment:
    """A fresh environment `name` with `options` (its config's fields)."""
    return env_config(name, options).build()
