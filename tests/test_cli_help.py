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


# a misspelled key for every command, and for the Hydra ones a misspelled group and experiment too
TYPOS: dict[str, list[list[str]]] = {name: [["limti=3"]] for name in SCRIPTS}
for _verb_command, _verb in (("cipr-data", "stats"), ("cipr-guard", "diff")):
    TYPOS[_verb_command] = [[_verb, "limti=3"]]
TYPOS["cipr-study"] = [["run", "study=cpu_dose", "limti=3"], ["run", "study=cpu_dos"],
                       ["report", "study=cpu_dose", "study.seeds=[0,0]"]]
TYPOS["cipr-train"] = [["experiment=smoke", "algo.rescore_weigth=1"], ["algo=ciprr"], ["experiment=smokee"],
                       ["algo.names=original"], ["trainer.max_steps=[1,"],
                       ["trainer.run_dir=runs/${trainer.seeed}"]]
TYPOS["cipr-eval"] = [["limti=3"], ["benchmark=bfclx"]]
TYPOS["cipr-plan"] = [["experiment=smoke", "algo.rescore_weigth=1"], ["experiment=smokee"]]


@pytest.mark.parametrize(("name", "args"), [(n, a) for n in sorted(TYPOS) for a in TYPOS[n]])
def test_a_typo_is_one_line_and_exit_status_2_for_every_command(name, args, monkeypatch, capsys, tmp_path):
    """Unknown or misspelled options, config groups and experiments: one stderr line naming them (with the
    closest valid names where there are some), exit status 2, and no run folder left behind."""
    module, func = SCRIPTS[name].split(":")
    entry = getattr(importlib.import_module(module), func)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [name, *args])
    monkeypatch.delenv("CIPR_DEBUG", raising=False)
    try:
        code = entry()
    except SystemExit as e:
        code = e.code
    captured = capsys.readouterr()
    lines = [x for x in captured.err.splitlines() if x.strip() and "Warning" not in x and "WARNING" not in x]
    assert code == 2, (captured.out, captured.err)
    assert len(lines) == 1 and lines[0].startswith(f"{name}:"), captured.err
    assert "HYDRA_FULL_ERROR" not in captured.err and "To append to your config use" not in captured.err
    typo = next(a for a in args if "=" in a and not a.startswith("experiment=smoke") or a == args[-1])
    named = typo.split("=", 1)[1] if typo.split("=", 1)[0] in ("algo", "experiment", "benchmark") else \
        typo.split("=", 1)[0]
    assert named.rstrip("[,") in lines[0] or "cannot read the options" in lines[0], lines[0]
    assert not [p for p in tmp_path.rglob("*") if p.is_dir()], "a refused run left a folder"


def test_a_run_refused_before_its_work_leaves_no_folder_and_a_used_one_is_kept(monkeypatch, capsys, tmp_path):
    """Refused by the checks before Hydra starts, or by an unreadable data file after the run folder got
    its config: no folder either way; a folder with a run's work in it is never removed."""
    from cipr.cli.train import main
    from cipr.ops.launch import discard_if_unused

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CIPR_DEBUG", raising=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "hi"}], "tools": 3}\n')
    for args, said in ((["model.name_or_path=/nonexistent/model"], "is not a folder"),
                       (["data=messages", f"data.path={bad}"], "'tools' must be a list")):
        monkeypatch.setattr(sys, "argv", ["cipr-train", *args, "trainer.run_dir=runs/refused"])
        try:
            code = main()
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        assert code == 2 and said in err, err
        left = sorted(p.name for p in (tmp_path / "runs").rglob("*"))
        assert not (tmp_path / "runs" / "refused").exists(), left
    used = tmp_path / "used"
    (used / ".hydra").mkdir(parents=True)
    for name in ("config.json", "metrics.jsonl"):
        (used / name).write_text("{}")
    assert not discard_if_unused(used) and (used / "config.json").is_file()
