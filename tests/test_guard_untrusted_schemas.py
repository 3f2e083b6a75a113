"""Tool schemas are untrusted: validation is offline and bounded, and a bad reference is a contract error."""

from __future__ import annotations

import json
import socket
import time

import pytest
from jsonschema import Draft202012Validator
from referencing.exceptions import Unresolvable

from cipr.cli.guard import main
from cipr.core.errors import DataError
from cipr.guard.contract import MAX_SCHEMA_DEPTH, OFFLINE_REGISTRY, ContractSnapshot, schema_problem
from cipr.guard.diff import diff_interfaces, load_tool_list
from cipr.guard.parse import parse_reply
from cipr.guard.validator import CONTRACT_ERROR, MAX_ARGUMENT_DEPTH, CallValidator
from cipr.tools.interface import Call, Tool


@pytest.fixture
def silent_server():
    """A TCP port on 127.0.0.1 that accepts connections into its backlog and never answers.

    Yields (url, connections): `connections()` says how many clients reached it so far.
    """
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    url = f"http://127.0.0.1:{server.getsockname()[1]}/schema.json"

    def connections() -> int:
        count = 0
        while True:
            try:
                conn, _ = server.accept()
            except TimeoutError:
                return count
            conn.close()
            count += 1

    yield url, connections
    server.close()


def _tool(parameters: dict, name: str = "lookup") -> Tool:
    return Tool(name, "Look a record up.", parameters)


def _obj(**properties) -> dict:
    return {"type": "object", "properties": properties, "required": list(properties)}


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def test_a_remote_ref_is_refused_promptly_without_connecting(silent_server):
    url, connections = silent_server
    params = _obj(key={"$ref": url})
    start = time.monotonic()
    with pytest.raises(DataError, match="points outside the schema") as e:
        ContractSnapshot.from_tools([_tool(params)])
    assert "lookup" in str(e.value) and "parameters" in str(e.value)
    # built around the checks: the validator still refuses
    unchecked = ContractSnapshot((_tool(params),), "v0")
    report = CallValidator(unchecked).validate(Call("lookup", {"key": "k1"}))
    assert not report.valid and report.codes == (CONTRACT_ERROR,)
    with pytest.raises(Unresolvable):  # the registry itself fetches nothing, whatever reaches it
        Draft202012Validator({"$ref": url}, registry=OFFLINE_REGISTRY).is_valid("x")
    assert time.monotonic() - start < 5.0
    assert connections() == 0


@pytest.mark.parametrize("ref", ["other.json", "other.json#/x", "//127.0.0.1:9/x", "#anchor",
                                 "urn:example:thing"])
def test_every_non_pointer_ref_is_refused(ref):
    assert "points outside the schema" in schema_problem(_obj(key={"$ref": ref}))


def test_nested_id_and_dynamic_refs_are_refused(silent_server):
    url, connections = silent_server
    moved = _obj(key={"$id": url, "$ref": "#/$defs/x", "$defs": {"x": {"type": "string"}}})
    assert "nested $id" in schema_problem(moved)
    assert "$dynamicRef" in schema_problem(_obj(key={"$dynamicRef": "#meta"}))
    assert connections() == 0


def test_a_dangling_local_ref_is_a_contract_error():
    params = {**_obj(key={"$ref": "#/$defs/missing"}), "$defs": {"present": {"type": "string"}}}
    with pytest.raises(DataError, match="points to nothing"):
        ContractSnapshot.from_tools([_tool(params)])
    report = CallValidator(ContractSnapshot((_tool(params),), "v0")).validate(Call("lookup", {"key": "k"}))
    assert report.codes == (CONTRACT_ERROR,) and "points to nothing" in report.issues[0].message


def test_local_refs_validate_offline():
    params = {**_obj(key={"$ref": "#/$defs/id"}, tags={"type": "array", "items": {"$ref": "#/$defs/id"}}),
              "$defs": {"id": {"type": "string", "pattern": "^k[0-9]+$"}}}
    validator = CallValidator(ContractSnapshot.from_tools([_tool(params)]))
    assert validator.validate(Call("lookup", {"key": "k1", "tags": ["k2"]})).valid
    report = validator.validate(Call("lookup", {"key": 3, "tags": ["x"]}))
    assert set(report.codes) == {"wrong_type", "constraint"}


def test_ref_like_data_and_a_property_named_ref_are_not_references():
    params = _obj(**{"$ref": {"type": "string"}},
                  meta={"type": "object", "default": {"$ref": "http://example.invalid/x"},
                        "enum": [{"$ref": "http://example.invalid/y"}]})
    assert schema_problem(params) is None


def test_recursive_local_ref_with_deep_arguments_is_bounded():
    params = {"type": "object", "properties": {"next": {"$ref": "#"}}}
    validator = CallValidator(ContractSnapshot.from_tools([_tool(params)]))
    shallow: dict = {}
    for _ in range(MAX_ARGUMENT_DEPTH - 1):
        shallow = {"next": shallow}
    assert validator.validate(Call("lookup", shallow)).valid
    deep: dict = {}
    for _ in range(5000):
        deep = {"next": deep}
    report = validator.validate(Call("lookup", deep))
    assert report.codes == ("constraint",) and "deeper than" in report.render()
    json.dumps(report.to_json()["issues"])  # the report itself stays writable


def test_deep_nesting_is_refused_before_anything_recurses(tmp_path):
    assert schema_problem(_nested(MAX_SCHEMA_DEPTH // 2 - 1)) is None
    assert "deeper than" in schema_problem(_nested(MAX_SCHEMA_DEPTH // 2 + 1))
    deep = _nested(3000)
    assert "deeper than" in schema_problem(deep)
    with pytest.raises(DataError, match="deeper than"):
        ContractSnapshot.from_tools([_tool(deep)])
    with pytest.raises(DataError, match="deeper than"):
        ContractSnapshot.from_openai([{"type": "function", "function": {"name": "f", "parameters": deep}}])
    report = CallValidator(ContractSnapshot((_tool(deep),), "v0")).validate(Call("lookup", {"a": "x"}))
    assert report.codes == (CONTRACT_ERROR,)
    assert parse_reply("[" * 5000 + "]" * 5000).calls == ()
    text = '{"name": "lookup", "arguments": ' + '{"a": ' * 3000 + "1" + "}" * 3001
    assert parse_reply(text).attempted


def test_deep_tool_list_file_is_one_clear_error(tmp_path, capsys):
    shallow = tmp_path / "old.json"
    shallow.write_text(json.dumps([{"name": "f", "description": "d",
                                    "parameters": _obj(a={"type": "string"})}]))
    for depth in (200, 3000):
        deep = tmp_path / f"deep{depth}.json"
        deep.write_text('[{"name": "f", "description": "d", "parameters": '
                        + '{"type": "object", "properties": '
                        '{"a": ' * depth + '{"type": "string"}' + "}}" * depth + "}]")
        with pytest.raises(DataError, match="deep"):
            load_tool_list(deep)
        assert main(["diff", f"old={shallow}", f"new={deep}"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"deep{depth}.json" in err and "Traceback" not in err


def _write(path, params):
    path.write_text(json.dumps([{"type": "function", "function": {"name": "lookup",
                                                                  "description": "Look a record up.",
                                                                  "parameters": params}}]))
    return path


def test_diff_blocks_a_remote_or_dangling_ref(tmp_path, silent_server, capsys):
    url, connections = silent_server
    old = _write(tmp_path / "old.json", _obj(key={"type": "string"}))
    for name, params in (("remote", _obj(key={"$ref": url})),
                         ("dangling", {**_obj(key={"$ref": "#/$defs/gone"}), "$defs": {}})):
        new = _write(tmp_path / f"{name}.json", params)
        start = time.monotonic()
        report = tmp_path / "reports" / f"{name}.md"
        assert main(["diff", f"old={old}", f"new={new}", f"report={report}"]) == 1  # contract
        assert time.monotonic() - start < 10
        report = json.loads((tmp_path / "reports" / f"{name}.json").read_text())
        assert report["verdict"] == "block"
        assert {c["kind"] for c in report["changes"] if c["category"] == "contract"} >= {"invalid_schema"}
        assert "widened_type" not in capsys.readouterr().out
    assert connections() == 0


def test_string_to_ref_is_a_contract_change_not_a_widened_type():
    old = [_tool(_obj(key={"type": "string"}))]
    new = [_tool({**_obj(key={"$ref": "#/$defs/id"}), "$defs": {"id": {"type": "string"}}})]
    report = diff_interfaces(old, new)
    kinds = {c.kind for c in report.changes}
    assert "widened_type" not in kinds and "changed_reference" in kinds and report.verdict == "block"
    same = diff_interfaces(new, [_tool(dict(new[0].parameters))])
    assert same.verdict == "pass" and not same.changes
    retargeted = [_tool({**_obj(key={"$ref": "#/$defs/id"}), "$defs": {"id": {"type": "integer"}}})]
    assert diff_interfaces(new, retargeted).verdict == "block"  # same $ref, what it points at changed
