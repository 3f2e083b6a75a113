"""Bad input to cipr-guard diff and to the guard's drift evaluation (`cipr-eval guard.enabled=true`): exit 2,
one clear line, no traceback, every input and earlier output untouched.

Each case builds its files in a fresh folder, runs the command and compares every file's bytes (and
the set of files) before and after. The eval cases fail before any model is loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from cipr.cli.guard import main

OLD = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city.",
                                         "parameters": {"type": "object",
                                                        "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}]


def _nested(depth: int) -> str:
    schema = '{"type": "string"}'
    for _ in range(depth):
        schema = '{"type": "object", "properties": {"a": ' + schema + "}}"
    return '[{"name": "f", "description": "d", "parameters": ' + schema + "}]"


def _guard_rows(n: int) -> str:
    return "".join(json.dumps({"id": f"other_{i}", "correct": True}) + "\n" for i in range(n))


@dataclass(frozen=True)
class Case:
    """A command line (`{d}` is the case's folder, `{tiny}` a tiny model folder; `cipr-eval` first for the
    drift evaluation), the files to create first, and the expected message."""

    name: str
    argv: tuple[str, ...]
    message: str
    files: dict[str, str | bytes] | None = None
    dirs: tuple[str, ...] = ()
    skip: Callable[[], bool] | None = None


OK = {"old.json": json.dumps(OLD), "new.json": json.dumps(OLD)}
DIFF = ("diff", "old={d}/old.json", "new={d}/new.json")
EVAL = ("cipr-eval", "model={tiny}", "limit=1", "out_dir={d}/out")  # with guard.enabled=true
ROWS = json.dumps({"id": "a", "function": []}) + "\n" + json.dumps({"id": "b", "function": []})

CASES = [
    Case("missing old file", ("diff", "old={d}/nope.json", "new={d}/new.json"), "No such file", OK),
    Case("new is a folder", ("diff", "old={d}/old.json", "new={d}/sub"), "Is a directory", OK, ("sub",)),
    Case("malformed json", DIFF, "not valid JSON (Expecting property name enclosed in double quotes: line 1 "
         "column 15)", {**OK, "new.json": '[{"name": "f",'}),
    Case("malformed json lines", DIFF, "not valid JSON (Expecting value: line 3 column 8)",
         {**OK, "new.json": json.dumps({"id": "a", "function": []}) + "\n\n" + '{"id": }'}),
    Case("binary file", DIFF, "not a UTF-8 text file (invalid start byte at byte offset 0)",
         {**OK, "new.json": b"\xff\xfe\x00garbage"}),
    Case("UTF-16 file", DIFF, "new.json': not a UTF-8 text file (invalid start byte at byte offset 0)",
         {**OK, "new.json": json.dumps(OLD).encode("utf-16")}),
    Case("bad byte mid-file", DIFF, "not a UTF-8 text file (invalid continuation byte at byte offset 11)",
         {**OK, "new.json": b'[{"name": "\xe9t\xe9"}]'}),
    Case("wrong shape", DIFF, "expected a list of tools", {**OK, "new.json": json.dumps({"foo": 1})}),
    Case("entry not an object", DIFF, "a tool entry must be an object", {**OK, "new.json": "[1, 2]"}),
    Case("tool without a name", DIFF, "tool name must be a non-empty string",
         {**OK, "new.json": json.dumps([{"description": "d", "parameters": {}}])}),
    Case("duplicate tool names", DIFF, "duplicate tool name", {**OK, "new.json": json.dumps(OLD + OLD)}),
    Case("bad BFCL type", DIFF, "unknown type 'blob'", {**OK, "new.json": json.dumps(
        [{"name": "f", "description": "d",
          "parameters": {"type": "dict", "properties": {"a": {"type": "blob"}}}}])}),
    Case("3000-deep nesting", DIFF, "nests too deeply", {**OK, "new.json": _nested(3000)}),
    Case("200-deep nesting", DIFF, "deeper than", {**OK, "new.json": _nested(200)}),
    Case("json lines without item=", DIFF, "pass the item id", {**OK, "new.json": ROWS}),
    Case("item= not found", (*DIFF, "item=zzz"), "no row has this id", {**OK, "new.json": ROWS}),
    Case("threshold above 1", (*DIFF, "rename_threshold=1.5"),
         "rename_threshold must be a number from 0 to 1", OK),
    Case("threshold nan", (*DIFF, "overlap_threshold=nan"), "overlap_threshold must be a number from 0 to 1",
         OK),
    Case("threshold not a number", (*DIFF, "rename_threshold=x"), "'rename_threshold' must be a number", OK),
    Case("unknown option", (*DIFF, "new_tools_are_drift=true"), "unknown config key 'new_tools_are_drift'",
         OK),
    Case("not key=value", (*DIFF, "--bogus"), "cannot read the option '--bogus'", OK),
    Case("missing argument", ("diff", "old={d}/old.json"), "'new' is required", OK),
    Case("unknown verb", ("eval", "model=x"), "unknown command 'eval'", OK),
    Case("report= names a folder", (*DIFF, "report={d}/reports"), "is a folder", OK, ("reports",)),
    Case("report= would overwrite the new input", (*DIFF, "report={d}/new.json"), "this command's input", OK),
    Case("report= .md beside an input .json", (*DIFF, "report={d}/old.md"), "this command's input", OK),
    Case("report= under a file", (*DIFF, "report={d}/old.json/r.md"), "is a file, not a folder", OK),
    Case("eval limit=0", (*EVAL, "limit=0"), "limit=0 must be a positive number", {}),
    Case("eval limit=-1", (*EVAL, "limit=-1"), "limit=-1 must be", {}),
    Case("eval shard 3/2", (*EVAL, "guard.shard=3/2"), "shard must be K/N", {}),
    Case("eval shard x", (*EVAL, "guard.shard=x"), "shard must be K/N", {}),
    Case("eval unknown policy", (*EVAL, "guard.policies=[none,bogus]"), "unknown guard policies", {}),
    Case("eval budget 0", (*EVAL, "guard.budget=0"), "budget must be a positive", {}),
    Case("eval batch_size 0", (*EVAL, "batch_size=0"), "batch_size=0 must be", {}),
    Case("eval unknown format", (*EVAL, "format=bogus"), "format='bogus'", {}),
    Case("eval device cuda without one", (*EVAL, "device=cuda"), "no CUDA device",
         {}, skip=torch.cuda.is_available),
    Case("eval out_dir names a file", EVAL, "is a file, not a folder", {"out": "my notes\n"}),
    Case("eval missing model folder", ("cipr-eval", "model={d}/no_model", "limit=1", "out_dir={d}/out"),
         "no such folder", {}),
    Case("eval model folder without a model", ("cipr-eval", "model={d}/empty", "limit=1", "out_dir={d}/out"),
         "cannot load a model", {}, ("empty",)),
    Case("eval missing data root", (*EVAL, "data_root={d}/nodata"), "data not found", {}),
    Case("eval out_dir holds another run's 1,000 results", EVAL, "no run.json",
         {"out/results.jsonl": _guard_rows(1000)}),
    Case("eval out_dir holds another kind of run", EVAL, "another kind of run",
         {"out/results.jsonl": _guard_rows(3), "out/run.json": json.dumps({"model": "m"})}),
]


def _snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def _build(root: Path, case: Case, tiny: Path) -> list[str]:
    for name in case.dirs:
        (root / name).mkdir(parents=True)
    for name, content in (case.files or {}).items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return [a.replace("{d}", str(root)).replace("{tiny}", str(tiny)) for a in case.argv]


def _cipr_eval_guard(overrides: list[str]) -> int:
    """`cipr-eval guard.enabled=true` with these overrides; its exit status."""
    from hydra import compose, initialize_config_dir

    from cipr.cli.eval import CONFIG_DIR, run

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="eval", overrides=["guard.enabled=true", "progress=false", *overrides])
    try:
        run(cfg)
    except SystemExit as e:
        return e.code
    return 0


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.integration
def test_bad_input_is_one_clear_line_and_touches_nothing(case, tmp_path, shared_data, tiny_dir, capsys,
                                                         monkeypatch):
    if case.skip is not None and case.skip():
        pytest.skip("not a bad input on this machine")
    monkeypatch.delenv("CIPR_DEBUG", raising=False)
    argv = _build(tmp_path, case, tiny_dir)
    before = _snapshot(tmp_path)
    if argv[0] == "cipr-eval":  # the guard's drift evaluation is a cipr-eval option
        root = [] if any(a.startswith("data_root=") for a in argv) else [f"data_root={shared_data}"]
        program, code = "cipr-eval", _cipr_eval_guard([*argv[1:], *root])
    else:
        program, code = "cipr-guard", main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith(program), err
    assert case.message in err, err
    assert "Traceback" not in err + out
    assert _snapshot(tmp_path) == before  # inputs, earlier outputs and the file set are all unchanged


@pytest.mark.integration
def test_the_console_command_gives_one_line_and_debug_gives_the_traceback(tmp_path):
    (tmp_path / "old.json").write_text(json.dumps(OLD))
    (tmp_path / "new.json").write_text('[{"name": "f",')
    cmd = [sys.executable, "-m", "cipr.cli.guard", "diff", f"old={tmp_path / 'old.json'}",
           f"new={tmp_path / 'new.json'}"]
    env = {k: v for k, v in os.environ.items() if k != "CIPR_DEBUG"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "new.json" in run.stderr and "Traceback" not in run.stderr
    run = subprocess.run([*cmd, "--debug"], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode != 0 and "Traceback" in run.stderr and "DataError" in run.stderr
