"""The one command-line style: `cipr-NAME [VERB] key=value ...`, read into the command's config dataclass.

Values use Hydra's override grammar (lists `[a,b]`, `null`, quoted strings, dotted keys), read by the
strict loader (`cipr.core.config.from_overrides`). `--help` (also `VERB --help`) lists every option with
its default and description (its class-docstring bullet, else its trailing comment), then the module
docstring's examples. Bad input ends with one line on stderr and exit status 2; `--debug` (or
CIPR_DEBUG=1) shows the traceback. cipr-train and cipr-eval are Hydra applications (same grammar, plus
config groups and multiruns).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from cipr.core.config import from_overrides, override_text
from cipr.core.errors import EXIT_INPUT, ConfigError, cli_errors

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
HELP = ("-h", "--help", "help")
Verb = tuple[type, Callable[[Any], int | None]]
"""A command's (or a verb's) options dataclass and the function that runs them (exit status; None: 0)."""


def begin() -> None:
    """HF_HUB_OFFLINE=1 unless downloads were allowed (`cipr.runtime.hub`), INFO logging to stderr, and the
    libraries' start-up noise off (`quiet_libraries`)."""
    from cipr.runtime.hub import stay_offline

    stay_offline()
    quiet_libraries()
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)


def quiet_libraries() -> None:
    """Silence, at their source, the lines every run printed that tell the user nothing: DeepSpeed's 'Setting
    accelerator to CPU' warning (DS_ACCELERATOR=cpu where no CUDA device is seen, unless already set) and
    transformers' per-file and datasets' per-map progress bars ('Writing model shards', 'Loading weights',
    'Tokenizing train dataset') between the metric lines.
    Training and evaluation bars are the project's own and stay."""
    import os

    if "DS_ACCELERATOR" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            os.environ["DS_ACCELERATOR"] = "cpu"
    import datasets
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    datasets.disable_progress_bars()  # TRL's per-stage dataset preparation (tokenizing, labels, ...)


def run_command(prog: str, doc: str | None, verbs: Mapping[str, Verb],
                argv: Sequence[str] | None = None) -> int:
    """Run `prog [VERB] key=value ...`; `verbs` maps each verb to its `Verb` ("" for a command without verbs).
    Returns the exit status: the verb's, 0 after --help, 2 on bad input (one line on stderr)."""
    given = list(sys.argv[1:] if argv is None else argv)
    args, debug = [a for a in given if a != "--debug"], "--debug" in given or None
    name = "" if "" in verbs else args.pop(0) if args and "=" not in args[0] else None
    if name in HELP or any(a in HELP for a in args):
        print(usage(prog, doc, {name: verbs[name]} if name in verbs else verbs))
        return 0
    try:
        with cli_errors(prog, debug):
            if name not in verbs:
                what = f"unknown command {name!r}" if name else "no command given"
                raise ConfigError(f"{what}; choose one of {', '.join(verbs)} (`{prog} --help` lists them)")
            cls, run = verbs[name]
            config = from_overrides(cls, args)
            begin()
            return run(config) or 0
    except SystemExit as e:  # cli_errors' one line has been printed
        return e.code if isinstance(e.code, int) else EXIT_INPUT


HYDRA_INFO_FLAGS = ("-h", "--help", "--hydra-help", "--info", "-i", "--cfg", "-c", "--resolve", "--version",
                    "--shell-completion", "-sc")
HYDRA_OWN_CONFIG = ("--config-name", "-cn", "--config-path", "-cp", "--experimental-rerun")


def hydra_overrides(argv: Sequence[str]) -> tuple[list[str], bool]:
    """The overrides of a Hydra command line, and whether it should be checked at all: flags are dropped
    (`-m`, `--config-dir DIR` becomes a search path), each sweep becomes its first value, and a command that
    only prints (`--help`, `--cfg`, ...) or names its own config (`--config-name`, `--config-path`,
    `--experimental-rerun`) is not checked here."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    args, out = list(argv), []
    if any(a in HYDRA_INFO_FLAGS or a.startswith(HYDRA_OWN_CONFIG) for a in args):
        return [], False
    parser = OverridesParser.create()
    while args:
        a = args.pop(0)
        if a in ("-m", "--multirun", "-r", "--run"):
            continue
        if a in ("--config-dir", "-cd") or a.startswith("--config-dir="):
            folder = a.split("=", 1)[1] if "=" in a else (args.pop(0) if args else "")
            out.append(f"hydra.searchpath=[file://{Path(folder).resolve()}]")
            continue
        try:
            (override,) = parser.parse_overrides([a])
        except HydraException:
            out.append(a)  # unreadable: composition reports it in one line
            continue
        if override.is_sweep_override():
            values = list(override.sweep_string_iterator())
            a = f"{a.split('=', 1)[0]}={values[0]}" if values else a
        out.append(a)
    return out, True


def check_hydra_command(prog: str, argv: Sequence[str], config_dir: Path, config_name: str,
                        version_base: str | None, to_config: Callable[[dict[str, Any]], Any],
                        moved: Mapping[str, str] | None = None) -> None:
    """Compose a Hydra command's configuration and read it into its dataclass before Hydra starts the run
    (and creates its folder): a misspelled option, group or experiment, or a value of the wrong type, is exit
    status 2 and one line naming it with the closest valid names (Hydra's own text only with --debug)."""
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError

    from cipr.core.config import compose_checked
    from cipr.core.errors import debug_enabled, report

    overrides, check = hydra_overrides(argv)
    if not check or debug_enabled():
        return
    try:
        composed = compose_checked(config_dir, config_name, overrides, version_base=version_base, moved=moved,
                                   program=prog)
        try:
            data = OmegaConf.to_container(composed, resolve=True)
        except InterpolationResolutionError as e:
            if "HydraConfig was not set" in str(e):  # `${hydra:...}`: known only inside the run
                return
            raise ConfigError(f"{e.full_key}: {str(e).splitlines()[0]} (an interpolation ${{...}} in its "
                              f"value names no option)") from None
        to_config(data)  # type: ignore[arg-type]
    except ConfigError as e:
        report(prog, e)
        raise SystemExit(EXIT_INPUT) from None


def usage(prog: str, doc: str | None, verbs: Mapping[str, Verb]) -> str:
    """The --help text: each verb's options (key=default and a description), then `doc`."""
    out = []
    for name, (cls, _) in verbs.items():
        command = f"{prog} {name}".strip()
        out += [f"{command} key=value ...  (options below; --debug shows the traceback of an error)",
                *(options(cls) or ["  (no options)"]), ""]
    return "\n".join([*out, inspect.cleandoc(doc or "")])


def options(cls: type, prefix: str = "", values: Any = None) -> list[str]:
    """One line per option of dataclass `cls` (nested sections as dotted keys): `key=default  description`."""
    hints, notes = typing.get_type_hints(cls), descriptions(cls)
    lines = []
    for f in sorted(dataclasses.fields(cls), key=lambda f: f.default is f.default_factory, reverse=True):
        if values is not None:
            default = getattr(values, f.name)
        else:
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(hints[f.name]):
            lines += options(hints[f.name], f"{prefix}{f.name}.",
                             None if default is dataclasses.MISSING else default)
            continue
        shown = "(required)" if default is dataclasses.MISSING else override_text(default)
        if isinstance(default, Mapping) and not default:
            shown = f"{{}}  ({prefix}{f.name}.KEY=VALUE adds one)"
        note = " ".join(filter(None, (notes.get(f.name), _choices(hints[f.name]))))
        lines.append(f"  {prefix}{f.name}={shown}".ljust(38) + f"  {note}".rstrip())
    return lines


def descriptions(cls: type) -> dict[str, str]:
    """Option -> one line: its bullet in the class docstring (``- `name`: text``), else its comment."""
    notes: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        try:
            notes.update(re.findall(r"^    (\w+): [^\n]*?  # (.+)$", inspect.getsource(klass), re.M))
        except (OSError, TypeError):  # no source (an interactive definition)
            pass
        bullets = re.findall(r"^- ((?:`\w+`(?:\s*[,/]\s*|\s+and\s+|\s+or\s+)?)+): (.+?)(?=^- |^$|\Z)",
                             inspect.getdoc(klass) or "", re.M | re.S)
        for names, text in bullets:
            line = re.split(r"(?<=\.)\s+(?=[A-Z])|;\s", " ".join(text.split()), maxsplit=1)[0].rstrip(".")
            notes.update((name, line) for name in re.findall(r"`(\w+)`", names))
    return notes


def _choices(typ: Any) -> str:
    """`(a | b)` for a `Literal` option (optional or not), else nothing."""
    inner = get_args(typ) if get_origin(typ) in (Union, types.UnionType) else (typ,)
    allowed = [str(v) for a in inner if get_origin(a) is Literal for v in get_args(a)]
    return f"({' | '.join(allowed)})" if allowed else ""
