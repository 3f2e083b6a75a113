"""Release-gate diff: each change kind classified, the loaders, and the CLI's exit codes."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from cipr.cli.guard import main
from cipr.core.errors import DataError
from cipr.guard.diff import DiffConfig, diff_interfaces, load_tool_list
from cipr.tools.interface import Interface, Tool

WEATHER = Tool("get_weather", "Get the current weather for a city, in celsius or fahrenheit.", {
    "type": "object",
    "properties": {
        "location": {"type": "string", "description": "The city name, e.g. Paris."},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "number", "description": "Forecast length."},
        "options": {"type": "object",
                    "properties": {"hourly": {"type": "boolean"}, "lang": {"type": "string"}}},
    },
    "required": ["location"]})
EMAIL = Tool("send_email", "Send an email message to a recipient.", {
    "type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
    "required": ["to", "body"]})
OLD = [WEATHER, EMAIL]


def params(tool: Tool) -> dict:
    return copy.deepcopy(dict(tool.parameters))


def kinds(old, new, **cfg) -> list[tuple[str, str, str]]:
    report = diff_interfaces(old, new, DiffConfig(**cfg))
    return sorted((c.kind, c.category, c.path) for c in report.changes)


def test_identical_lists_pass():
    report = diff_interfaces(OLD, list(OLD))
    assert report.changes == () and report.verdict == "pass" and report.old_version == report.new_version


def test_renamed_tool_is_drift():
    assert kinds(OLD, [WEATHER.with_(name="weather_now"), EMAIL]) == [("renamed_tool", "drift", "")]


def test_renamed_parameter_is_drift():
    p = params(WEATHER)
    p["properties"] = {("city" if k == "location" else k): v for k, v in p["properties"].items()}
    p["required"] = ["city"]
    assert kinds(OLD, [WEATHER.with_(parameters=p), EMAIL]) == [("renamed_parameter", "drift", "location")]


def test_reordering_and_rewording_are_drift():
    p = params(WEATHER)
    p["properties"] = dict(reversed(list(p["properties"].items())))
    p["properties"]["location"]["description"] = "City, for example city_name=Paris."
    new = [EMAIL, WEATHER.with_(description="Weather now for a city (celsius or fahrenheit).", parameters=p)]
    assert kinds(OLD, new) == [("reordered_parameters", "drift", "parameters"),
                               ("reordered_tools", "drift", ""), ("reworded_description", "drift", ""),
                               ("reworded_parameter_description", "drift", "location")]


def test_added_tools_overlapping_or_new():
    lookalike = Tool("get_weather_pro", "Get the current weather for a city, faster.", WEATHER.parameters)
    other = Tool("book_flight", "Book a plane ticket between two airports.", EMAIL.parameters)
    assert kinds(OLD, OLD + [lookalike]) == [("overlapping_tool_added", "drift", "")]
    assert kinds(OLD, OLD + [other]) == [("added_tool", "contract", "")]
    assert kinds(OLD, OLD + [other], added_tool_is_contract=False) == [("added_tool", "drift", "")]


def test_removed_tool_and_parameter_are_contract_changes():
    p = params(EMAIL)
    del p["properties"]["body"]
    p["required"] = ["to"]
    assert kinds(OLD, [WEATHER]) == [("removed_tool", "contract", "")]
    assert kinds(OLD, [WEATHER, EMAIL.with_(parameters=p)]) == [("removed_parameter", "contract", "body")]


def test_added_parameters_and_required_flags():
    p = params(EMAIL)
    p["properties"]["cc"] = {"type": "array", "items": {"type": "string"}}
    p["properties"]["priority"] = {"type": "integer"}
    p["required"] = ["to", "body", "priority"]
    assert kinds(OLD, [WEATHER, EMAIL.with_(parameters=p)]) == [
        ("added_optional_parameter", "drift", "cc"), ("added_required_parameter", "contract", "priority")]
    w = params(WEATHER)
    w["required"] = ["unit"]
    assert kinds(OLD, [WEATHER.with_(parameters=w), EMAIL]) == [
        ("became_optional", "drift", "location"), ("became_required", "contract", "unit")]


@pytest.mark.parametrize(("old_type", "new_type", "kind", "category"), [
    ("number", "integer", "narrowed_type", "contract"),
    (["string", "null"], "string", "narrowed_type", "contract"),
    ("integer", "number", "widened_type", "drift"),
    ("number", "string", "changed_type", "contract"),
])
def test_type_changes(old_type, new_type, kind, category):
    a, b = params(WEATHER), params(WEATHER)
    a["properties"]["days"]["type"] = old_type
    b["properties"]["days"]["type"] = new_type
    assert kinds([WEATHER.with_(parameters=a)], [WEATHER.with_(parameters=b)]) == [(kind, category, "days")]


@pytest.mark.parametrize(("new_enum", "kind", "category"), [
    (["C", "F"], "replaced_enum_values", "contract"),
    (["celsius"], "removed_enum_values", "contract"),
    (["celsius", "fahrenheit", "kelvin"], "added_enum_values", "drift"),
    (None, "removed_enum", "drift"),
])
def test_enum_changes(new_enum, kind, category):
    p = params(WEATHER)
    if new_enum is None:
        del p["properties"]["unit"]["enum"]
    else:
        p["properties"]["unit"]["enum"] = new_enum
    assert kinds(OLD, [WEATHER.with_(parameters=p), EMAIL]) == [(kind, category, "unit")]


def test_restricting_values_with_a_new_enum_blocks():
    p = params(WEATHER)
    p["properties"]["location"]["enum"] = ["Paris", "Rome"]
    assert kinds(OLD, [WEATHER.with_(parameters=p), EMAIL]) == [("added_enum", "contract", "location")]


def test_nested_changes_carry_their_path():
    p = params(WEATHER)
    del p["properties"]["options"]["properties"]["lang"]
    p["properties"]["options"]["properties"]["hourly"]["type"] = "string"
    assert kinds(OLD, [WEATHER.with_(parameters=p), EMAIL]) == [
        ("changed_type", "contract", "options.hourly"), ("removed_parameter", "contract", "options.lang")]


def test_a_rename_that_also_narrows_reports_both():
    p = params(WEATHER)
    p["properties"]["days"]["type"] = "integer"
    assert kinds(OLD, [WEATHER.with_(name="weather", parameters=p), EMAIL]) == [
        ("narrowed_type", "contract", "days"), ("renamed_tool", "drift", "")]


def test_constraint_changes_block():
    p = params(WEATHER)
    p["properties"]["days"]["maximum"] = 7
    assert kinds(OLD, [WEATHER.with_(parameters=p), EMAIL]) == [("changed_constraint", "contract", "days")]


def test_loaders_read_openai_mcp_and_bfcl(tmp_path):
    (tmp_path / "openai.json").write_text(json.dumps(Interface(tuple(OLD)).to_openai()))
    (tmp_path / "mcp.json").write_text(json.dumps(Interface(tuple(OLD)).to_mcp()))
    (tmp_path / "bare.json").write_text(json.dumps([t.to_openai()["function"] for t in OLD]))
    loaded = [load_tool_list(tmp_path / f) for f in ("openai.json", "mcp.json", "bare.json")]
    assert all(diff_interfaces(OLD, x).changes == () for x in loaded)
    bfcl = {"id": "x_1", "function": [{"name": "f", "description": "d", "parameters": {
        "type": "dict", "properties": {"a": {"type": "float"}}, "required": ["a"]}}]}
    (tmp_path / "q.jsonl").write_text(json.dumps(bfcl) + "\n" + json.dumps({**bfcl, "id": "x_2"}) + "\n")
    tool = load_tool_list(tmp_path / "q.jsonl", item="x_2")[0]
    assert tool.parameters["properties"]["a"]["type"] == "number"
    with pytest.raises(DataError, match="pass the item id"):
        load_tool_list(tmp_path / "q.jsonl")
    with pytest.raises(DataError, match="no row has this id"):
        load_tool_list(tmp_path / "q.jsonl", item="nope")
    (tmp_path / "bad.json").write_text(json.dumps({"foo": 1}))
    with pytest.raises(DataError, match="bad.json"):
        load_tool_list(tmp_path / "bad.json")


def test_cli_exit_codes_and_reports(tmp_path, capsys):
    old, drift, contract = tmp_path / "old.json", tmp_path / "drift.json", tmp_path / "contract.json"
    old.write_text(json.dumps(Interface(tuple(OLD)).to_openai()))
    drift.write_text(json.dumps(Interface((EMAIL, WEATHER.with_(name="weather_now"))).to_mcp()))
    contract.write_text(json.dumps(Interface((WEATHER,)).to_openai()))
    assert main(["diff", f"old={old}", f"new={drift}", f"report={tmp_path / 'r.md'}"]) == 0
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["verdict"] == "pass" and data["counts"] == {"drift": 2, "contract": 0}
    assert "Verdict: **PASS**" in (tmp_path / "r.md").read_text()
    gate = tmp_path / "gate.json"
    assert main(["diff", f"old={old}", f"new={contract}", f"report={gate}"]) == 1  # as diff(1)
    assert json.loads((tmp_path / "gate.json").read_text())["changes"][0]["kind"] == "removed_tool"
    assert "removed_tool" in (tmp_path / "gate.md").read_text()
    assert main(["diff", f"old={old}", f"new={tmp_path / 'missing.json'}"]) == 2  # bad input stops it too
    assert "missing.json" in capsys.readouterr().err
    assert main(["diff", f"old={old}"]) == 2
    assert "'new' is required" in capsys.readouterr().err


@pytest.mark.integration
def test_cli_on_real_bfcl_item_via_subprocess(shared_data, tmp_path):
    src = shared_data / "bfcl_v4" / "BFCL_v4_simple_python.json"
    row = json.loads(src.read_text().splitlines()[0])
    assert row["id"] == "simple_python_0"
    fn = row["function"][0]
    fn["parameters"]["properties"]["height"]["type"] = "float"  # integer -> number: widened (drift)
    drifted = tmp_path / "drifted.json"
    drifted.write_text(json.dumps(row))
    cmd = [sys.executable, "-m", "cipr.cli.guard", "diff", f"old={src}", f"new={drifted}",
           "item=simple_python_0"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "widened_type" in run.stdout
    fn["parameters"]["required"].append("unit")  # optional -> required: a contract change
    drifted.write_text(json.dumps(row))
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "became_required" in run.stdout, run.stderr


def test_release_gate_on_real_bfcl_drift_perturbations(shared_data):
    """The study's drift types keep the contract (pass); type narrowing, enum replacement and
    multi-tool refactors, which the study never tested, change it (block) whenever they change anything."""
    from cipr.data.bfcl import load_bfcl
    from cipr.guard.evaluate import STUDY_PARTITIONS, study_sample
    from cipr.perturb.registry import apply_perturbation

    sample = study_sample(load_bfcl(shared_data, partitions=STUDY_PARTITIONS), per_partition=10, seed=0)
    for name in ("drift_stale_examples", "drift_renamed_parameters", "drift_distractors", "drift_mild",
                 "drift_medium", "drift_type_narrowing", "drift_enum_replacement", "drift_refactor"):
        blocked = changed = 0
        for example in sample:
            shifted, _ = apply_perturbation(example, name, seed=0)
            report = diff_interfaces(example.interface, shifted.interface)
            changed += bool(report.changes)
            blocked += report.has_contract_change
        if name in ("drift_type_narrowing", "drift_enum_replacement", "drift_refactor"):
            assert blocked == changed > 0, name
        else:
            assert blocked == 0 and changed > 0, name
