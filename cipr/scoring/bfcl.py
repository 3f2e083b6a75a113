"""BFCL AST matching as pure functions, with the paper's fix, returning an error class.

`score_bfcl(predicted_calls, example)` decides whether predicted calls answer a BFCL item, following the
released checker (`bfcl_eval/eval_checker/ast_eval/ast_checker.py`, bfcl-eval 2026.3.23):

- the predicted calls must match the reference calls one to one, in any order (single, multiple, parallel and
  parallel-multiple items alike);
- a call matches a reference call when it has its tool name, passes every argument the tool requires, no
  argument outside the accepted-values lists and every listed argument whose list lacks `""` (the mark of an
  optional one), and each value has the declared type and is one of the accepted values;
- types per language: Python values must have the Python type of the declared type exactly (`bool` is not
  `int`; an `int` passes for `float`; `any` means a string; array elements checked one level deep); Java and
  JavaScript values are source literals in strings, read with BFCL's converters
  (`cipr.scoring.bfcl_literals`); a value whose type matches the accepted values' type instead is a variable
  name and must equal an accepted value exactly;
- strings compare after BFCL's normalization (spaces and `,./-_*^` removed, lower case, `'` -> `"`), also
  inside lists and dict values; dict arguments check every key against its own accepted list (one level),
  lists of dicts element by element.

Schemas come from `example.interface` (`cipr.tools.schema`; BFCL's type name in `x-bfcl-type`, else the JSON
Schema type is read), accepted values from `example.accepted`, the language from `example.meta["language"]`,
so scoring still works after a perturbation renames or reorders tools and arguments.

Deliberate differences from the released checker (each listed by item in
tests/test_bfcl_checker_agreement.py):

1. The paper's fix (`any_declaration=True`): a reference call is validated against the tool it names (the
   released checker uses the first declared tool for single-call items), and a call is accepted when *any*
   declaration of that name permits it (a perturbation may add a corrupted same-name duplicate). When none
   does, the first declaration's error is reported.
2. The accepted-values lists are authoritative where BFCL's data contradicts its schemas, so every reference
   answer is accepted: an argument they name that no declaration declares is checked by value only, and a
   schema-required argument the reference does not list is not required.
3. An empty accepted-values list accepts only the empty list (two live_simple items list `[]` where the empty
   array was meant).
4. A dict entry's accepted values that are not a list are one accepted value (BFCL iterates the characters of
   such a string).
5. Elements of a Java collection of `any` are read as Java values (`bfcl_literals`).
6. Parallel calls are matched by maximum bipartite matching; the released checker matches greedily and can
   miss a valid assignment.

Error classes: no_call, wrong_count, wrong_name, missing_argument, extra_argument, wrong_type, wrong_value,
parse_failure (passed in by the caller: a `ParseResult` that is not ok, or `parse_error=`). An Example without
reference calls is answered correctly by no call. Examples of other sources (`accepted` None) accept exactly
the reference values, or any of `alternatives`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cipr.core.errors import DataError
from cipr.formats.base import ParseResult
from cipr.scoring.bfcl_literals import JAVA_TYPES, JS_TYPES, NESTED_TYPES, read_java, read_js
from cipr.tools.interface import Call, Example, Tool

ERROR_CLASSES = ("no_call", "wrong_count", "wrong_name", "missing_argument", "extra_argument", "wrong_type",
                 "wrong_value", "parse_failure")

PYTHON_TYPES: dict[str, type] = {"string": str, "integer": int, "float": float, "boolean": bool,
                                 "array": list, "tuple": list, "dict": dict, "any": str}
_TYPES = {"python": PYTHON_TYPES, "java": JAVA_TYPES, "javascript": JS_TYPES}
# The BFCL type a schema without a (known) x-bfcl-type gets from its JSON Schema type, per language.
_FROM_JSON = {
    "python": {"string": "string", "integer": "integer", "number": "float", "boolean": "boolean",
               "array": "array", "object": "dict"},
    "java": {"string": "String", "integer": "long", "number": "double", "boolean": "boolean",
             "array": "ArrayList", "object": "HashMap"},
    "javascript": {"string": "String", "integer": "integer", "number": "float", "boolean": "Boolean",
                   "array": "array", "object": "dict"},
}
_PY_NESTED = ("array", "tuple")


@dataclass(frozen=True)
class BfclVerdict:
    """Whether the calls answer the item; if not, the error class (one of ERROR_CLASSES) and why."""

    correct: bool
    error: str | None = None
    detail: str = ""


_Error = tuple[str, str]  # (error class, detail)


def score_bfcl(predicted_calls: Sequence[Call] | ParseResult, example: Example, *,
               parse_error: str | None = None, any_declaration: bool = True,
               nested_any_values: bool = True) -> BfclVerdict:
    """The verdict on `predicted_calls` for a BFCL-style example (module docstring). `any_declaration=False`
    validates against the first declaration of the reference's tool name only, as the released checker does
    for multiple-tool items (differences 2-6 still apply); `nested_any_values=False` reads Java collections of
    `any` as the released checker does."""
    if isinstance(predicted_calls, ParseResult):
        if not predicted_calls.ok:
            return BfclVerdict(False, "parse_failure", predicted_calls.error or "the response does not parse")
        predicted_calls = predicted_calls.calls
    if parse_error is not None:
        return BfclVerdict(False, "parse_failure", parse_error)
    calls = tuple(predicted_calls)
    language = str(example.meta.get("language", "python"))
    if language not in _TYPES:
        raise DataError(f"unknown language {language!r}", item=example.id, field="meta.language")
    answers = _answers(example)
    if not answers[0]:
        if calls:
            return BfclVerdict(False, "wrong_count", f"expected no call, got {len(calls)}")
        return BfclVerdict(True, None, "no call, as expected")
    if not calls:
        return BfclVerdict(False, "no_call", f"expected {len(answers[0])} call(s), got none")
    if len(calls) != len(answers[0]):
        return BfclVerdict(False, "wrong_count", f"expected {len(answers[0])} call(s), got {len(calls)}")
    first: _Error | None = None
    for answer in answers:
        err = _match_all(calls, answer, example, language, any_declaration, nested_any_values)
        if err is None:
            return BfclVerdict(True, None, "all calls match")
        first = first or err
    assert first is not None
    return BfclVerdict(False, first[0], first[1])


def _answers(example: Example) -> list[list[tuple[str, Mapping[str, Sequence[Any]]]]]:
    """The accepted answers: the reference with its accepted lists, then each alternative (exact values)."""
    def exact(calls: Sequence[Call]) -> list[tuple[str, Mapping[str, Sequence[Any]]]]:
        return [(c.name, {k: (v,) for k, v in c.arguments.items()}) for c in calls]

    if example.accepted is None:
        main = exact(example.reference)
    else:
        if len(example.accepted) != len(example.reference):
            raise DataError(f"{len(example.accepted)} accepted-values maps for {len(example.reference)} "
                            "reference calls", item=example.id, field="accepted")
        main = [(c.name, acc) for c, acc in zip(example.reference, example.accepted, strict=True)]
    return [main] + [exact(alt) for alt in example.alternatives]


def _match_all(calls: Sequence[Call], answer: Sequence[tuple[str, Mapping[str, Sequence[Any]]]],
               example: Example, language: str, any_declaration: bool,
               nested_any_values: bool) -> _Error | None:
    """None if the calls match the answer one to one (any order); else the error of an unmatched call."""
    errors: list[list[_Error | None]] = []
    tools_of: list[Sequence[Tool]] = []
    for name, accepted in answer:
        tools = example.interface.declarations(name)
        if not tools:
            raise DataError(f"the reference calls {name!r}, which the interface does not declare",
                            item=example.id, field="reference")
        tools_of.append(tools if any_declaration else tools[:1])
        untyped = frozenset(a for a in accepted if not any(a in t.properties for t in tools))
        errors.append([_check_declarations(c, name, accepted, tools_of[-1], language, nested_any_values,
                                           untyped) for c in calls])
    match = _max_matching([[e is None for e in row] for row in errors])
    if all(m is not None for m in match):
        return None
    # Attribute the failure: the first predicted call left unmatched, against the reference call it
    # fails that it is closest to (same name, most arguments with an accepted value). In a maximum
    # matching a free call fails at least the reference calls left unmatched.
    used = {m for m in match if m is not None}
    j = next(j for j in range(len(calls)) if j not in used)
    failed = [i for i in range(len(answer)) if errors[i][j] is not None]
    i = max(failed, key=lambda i: (calls[j].name == answer[i][0],
                                   _closeness(calls[j], answer[i][1], tools_of[i], language), -i))
    err = errors[i][j]
    assert err is not None
    where = f"reference call {i} ({answer[i][0]})" + (f", predicted call {j}" if len(calls) > 1 else "")
    return err[0], f"{where}: {err[1]}"


def _closeness(call: Call, accepted: Mapping[str, Sequence[Any]], tools: Sequence[Tool],
               language: str) -> int:
    """How many of the call's arguments have an accepted value (which reference a wrong call missed)."""
    props = tools[0].properties
    return sum(1 for arg, value in call.arguments.items()
               if arg in accepted and check_value(arg, value, tuple(accepted[arg]), props.get(arg),
                                                  language) is None)


def _max_matching(ok: list[list[bool]]) -> list[int | None]:
    """For each row, its column in a maximum bipartite matching (Kuhn's augmenting paths), or None."""
    n_cols = len(ok[0]) if ok else 0
    col_of_row: list[int | None] = [None] * len(ok)
    row_of_col: list[int | None] = [None] * n_cols

    def augment(r: int, seen: set[int]) -> bool:
        for c in range(n_cols):
            if ok[r][c] and c not in seen:
                seen.add(c)
                if row_of_col[c] is None or augment(row_of_col[c], seen):  # type: ignore[arg-type]
                    row_of_col[c], col_of_row[r] = r, c
                    return True
        return False

    for r in range(len(ok)):
        augment(r, set())
    return col_of_row


def _check_declarations(call: Call, name: str, accepted: Mapping[str, Sequence[Any]], tools: Sequence[Tool],
                        language: str, nested_any_values: bool, untyped: frozenset[str]) -> _Error | None:
    first: _Error | None = None
    for tool in tools:
        err = check_call(call, name, accepted, tool, language, nested_any_values=nested_any_values,
                         untyped=untyped)
        if err is None:
            return None
        first = first or err
    return first


def check_call(call: Call, name: str, accepted: Mapping[str, Sequence[Any]], tool: Tool | None,
               language: str = "python", *, nested_any_values: bool = True,
               untyped: Collection[str] | None = None) -> _Error | None:
    """None if `call` matches one reference call (`name`, its accepted lists) under `tool`'s schema.

    Checks run in the released checker's order, so the first error found is the one it reports: name, required
    arguments, each passed argument (known? type? value?), then listed arguments that are not optional.
    `untyped`: listed arguments checked by value only although `tool` does not declare them (default: those;
    `score_bfcl` passes those no declaration of the name declares, so a same-name duplicate stays strict).
    """
    if call.name != name:
        return "wrong_name", f"called {call.name!r}, expected {name!r}"
    props: Mapping[str, Any] = tool.properties if tool is not None else {}
    args = call.arguments
    for req in (tool.required if tool is not None else ()):
        if req in accepted and req not in args:
            return "missing_argument", f"missing required argument {req!r}"
    if untyped is None:
        untyped = [a for a in accepted if a not in props]
    for arg, value in args.items():
        if arg not in accepted or (arg not in props and arg not in untyped):
            return "extra_argument", f"unexpected argument {arg!r}"
        err = check_value(arg, value, tuple(accepted[arg]), props.get(arg), language,
                          nested_any_values=nested_any_values)
        if err is not None:
            return err
    for arg, options in accepted.items():
        if arg not in args and "" not in options:
            return ("missing_argument",
                    f"missing argument {arg!r} (no optional marker among its accepted values)")
    return None


def bfcl_type(schema: Mapping[str, Any] | None, language: str) -> str | None:
    """The BFCL type name the checker uses for a (normalized) parameter schema; None: unconstrained."""
    if not isinstance(schema, Mapping):
        return None
    name = schema.get("x-bfcl-type")
    if isinstance(name, str) and name in _TYPES[language]:
        return name
    json_type = schema.get("type")
    if json_type is None:
        return "any" if name is not None else None
    return _FROM_JSON[language].get(json_type) if isinstance(json_type, str) else None


def check_value(arg: str, value: Any, accepted: tuple[Any, ...], schema: Mapping[str, Any] | None,
                language: str = "python", *, nested_any_values: bool = True) -> _Error | None:
    """None if `value` (as passed in the call) is an accepted value of argument `arg` of this schema."""
    declared = bfcl_type(schema, language)
    if declared is None:
        return _untyped_value(arg, value, accepted)
    table = _TYPES[language]
    nested = None
    if declared in NESTED_TYPES or (language == "python" and declared in _PY_NESTED):
        nested = bfcl_type((schema or {}).get("items"), language)
    expected = table[declared]
    nested_expected = table.get(nested) if nested is not None else None
    if language == "java" and nested == "any" and nested_any_values:
        nested_expected = None  # elements are Java values of any type (difference 5)
    if language != "python":
        if not isinstance(value, str):
            return "wrong_type", (f"argument {arg!r}: expected {language} source text of type {declared}, "
                                  f"got {type(value).__name__} {value!r}")
        try:
            if language == "java":
                value = read_java(value, declared, nested, nested_any_values=nested_any_values)
            else:
                value = read_js(value, declared, nested)
        except ValueError as e:
            return "wrong_type", f"argument {arg!r}: {e}"
    if declared == "tuple" and type(value) is tuple:
        value = list(value)
    if language == "python" and declared == "float" and type(value) is int:
        value = float(value)
    ok, is_variable = _type_check(value, accepted, expected, nested_expected if accepted else None)
    if not ok:
        return ("wrong_type",
                f"argument {arg!r}: expected type {declared}, got {type(value).__name__} {value!r}")
    if not accepted:
        return _empty_accepted(arg, value)
    if not is_variable:
        if expected is dict:
            return _dict_value(arg, value, accepted)
        if expected is list and nested_expected is dict:
            return _list_dict_value(arg, value, accepted)
        if expected is str:
            return _string_value(arg, value, accepted)
        if expected is list:
            return _list_value(arg, value, accepted)
    if value not in accepted:
        return "wrong_value", f"argument {arg!r}: {value!r} is not among {list(accepted)!r}"
    return None


def _empty_accepted(arg: str, value: Any) -> _Error | None:
    """An empty accepted-values list accepts only the empty list (difference 3 in the module docstring)."""
    return None if value == [] else ("wrong_value", f"argument {arg!r}: {value!r}, expected []")


def _untyped_value(arg: str, value: Any, accepted: tuple[Any, ...]) -> _Error | None:
    """An argument without a known type (undeclared, or a schema without a type): compare values only."""
    if not accepted:
        return _empty_accepted(arg, value)
    if isinstance(value, str):
        return _string_value(arg, value, accepted)
    if isinstance(value, list):
        return _list_value(arg, value, accepted)
    if isinstance(value, dict):
        return _dict_value(arg, value, accepted)
    if value not in accepted:
        return "wrong_value", f"argument {arg!r}: {value!r} is not among {list(accepted)!r}"
    return None


def _answer_type(accepted: Sequence[Any]) -> type | None:
    for a in accepted:
        if a != "":
            return type(a)
    return None


def _type_check(value: Any, accepted: Sequence[Any], expected: type,
                nested: type | None) -> tuple[bool, bool]:
    """(type ok, is a variable name) as BFCL's `type_checker`: exact types, one level into lists. A value of
    another type than the declared one but of the accepted values' is a variable (BFCL writes variable names
    as strings among them)."""
    answer_type = _answer_type(accepted)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return True, is_variable
        for option in accepted:
            if type(option) is list and not all(_type_check(v, option, nested, None)[0] for v in value):
                continue
            return True, is_variable
        return False, is_variable
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, is_variable


_STANDARDIZE = re.compile(r"[ \,\.\/\-\_\*\^]")


def standardize(text: str) -> str:
    """BFCL's string normalization: drop spaces and `,./-_*^`, lower case, single to double quotes."""
    return _STANDARDIZE.sub("", text).lower().replace("'", '"')


def _std(x: Any) -> Any:
    return standardize(x) if type(x) is str else x


def _string_value(arg: str, value: str, accepted: Sequence[Any]) -> _Error | None:
    if standardize(value) in [standardize(a) for a in accepted if type(a) is str]:
        return None
    return "wrong_value", f"argument {arg!r}: {value!r} is not among {list(accepted)!r} (after normalization)"


def _list_value(arg: str, value: list[Any], accepted: Sequence[Any]) -> _Error | None:
    options = [[_std(x) for x in option] for option in accepted if isinstance(option, (list, tuple, str))]
    if [_std(x) for x in value] in options:
        return None
    return "wrong_value", f"argument {arg!r}: {value!r} is not among {list(accepted)!r} (after normalization)"


def _dict_ok(value: Mapping[str, Any], option: Any) -> str | None:
    """None if the dict matches one accepted dict (its entries' accepted lists); else why not."""
    if not isinstance(option, Mapping):
        return f"{option!r} is not a dict"
    for key, v in value.items():
        if key not in option:
            return f"unexpected key {key!r}"
        choices = option[key] if isinstance(option[key], list) else [option[key]]
        if _std(v) not in [_std(c) for c in choices]:
            return f"key {key!r}: {v!r} is not among {choices!r}"
    for key, choices in option.items():
        choices = choices if isinstance(choices, list) else [choices]
        if key not in value and "" not in choices:
            return f"missing key {key!r}"
    return None


def _dict_value(arg: str, value: Mapping[str, Any], accepted: Sequence[Any]) -> _Error | None:
    why = "no accepted dict"
    for option in accepted:
        if option == "":
            continue
        why = _dict_ok(value, option) or ""
        if not why:
            return None
    return "wrong_value", f"argument {arg!r}: {why}"


def _list_dict_value(arg: str, value: list[Any], accepted: Sequence[Any]) -> _Error | None:
    why = "no accepted list"
    for option in accepted:
        if not isinstance(option, (list, tuple, str)):
            continue
        if len(value) != len(option):
            why = f"{len(value)} dicts, expected {len(option)}"
            continue
        reasons = [_dict_ok(v, o) if isinstance(v, Mapping) else f"{v!r} is not a dict"
                   for v, o in zip(value, option, strict=True)]
        failed = [r for r in reasons if r]
        if not failed:
            return None
        why = failed[0]
    return "wrong_value", f"argument {arg!r}: {why}"
