"""The one config loader: a composed (Hydra) config, as plain nested dicts, into dataclasses.

Every option group is a dataclass owned by the module that uses it (`ModelConfig` in
`cipr/runtime/model.py`, `BenchmarkConfig` in `cipr/eval/config.py`, ...); a command's top-level config
(`TrainConfig`, `DistillRunConfig`, `EvalConfig`) only composes them. `from_dict` builds any of
these dataclasses and rejects, before any work starts, a key the dataclass does not declare (with
the closest valid key as a suggestion), a value of the wrong type, and a value outside a `Literal`.
Each error names the dotted key and says what to change. Checks that relate several fields stay in
the dataclass's `__post_init__` or the runner's `validate`, and raise the same `ConfigError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import re
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from cipr.core.errors import ConfigError

__all__ = ["CONFIG_ROOT", "EVAL_CONFIG_DIR", "TRAIN_CONFIG_DIR", "ConfigError", "from_dict", "from_overrides",
           "override_text", "to_dict"]

def _config_root() -> Path:
    try:
        return Path(str(importlib.resources.files("cipr.configs")))
    except ModuleNotFoundError:  # the checkout on PYTHONPATH, not installed (a GPU node's copy of the tree)
        return Path(__file__).resolve().parents[2] / "configs"


CONFIG_ROOT = _config_root()
"""The config tree (the repository's configs/, shipped in the wheel as `cipr.configs`; read from the checkout
when the package is only on PYTHONPATH): one folder per Hydra command (train/, eval/) and accelerate/."""
TRAIN_CONFIG_DIR = CONFIG_ROOT / "train"
EVAL_CONFIG_DIR = CONFIG_ROOT / "eval"

T = TypeVar("T")


def _suggest(key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def from_dict(cls: type[T], data: Mapping[str, Any] | None, where: str = "") -> T:
    """Build dataclass `cls` from `data`, recursively; unknown keys and wrong types raise ConfigError."""
    data = dict(data or {})
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        dotted = f"{where}.{key}" if where else key
        raise ConfigError(
            f"unknown config key '{dotted}'.{_suggest(key, list(fields))} Valid keys under "
            f"'{where or '<top>'}': {', '.join(sorted(fields))}. "
            "Fix the override or the YAML file that sets it.")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        kwargs[name] = _coerce(hints[name], value, f"{where}.{name}" if where else name)
    missing = [n for n, f in fields.items()
               if n not in data and f.default is f.default_factory is dataclasses.MISSING]
    if missing:  # a required field without a default that the config did not give
        raise ConfigError(f"'{where + '.' if where else ''}{missing[0]}' is required: give {missing[0]}=...")
    return cls(**kwargs)


def from_overrides(cls: type[T], argv: Sequence[str]) -> T:
    """`key=value` command-line arguments into dataclass `cls` (every command but the Hydra ones), spelled as
    Hydra spells them (`names=[a,b]`, `null`, quoted strings, dotted keys for nested options), then checked
    by `from_dict`. Under an option typed as a mapping the rest of a dotted key stays one key (`eval.vllm.x=1`
    gives `eval={"vllm.x": 1}`: options passed on to another command), and an option typed `str` keeps the
    text as typed (`item=3` is "3"). A malformed argument or a sweep raises ConfigError naming it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    data: dict[str, Any] = {}
    for arg in argv:
        try:
            (override,) = parser.parse_overrides([arg])
        except HydraException as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"cannot read the option {arg!r} ({first}); options are key=value, lists "
                              f"[a,b], null for none") from None
        if override.type != OverrideType.CHANGE or override.is_sweep_override() or override.package:
            raise ConfigError(f"option {arg!r}: only plain key=value is accepted here (no +, ~, @ or sweeps)")
        keys, node, typ = override.key_or_group.split("."), data, cls
        while len(keys) > 1 and not (typ in (dict, Mapping) or get_origin(typ) in (dict, Mapping)):
            typ, node = _field_type(typ, keys[0]), node.setdefault(keys[0], {})
            if not isinstance(node, dict):
                raise ConfigError(f"option {arg!r}: '{keys[0]}' is given both as a value and as a section")
            keys.pop(0)
        value = override.value()
        if _field_type(typ, keys[0]) is str and isinstance(value, (int, float)):
            value = arg.split("=", 1)[1].strip()
        node[".".join(keys)] = value
    return from_dict(cls, data)


def _field_type(cls: Any, name: str) -> Any:
    """The type of option `name` of dataclass `cls`, Optional removed; None when there is no such option."""
    if not dataclasses.is_dataclass(cls) or name not in {f.name for f in dataclasses.fields(cls)}:
        return None
    return _is_optional(typing.get_type_hints(cls)[name])[1]


def override_text(value: Any) -> str:
    """`value` spelled as a command-line option value (what `from_overrides` reads back as `value`)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = to_dict(value)
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(override_text, value)) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{override_text(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if not isinstance(value, str) or re.fullmatch(r"[\w./:@%+-]+", text) and (
            OverridesParser.create().parse_overrides([f"k={text}"])[0].value() == text):
        return text
    return "'" + text.replace("'", "\\'") + "'"  # special characters, or it would read as a number


def _is_optional(typ: Any) -> tuple[bool, Any]:
    origin = get_origin(typ)
    if origin in (Union, types.UnionType):
        args = [a for a in get_args(typ) if a is not type(None)]
        if len(args) < len(get_args(typ)):
            return True, (args[0] if len(args) == 1 else Union[tuple(args)])  # noqa: UP007
    return False, typ


def _coerce(typ: Any, value: Any, dotted: str) -> Any:
    optional, inner = _is_optional(typ)
    if value is None:
        if optional or typ is Any:
            return None
        raise ConfigError(f"'{dotted}' may not be null; give a value of type {_name(typ)}")
    typ = inner
    if typ is Any:
        return value
    if dataclasses.is_dataclass(typ):
        if not isinstance(value, Mapping):
            raise ConfigError(f"'{dotted}' must be a mapping of {typ.__name__} options, got {value!r}")
        return from_dict(typ, value, dotted)
    origin = get_origin(typ)
    if origin is Literal:
        allowed = get_args(typ)
        if value not in allowed:
            raise ConfigError(f"'{dotted}' must be one of {', '.join(map(repr, allowed))}; got {value!r}")
        return value
    if origin in (Union, types.UnionType):
        for option in get_args(typ):
            try:
                return _coerce(option, value, dotted)
            except ConfigError:
                continue
        raise ConfigError(f"'{dotted}' must be {_name(typ)}; got {value!r}")
    if origin in (tuple, list):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise ConfigError(f"'{dotted}' must be a list; got {value!r}")
        args = get_args(typ)
        item = args[0] if args else Any
        items = [_coerce(item, v, f"{dotted}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping) or typ in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise ConfigError(f"'{dotted}' must be a mapping; got {value!r}")
        args = get_args(typ)
        if len(args) == 2 and dataclasses.is_dataclass(args[1]):
            return {k: v if isinstance(v, args[1]) else _coerce(args[1], v, f"{dotted}.{k}")
                    for k, v in value.items()}
        return dict(value)
    if typ in _SCALARS:
        what, accepts = _SCALARS[typ]
        if not accepts(value):
            raise ConfigError(f"'{dotted}' must be {what}; got {value!r}")
        return float(value) if typ is float else value
    return value


_SCALARS: dict[type, tuple[str, Any]] = {  # type -> (what the message asks for, which values it accepts)
    bool: ("true or false", lambda v: isinstance(v, bool)),
    int: ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    float: ("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)),
    str: ("a string", lambda v: isinstance(v, str)),
}


def _name(typ: Any) -> str:
    return getattr(typ, "__name__", None) or str(typ).replace("typing.", "")


def to_dict(obj: Any) -> Any:
    """A dataclass tree as plain dicts/lists (for the resolved-config file)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def compose_checked(config_dir: str | Path, config_name: str, overrides: Sequence[str], *,
                    version_base: str | None = "1.3", moved: Mapping[str, str] | None = None,
                    program: str = "cipr") -> Any:
    """Hydra's composition of `config_name` in `config_dir` with `overrides`, every Hydra error made one
    ConfigError line that names the option and the closest valid names (`hydra_message`): a misspelled key, an
    unknown group option or experiment, unreadable override syntax. `moved`: old dotted key -> new one."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base=version_base):
            return compose(config_name, overrides=list(overrides))
    except HydraException as e:
        raise ConfigError(hydra_message(e, config_dir, config_name, overrides, version_base=version_base,
                                        moved=moved or {}, program=program)) from None


def _dotted_keys(node: Any, prefix: str = "") -> list[str]:
    if not isinstance(node, Mapping):
        return [prefix] if prefix else []
    out = [prefix] if prefix else []
    for k, v in node.items():
        out += _dotted_keys(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def hydra_message(e: Exception, config_dir: str | Path, config_name: str, overrides: Sequence[str], *,
                  version_base: str | None, moved: Mapping[str, str], program: str) -> str:
    """One line for a Hydra composition error (see `compose_checked`)."""
    text = str(e).strip()
    first = text.splitlines()[0] if text else type(e).__name__
    missing = re.search(r"Could not find '([^/']+)/([^']+)'", text)
    if missing:
        group, name = missing.groups()
        options = [o.strip() for o in re.findall(r"^\t(\S+)$", text, re.M)]
        if not options:
            folder = Path(config_dir) / group
            options = sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []
        close = difflib.get_close_matches(name, options, n=2, cutoff=0.5)
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        if group == "experiment" or len(options) > 12:
            where = (f"; the {group} options are the files of configs/{Path(config_dir).name}/{group}/ "
                     f"(`{program} --help` lists them)")
        else:
            where = f"; choose one of {', '.join(options)}" if options else ""
        return f"unknown {group} {name!r}{hint}{where}"
    override = re.search(r"Could not override '([^']+)'", text)
    if override:
        key = override.group(1)
        if key in moved:
            return f"{key} is now {moved[key]}: set {moved[key]}=..."
        groups = [o for o in overrides  # the group choices (algo=..., experiment=...): they decide the keys
                  if "=" in o and (Path(config_dir) / o.split("=", 1)[0].lstrip("+~")).is_dir()]
        valid: list[str] = []
        try:
            from hydra import compose, initialize_config_dir
            from omegaconf import OmegaConf

            with initialize_config_dir(config_dir=str(config_dir), version_base=version_base):
                base = compose(config_name, overrides=groups)
            valid = [k for k in _dotted_keys(OmegaConf.to_container(base, resolve=False))
                     if not k.startswith("hydra")]
        except Exception:  # noqa: BLE001 - the suggestion is a courtesy; the message stands without it
            pass
        close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        return f"unknown option {key}{hint} (`{program} --help` lists every option with its default)"
    if "override" in type(e).__name__.lower() or "parse" in first.lower() or "viable" in first.lower():
        return (f"cannot read the options ({first}); options are key=value, lists [a,b], null for none "
                f"(`{program} --help`)")
    return first
