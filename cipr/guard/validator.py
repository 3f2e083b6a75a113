"""Validate a proposed call against a contract snapshot and say, field by field, what is wrong.

The report is structured (typed issues: path, code, expected, got) because the repair prompt feeds
it back to the model; the study found that this feedback, not a bare "invalid" flag, makes repair work.

Checks, in order: the call has a name; the name is declared by the snapshot; the arguments are an
object; the arguments satisfy the tool's JSON Schema under Draft 2020-12 (`jsonschema`'s
`Draft202012Validator`): required, unknown arguments, type, enum/const, nested objects and arrays,
and any other keyword the schema uses (minimum, pattern, ...) reported as `constraint`.

Choices the guide and study (docs/references.md) leave open:
- Unknown arguments: schemas rarely say `additionalProperties: false`, yet a renamed parameter shows
  up exactly as one. With `strict_unknown=True` (default) every object schema declaring `properties`
  without `additionalProperties` is closed, nested ones too (not under `allOf`, where it would reject
  a sibling's properties); an explicit `additionalProperties` is respected.
- A name declared twice (a same-name duplicate): the call is valid if any declaration accepts it
  (the project's BFCL scoring rule); the report shows the declaration with the fewest issues.
- Only the declared name and schema are checked: a valid call may still be the wrong tool or value
  (the study's "validator-invisible" errors). That is for the caller's semantic review.
- Schemas are untrusted: validation is offline (`OFFLINE_REGISTRY`: no reference is ever fetched).
  A declaration whose schema cannot be a contract (`cipr.guard.contract.schema_problem`: too deep,
  a remote or dangling `$ref`, ...) accepts no call: every call to it gets a `contract_error`.
  Arguments nested deeper than `MAX_ARGUMENT_DEPTH` get a `constraint` issue without being walked.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing.exceptions import Unresolvable

from cipr.guard.contract import OFFLINE_REGISTRY, ContractSnapshot, nesting_depth, schema_problem
from cipr.tools.interface import Call, Tool

# Issue codes. Name-level codes mean the call cannot be checked against any tool's schema.
MISSING_NAME = "missing_name"
UNKNOWN_TOOL = "unknown_tool"
ARGUMENTS_NOT_OBJECT = "arguments_not_object"
MISSING_REQUIRED = "missing_required"
UNKNOWN_ARGUMENT = "unknown_argument"
WRONG_TYPE = "wrong_type"
ENUM_MISMATCH = "enum_mismatch"
CONSTRAINT = "constraint"
CONTRACT_ERROR = "contract_error"
NAME_CODES = frozenset({MISSING_NAME, UNKNOWN_TOOL})
MAX_ARGUMENT_DEPTH = 32
"""Deepest nesting of objects and arrays accepted in a call's arguments (deeper ones are refused unread)."""


@dataclass(frozen=True)
class ValidatorConfig:
    """What the validator checks.

    - `strict_unknown`: report arguments the schema does not declare (see the module docstring).
    - `check_types`: report type mismatches. BFCL's Java and JavaScript items pass values as source
      literals in strings while their schemas declare `integer`, `boolean`, ...; turn this off there.
    - `check_enums`: report values outside an enum (BFCL's own checker ignores enums, and a few of
      its live reference answers break them).
    """

    strict_unknown: bool = True
    check_types: bool = True
    check_enums: bool = True


@dataclass(frozen=True)
class ValidationIssue:
    """One thing wrong with a call: where (`path`, e.g. `arguments.location.city`), what (`code`),
    what the contract expects and what the call gave."""

    path: str
    code: str
    expected: Any = None
    got: Any = None
    message: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "code": self.code, "expected": self.expected, "got": self.got,
                "message": self.message}


@dataclass(frozen=True)
class ValidationReport:
    """The verdict on one call: `tool` is the declared tool it was checked against (None if none)."""

    call: Call
    contract_version: str
    tool: str | None
    issues: tuple[ValidationIssue, ...] = field(default_factory=tuple)

    @property
    def valid(self) -> bool:
        return not self.issues

    @property
    def name_resolved(self) -> bool:
        """The call names a declared tool (its arguments may still be wrong)."""
        return not any(i.code in NAME_CODES for i in self.issues)

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(i.code for i in self.issues)

    def render(self) -> str:
        """The report as lines for a repair prompt."""
        if self.valid:
            return "valid"
        return "\n".join(f"- {i.code} at {i.path}: {i.message}" for i in self.issues)

    def to_json(self) -> dict[str, Any]:
        return {"valid": self.valid, "tool": self.tool, "contract_version": self.contract_version,
                "call": call_to_json(self.call), "issues": [i.to_json() for i in self.issues]}


def call_to_json(call: Call) -> dict[str, Any]:
    """A call as JSON, tolerating the malformed ones the guard sees (no name, non-object arguments)."""
    args = call.arguments
    return {"name": call.name, "arguments": dict(args) if isinstance(args, Mapping) else args}


def _short(value: Any, limit: int = 120) -> str:
    if nesting_depth(value, MAX_ARGUMENT_DEPTH) > MAX_ARGUMENT_DEPTH:
        return f"<nested deeper than {MAX_ARGUMENT_DEPTH} levels>"
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__


def close_schema(schema: Any) -> Any:
    """A copy of `schema` where objects that declare `properties` reject undeclared ones."""

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(n) for n in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for key, value in node.items():
            if key == "allOf":
                out[key] = value
            elif key in ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas"):
                out[key] = {k: walk(v) for k, v in value.items()} if isinstance(value, dict) else value
            elif key in ("items", "prefixItems", "anyOf", "oneOf", "not", "if", "then", "else",
                         "additionalItems", "contains"):
                out[key] = walk(value)
            else:
                out[key] = value
        if "properties" in out and "additionalProperties" not in out and "unevaluatedProperties" not in out:
            out["additionalProperties"] = False
        return out

    return walk(copy.deepcopy(schema))


def _path(error: ValidationError) -> str:
    text = "arguments"
    for part in error.absolute_path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def _types_of(error: ValidationError) -> list[str] | None:
    """The accepted types when every alternative of an anyOf/oneOf failed on type alone."""
    if not error.context or any(e.validator != "type" for e in error.context):
        return None
    types: list[str] = []
    for e in error.context:
        vals = e.validator_value if isinstance(e.validator_value, list) else [e.validator_value]
        types.extend(t for t in vals if t not in types)
    return types


def _issues_from_errors(errors: list[ValidationError]) -> list[ValidationIssue]:
    issues: list[ValidationIssue] = []
    seen_required: set[str] = set()
    for error in sorted(errors, key=lambda e: (list(map(str, e.absolute_path)), str(e.validator))):
        path = _path(error)
        kind = error.validator
        if kind == "required":
            if path in seen_required or not isinstance(error.instance, Mapping):
                continue
            seen_required.add(path)
            props = error.schema.get("properties", {}) if isinstance(error.schema, Mapping) else {}
            for name in error.validator_value:
                if name not in error.instance:
                    sub = props.get(name, {})
                    issues.append(ValidationIssue(
                        f"{path}.{name}", MISSING_REQUIRED, describe_type(sub), None,
                        f"required argument {name!r} ({describe_type(sub)}) is missing"))
        elif kind == "additionalProperties":
            declared = list((error.schema.get("properties") or {}).keys())
            patterns = list((error.schema.get("patternProperties") or {}).keys())
            absent = [d for d in declared if d not in error.instance]
            for key in error.instance:
                if key in declared or any(re.search(p, key) for p in patterns):
                    continue
                issues.append(ValidationIssue(
                    f"{path}.{key}", UNKNOWN_ARGUMENT, absent, error.instance[key],
                    f"argument {key!r} is not declared; declared and not given: "
                    f"{', '.join(absent) or 'none'}"))
        elif kind == "type":
            issues.append(ValidationIssue(path, WRONG_TYPE, error.validator_value, error.instance,
                                          f"expected {error.validator_value}, "
                                          f"got {_json_type(error.instance)} {_short(error.instance)}"))
        elif kind in ("enum", "const"):
            allowed = list(error.validator_value) if kind == "enum" else [error.validator_value]
            issues.append(ValidationIssue(path, ENUM_MISMATCH, allowed, error.instance,
                                          f"{_short(error.instance)} is not one of {_short(allowed, 200)}"))
        elif kind in ("anyOf", "oneOf") and _types_of(error) is not None:
            types = _types_of(error)
            issues.append(ValidationIssue(path, WRONG_TYPE, types, error.instance,
                                          f"expected {types}, got {_json_type(error.instance)} "
                                          f"{_short(error.instance)}"))
        else:
            issues.append(ValidationIssue(path, CONSTRAINT, {kind: error.validator_value}, error.instance,
                                          error.message[:300]))
    return issues


def describe_type(schema: Any) -> str:
    """A short type string for a property schema: `string`, `integer|null`, `array<string>`, `object`."""
    if not isinstance(schema, Mapping):
        return "any"
    t = schema.get("type")
    if isinstance(t, list):
        base = "|".join(map(str, t))
    elif t is not None:
        base = str(t)
    elif "anyOf" in schema or "oneOf" in schema:
        base = "|".join(describe_type(s) for s in schema.get("anyOf", schema.get("oneOf", [])))
    elif "enum" in schema:
        base = "enum"
    else:
        base = "any"
    if base == "array" and isinstance(schema.get("items"), Mapping):
        base = f"array<{describe_type(schema['items'])}>"
    return base


class CallValidator:
    """Validators for every declaration of a snapshot, built once and reused across calls."""

    def __init__(self, snapshot: ContractSnapshot, config: ValidatorConfig | None = None) -> None:
        self.snapshot = snapshot
        self.config = config or ValidatorConfig()
        self._ignored = frozenset(code for code, on in ((WRONG_TYPE, self.config.check_types),
                                                        (ENUM_MISMATCH, self.config.check_enums)) if not on)
        self._validators: list[tuple[Tool, Draft202012Validator | str]] = []
        for tool in snapshot.tools:
            problem = schema_problem(tool.parameters)
            if problem is not None:
                self._validators.append((tool, problem))
                continue
            schema = dict(tool.parameters)
            if self.config.strict_unknown:
                schema = close_schema(schema)
            self._validators.append((tool, Draft202012Validator(schema, registry=OFFLINE_REGISTRY)))

    def _check(self, tool: Tool, validator: Draft202012Validator | str, arguments: Mapping[str, Any]
               ) -> tuple[ValidationIssue, ...]:
        if isinstance(validator, str):
            return (ValidationIssue("arguments", CONTRACT_ERROR, None, None,
                                    f"the contract's schema for {tool.name!r} cannot be checked: "
                                    f"{validator}"),)
        if nesting_depth(arguments, MAX_ARGUMENT_DEPTH) > MAX_ARGUMENT_DEPTH:
            return (ValidationIssue("arguments", CONSTRAINT, {"max_depth": MAX_ARGUMENT_DEPTH}, None,
                                    f"arguments nest deeper than {MAX_ARGUMENT_DEPTH} levels"),)
        try:
            errors = list(validator.iter_errors(dict(arguments)))
        except (Unresolvable, RecursionError) as e:
            return (ValidationIssue("arguments", CONTRACT_ERROR, None, None,
                                    f"the contract's schema for {tool.name!r} cannot be checked: "
                                    f"{type(e).__name__}"),)
        return tuple(i for i in _issues_from_errors(errors) if i.code not in self._ignored)

    def validate(self, call: Call) -> ValidationReport:
        """The report on `call` (never raises on a malformed call: that is what reports are for)."""
        version = self.snapshot.version
        if not isinstance(call.name, str) or not call.name.strip():
            return ValidationReport(call, version, None, (ValidationIssue(
                "name", MISSING_NAME, list(self.snapshot.names), call.name, "the call names no tool"),))
        candidates = [(t, v) for t, v in self._validators if t.name == call.name]
        if not candidates:
            return ValidationReport(call, version, None, (ValidationIssue(
                "name", UNKNOWN_TOOL, list(self.snapshot.names), call.name,
                f"tool {call.name!r} is not in the authorized contract (version {version})"),))
        if not isinstance(call.arguments, Mapping):
            return ValidationReport(call, version, call.name, (ValidationIssue(
                "arguments", ARGUMENTS_NOT_OBJECT, "object", call.arguments,
                f"arguments must be a JSON object, got {_json_type(call.arguments)} "
                f"{_short(call.arguments)}"),))
        best: tuple[ValidationIssue, ...] | None = None
        for tool, validator in candidates:
            issues = self._check(tool, validator, call.arguments)
            if not issues:
                return ValidationReport(call, version, tool.name, ())
            if best is None or len(issues) < len(best):
                best = issues
        return ValidationReport(call, version, call.name, best or ())


def validate_call(call: Call, snapshot: ContractSnapshot,
                  config: ValidatorConfig | None = None) -> ValidationReport:
    """One-off validation (build a `CallValidator` to check many calls against one snapshot)."""
    return CallValidator(snapshot, config).validate(call)
