"""The run scaffold every runner shares (cipr/core/run_folder.py): config record and refusal, torn lines
(`cipr.core.io.complete_lines`), truncation."""

from __future__ import annotations

import json

import pytest

from cipr.core.errors import ConfigError, DataError
from cipr.core.io import complete_lines
from cipr.core.run_folder import (
    WALL_TIME_JSON,
    changed_keys,
    check_config,
    prepare,
    read_wall_time,
    truncate_metrics,
    write_wall_time,
)


def test_changed_keys_by_section_and_recorded_only():
    old = {"model": {"name": "a", "lr": 1}, "data": {"n": 4}, "note": "x"}
    new = {"model": {"name": "b", "lr": 1, "added": True}, "data": {"n": 4}}
    assert changed_keys(old, new, ("model", "data")) == \
        {"model.added": (None, True), "model.name": ("a", "b")}
    assert changed_keys({"seed": 0, "created": "t"}, {"seed": 1, "new_field": 2}, recorded_only=True) == \
        {"seed": (0, 1)}


def test_prepare_records_the_config_and_refuses_another_run_once_started(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    run = tmp_path / "run"
    assert prepare(run, {"algo": {"name": "cipr"}}, ("algo",), lambda: False)
    assert json.loads((run / "config.json").read_text()) == {"algo": {"name": "cipr"}}
    assert "name: cipr" in (run / "config.yaml").read_text()
    check_config(run, {"algo": {"name": "grpo"}}, ("algo",), lambda: False)  # nothing trained yet: allowed
    with pytest.raises(ConfigError, match=r"different config \(algo.name\).*another trainer.run_dir"):
        check_config(run, {"algo": {"name": "grpo"}}, ("algo",), lambda: True)


def test_only_the_main_process_writes_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert not prepare(tmp_path / "run", {"a": {}}, ("a",), lambda: True)
    assert not (tmp_path / "run").exists()


def test_complete_lines_cuts_or_ignores_a_torn_tail(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2')
    assert complete_lines(path, cut=False) == b'{"a": 1}\n' and path.read_bytes().endswith(b"2")
    assert complete_lines(path, cut=True) == b'{"a": 1}\n' and path.read_bytes() == b'{"a": 1}\n'
    assert complete_lines(tmp_path / "none.jsonl", cut=True) == b""


def test_truncate_metrics_drops_lines_past_the_resumed_step_and_later_stages(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [{"stage": "warm_start", "step": 5}, {"stage": "warm_start", "kind": "stage_end"},
             {"stage": "grpo", "step": 1}, {"stage": "grpo", "step": 2},
             {"stage": "grpo", "kind": "stage_end"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"torn')
    assert truncate_metrics([path, tmp_path / "absent.jsonl"], "warm_start", 3, ("warm_start", "grpo")) == 6
    assert path.read_text() == ""
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert truncate_metrics([path], "grpo", 1, ("warm_start", "grpo")) == 2
    assert [json.loads(x) for x in path.read_text().splitlines()] == lines[:3]


def test_wall_time_adds_up_over_invocations_and_a_malformed_record_is_named(tmp_path):
    assert read_wall_time(tmp_path) == (0.0, 0)  # a new run
    assert write_wall_time(tmp_path, read_wall_time(tmp_path), 340.0) == (340.0, 1)
    assert write_wall_time(tmp_path, read_wall_time(tmp_path), 60.5) == (400.5, 2)
    assert read_wall_time(tmp_path) == (400.5, 2)
    for bad in ("[1, 2]", '{"seconds": -1, "invocations": 1}', '{"seconds": 3}', "{not json"):
        (tmp_path / WALL_TIME_JSON).write_text(bad)
        with pytest.raises(DataError, match=WALL_TIME_JSON):
            read_wall_time(tmp_path)
