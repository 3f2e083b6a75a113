"""Every console script answers `--help` with its options and at least one example, exit status 0.

The scripts are read from pyproject.toml, so a new command is checked as soon as it is declared; each
runs in this process (its `main` with `sys.argv` set), which also proves `--help` needs no model,
data or network.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
EXAMPLE = re.compile(r"^\s*Examples?\b", re.M)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_help_lists_options_and_an_example(name, monkeypatch, capsys, tmp_path):
    module, func = SCRIPTS[name].split(":")
    entry = getattr(importlib.import_module(module), func)
    monkeypatch.chdir(tmp_path)  # a Hydra command must not create its run folder for --help
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    saved = dict(os.environ)
    try:
        entry()
        code = 0
    except SystemExit as e:
        code = e.code or 0
    finally:
        os.environ.clear()
        os.environ.update(saved)
    out = capsys.readouterr().out
    assert code == 0, out
    assert name in out and "option" in out.lower(), out[:500]
    assert EXAMPLE.search(out), f"{name} --help has no 'Example' line:\n{out[:2000]}"
    assert not any(tmp_path.iterdir()), f"{name} --help wrote {sorted(p.name for p in tmp_path.iterdir())}"
