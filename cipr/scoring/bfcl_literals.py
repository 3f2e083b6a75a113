"""Java and JavaScript argument values as BFCL reads and writes them: source literals in strings.

In BFCL's Java and JavaScript partitions an argument is the *source text* of the value (`"5L"`,
`"new ArrayList<>(Arrays.asList(1, 2))"`, `"[1, 2]"`, `"true"`). `read_java` / `read_js` turn it into a Python
value exactly as the released checker's converters do (bfcl_eval/eval_checker/ast_eval/type_convertor/,
Apache-2.0, ported so the scorer is a pure function of our own code): text without the expected form stays a
string, which the type check reports (or treats as a variable name when the accepted values are strings).

`write_java` / `write_js` write a reference value so that the reader gives it back. Where BFCL's reader keeps
quotes (a Java `String` argument, the `String` elements of a Java `Array`), the writer leaves them out: that
is the form the checker accepts.

One deliberate difference (`nested_any_values`, on by default): the elements of a Java `Array`/`ArrayList` of
`any` are read as Java values (`42`, `true`, `"text"`), where BFCL turns each into its source string; with
BFCL's reading, simple_java_36 and simple_java_65, whose accepted lists hold numbers and booleans there,
cannot be answered correctly at all.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

JAVA_TYPES: dict[str, type] = {
    "byte": int, "short": int, "integer": int, "float": float, "double": float, "long": int, "boolean": bool,
    "char": str, "Array": list, "ArrayList": list, "Set": set, "HashMap": dict, "Hashtable": dict,
    "Queue": list, "Stack": list, "String": str, "any": str,
}
JS_TYPES: dict[str, type] = {
    "String": str, "integer": int, "float": float, "Bigint": int, "Boolean": bool, "dict": dict,
    "array": list, "any": str,
}
# Collection types whose element type BFCL reads from `items`.
NESTED_TYPES = ("Array", "ArrayList", "array")

_INT = re.compile(r"^-?\d+$")
_JAVA_FLOAT = re.compile(r"^-?\d+(\.\d+)?([eE][+-]?\d+)?[fF]$")
_JAVA_DOUBLE = re.compile(r"^-?\d+(\.\d+)?([eE][+-]?\d+)?$")
_JAVA_LONG = re.compile(r"^-?\d+[lL]$")
_JS_FLOAT = re.compile(r"^-?\d+(\.\d+)?$")
_JS_BIGINT = re.compile(r"^-?\d+n$")


# ----------------------------------------------------------------------------------------- Java

def read_java(text: str, java_type: str, nested_type: str | None = None, *,
              nested_any_values: bool = True) -> Any:
    """The value of Java source `text` for a parameter of `java_type` (BFCL's `java_type_converter`)."""
    if java_type in ("byte", "short", "integer"):
        return int(text) if _INT.match(text) else text
    if java_type == "float":
        return float(re.sub(r"[fF]$", "", text)) if _JAVA_FLOAT.match(text) else text
    if java_type == "double":
        return float(text) if _JAVA_DOUBLE.match(text) else text
    if java_type == "long":
        return int(re.sub(r"[lL]$", "", text)) if _JAVA_LONG.match(text) else text
    if java_type == "boolean":
        return text == "true" if text in ("true", "false") else text
    if java_type in ("char", "String", "any"):
        return text  # BFCL's char pattern never matches, so a char stays as written, like a String
    if java_type == "ArrayList":
        return _java_arraylist(text, nested_type, nested_any_values)
    if java_type == "Array":
        return _java_array(text, nested_type, nested_any_values)
    if java_type == "HashMap":
        return _java_hashmap(text)
    raise ValueError(f"Java type {java_type!r} cannot be read")


def _java_element(text: str, nested_type: str | None, nested_any_values: bool) -> Any:
    if nested_type is None or (nested_type == "any" and nested_any_values):
        return java_value(text)
    return read_java(text, nested_type)


def _java_arraylist(text: str, nested_type: str | None, nested_any_values: bool) -> Any:
    m = re.search(r"new\s+ArrayList<\w*>\(Arrays\.asList\((.+?)\)\)", text)
    if m:
        parts = [p.strip() for p in m.group(1).split(",")]
    else:
        m = re.search(r"new\s+ArrayList<\w*>\(\)\s*\{\{\s*(.+?)\s*\}\}", text, re.DOTALL)
        if m:
            parts = [p.strip() for p in re.findall(r"add\((.+?)\)", m.group(1))]
        elif re.search(r"new\s+ArrayList<\w*>\(\)", text):
            return []
        else:
            return text
    if nested_type in ("char", "String"):
        return [p[1:-1] for p in parts]
    return [_java_element(p, nested_type, nested_any_values) for p in parts]


def _java_array(text: str, nested_type: str | None, nested_any_values: bool) -> Any:
    m = re.search(r"new\s+\w+\[\]\s*\{(.*?)\}", text)
    if not m:
        return text
    return [_java_element(p.strip(), nested_type, nested_any_values)
            for p in m.group(1).split(",") if p.strip()]


def _java_hashmap(text: str) -> Any:
    m = re.search(r"new\s+HashMap<.*?>\s*\(\)\s*\{\s*\{?\s*(.*?)\s*\}?\s*\}", text, re.DOTALL)
    if m:
        return {k: java_value(v.strip()) for k, v in re.findall(r"put\(\"(.*?)\",\s*(.*?)\)", m.group(1))}
    if re.search(r"new\s+HashMap<.*?>\s*\(\)", text):
        return {}
    return text


def java_value(text: str) -> Any:
    """A Java literal without a declared type (BFCL's `parse_java_value`)."""
    if text in ("true", "false"):
        return text == "true"
    if text.startswith('"') and text.endswith('"'):
        return text[1:-1]
    if _JAVA_LONG.match(text):
        return int(text[:-1])
    if _JAVA_FLOAT.match(text):
        return float(text[:-1])
    return _number_or_text(text)


def write_java(value: Any, java_type: str, nested_type: str | None = None) -> str:
    """Java source text that `read_java(text, java_type, nested_type)` reads back as `value`; a string for a
    non-string type is a variable name (BFCL's accepted values use them), written as it is."""
    if isinstance(value, str):
        return value
    if java_type in ("Array", "ArrayList") and isinstance(value, list):
        elements = [_java_element_text(v, nested_type, java_type) for v in value]
        if java_type == "Array":
            return f"new {_JAVA_ARRAY_ELEMENT.get(nested_type or 'any', 'Object')}[]{{{', '.join(elements)}}}"
        box = _JAVA_BOXED.get(nested_type or "any", "Object")
        return (f"new ArrayList<{box}>(Arrays.asList({', '.join(elements)}))" if elements
                else "new ArrayList<>()")
    if java_type in ("HashMap", "Hashtable") and isinstance(value, Mapping):
        puts = " ".join(f"put({json.dumps(str(k))}, {java_literal(v)});" for k, v in value.items())
        return f"new HashMap<String, Object>() {{{{ {puts} }}}}" if puts else "new HashMap<>()"
    if java_type == "long" and _is_int(value):
        return f"{value}L"
    if java_type == "float" and _is_number(value):
        return f"{_decimal(value)}f"
    if java_type == "double" and _is_number(value):
        return _decimal(value)
    return java_literal(value)


_JAVA_ARRAY_ELEMENT = {"integer": "int", "long": "long", "short": "short", "byte": "byte", "float": "float",
                       "double": "double", "boolean": "boolean", "char": "char", "String": "String",
                       "any": "Object"}
_JAVA_BOXED = {"integer": "Integer", "long": "Long", "short": "Short", "byte": "Byte", "float": "Float",
               "double": "Double", "boolean": "Boolean", "char": "Character", "String": "String",
               "any": "Object"}


def _java_element_text(value: Any, nested_type: str | None, outer: str) -> str:
    if nested_type == "String" and isinstance(value, str):
        # ArrayList strips the quotes of String elements; Array keeps them, so write them bare there
        return json.dumps(value) if outer == "ArrayList" else value
    if nested_type == "char" and isinstance(value, str):
        return f"'{value}'" if outer == "ArrayList" else value
    if nested_type in (None, "any"):
        return java_literal(value)
    return write_java(value, nested_type)


def java_literal(value: Any) -> str:
    """A Java literal of a plain value: `true`, `42`, `1.5`, `"text"` (what `java_value` reads back)."""
    text = _scalar_literal(value, lambda v: json.dumps(v, ensure_ascii=False))
    if text is None:
        raise ValueError(f"no Java literal for {value!r}")
    return text


# ----------------------------------------------------------------------------------- JavaScript

def read_js(text: str, js_type: str, nested_type: str | None = None) -> Any:
    """The value of JavaScript source `text` for a parameter of `js_type` (BFCL's `js_type_converter`)."""
    if js_type == "String":
        if (text.startswith('"') and text.endswith('"')) or (text.startswith("'") and text.endswith("'")):
            return text[1:-1]
        return text
    if js_type == "integer":
        return int(text) if _INT.match(text) else text
    if js_type == "float":
        return float(text) if _JS_FLOAT.match(text) else text
    if js_type == "Bigint":
        return int(text[:-1]) if _JS_BIGINT.match(text) else text
    if js_type == "Boolean":
        return text == "true" if text in ("true", "false") else text
    if js_type == "any":
        return text
    if js_type == "array":
        return _js_array(text, nested_type)
    if js_type == "dict":
        return _js_dict(text)
    raise ValueError(f"JavaScript type {js_type!r} cannot be read")


_JS_2D = re.compile(r"\[\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\]|\bnew\s+Array\(\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\)")
_JS_1D = re.compile(r"\[(.*?)\]|\bnew\s+Array\((.*?)\)")


def _js_array(text: str, nested_type: str | None) -> Any:
    code = text.strip()
    try:
        m2 = _JS_2D.match(code)
        if m2:
            out = []
            for idx, inner in enumerate(re.findall(r"\[(.*?)\]", m2.group(0))):
                inner = inner.strip()
                if idx == 0 and inner.startswith("["):
                    inner = inner[1:]
                out.append([js_value(e.strip()) for e in inner.split(",")])
            return out
        m = _JS_1D.match(code)
        if not m:
            return code
        body = m.group(1) if m.group(1) is not None else m.group(2)
        body = (body or "").strip()
        parts = body.split(",") if body else []
        if nested_type:
            return [read_js(p.strip(), nested_type, "String") if p.strip()[:1] in ("'", '"')
                    else read_js(p.strip(), nested_type) for p in parts]
        return [js_value(p.strip()) for p in parts]
    except Exception:  # BFCL's converter falls back to the text on any failure, e.g. an unknown element type
        return code


def _js_dict(text: str) -> Any:
    code = text.strip()
    if code == "{}":
        return {}
    m = re.match(r"\{(.*?)\}", code)
    if not m:
        return code
    out: dict[str, Any] = {}
    for key, raw in re.findall(r"([^:]+):\s*(.*?)(?:,\s*(?=[^,]+:)|$)", m.group(1)):
        key, raw = key.strip().strip("'\""), raw.strip()
        if raw.startswith("[") and raw.endswith("]"):
            out[key] = _js_array(raw, None)
        elif raw.startswith("{") and raw.endswith("}"):
            out[key] = _js_dict(raw)
        else:
            out[key] = js_value(raw.strip("'\""))
    return out


def js_value(text: str) -> Any:
    """A JavaScript literal without a declared type (BFCL's `parse_js_value`)."""
    text = text.strip()
    if text in ("true", "false"):
        return text == "true"
    if (text.startswith('"') and text.endswith('"')) or (text.startswith("'") and text.endswith("'")):
        return text[1:-1]
    return _number_or_text(text)


def write_js(value: Any, js_type: str, nested_type: str | None = None) -> str:
    """JavaScript source text that `read_js(text, js_type, nested_type)` reads back as `value`."""
    if js_type == "String" and isinstance(value, str):
        return js_string(value)
    if isinstance(value, str):
        return value  # `any`, or a variable name for a typed parameter
    if js_type == "array" and isinstance(value, list):
        if value and all(isinstance(v, list) for v in value):
            return "[" + ", ".join("[" + ", ".join(js_literal(x) for x in v) + "]" for v in value) + "]"
        return "[" + ", ".join(_js_element_text(v, nested_type) for v in value) + "]"
    if js_type == "dict" and isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_js_member_text(v)}" for k, v in value.items()) + "}"
    if js_type == "Bigint" and _is_int(value):
        return f"{value}n"
    return js_literal(value)


def _js_element_text(value: Any, nested_type: str | None) -> str:
    if nested_type and nested_type not in ("any",) and not isinstance(value, str):
        return write_js(value, nested_type)
    return js_literal(value)


def _js_member_text(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(js_literal(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_js_member_text(v)}" for k, v in value.items()) + "}"
    return js_literal(value)


def js_string(value: str) -> str:
    """A quoted JavaScript string (double quotes unless the text holds one); BFCL strips the quotes as-is."""
    if '"' not in value:
        return f'"{value}"'
    if "'" not in value:
        return f"'{value}'"
    return value


def js_literal(value: Any) -> str:
    """A JavaScript literal of a plain value: `true`, `42`, `1.5`, `"text"`."""
    text = "null" if value is None else _scalar_literal(value, js_string)
    if text is None:
        raise ValueError(f"no JavaScript literal for {value!r}")
    return text


# --------------------------------------------------------------------------------------- shared

def _scalar_literal(value: Any, string: Callable[[str], str]) -> str | None:
    """Java's and JavaScript's shared literal of a bool, int, float or string (`string` quotes); else None."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _decimal(value)
    if isinstance(value, str):
        return string(value)
    return None

def _number_or_text(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _decimal(value: float | int) -> str:
    """A number in plain decimal notation (BFCL's JavaScript float pattern has no exponent)."""
    if isinstance(value, int):
        return str(value)
    text = repr(float(value))
    if "e" in text or "E" in text:
        text = format(float(value), ".17f").rstrip("0")
        text = text + "0" if text.endswith(".") else text
    return text


def write_value(value: Any, language: str, bfcl_type: str, nested_type: str | None = None) -> Any:
    """`value` as a call argument in `language`: unchanged for Python, source text for Java/JavaScript."""
    write = {"java": write_java, "javascript": write_js}.get(language)
    return write(value, bfcl_type, nested_type) if write else value


def read_value(text: Any, language: str, bfcl_type: str, nested_type: str | None = None) -> Any:
    """The inverse of `write_value` for Java/JavaScript source text (BFCL's converters); Python unchanged."""
    read = {"java": read_java, "javascript": read_js}.get(language)
    return read(text, bfcl_type, nested_type) if read else text


__all__: Sequence[str] = (
    "JAVA_TYPES", "JS_TYPES", "NESTED_TYPES", "java_literal", "java_value", "js_literal", "js_string",
    "js_value", "read_java", "read_js", "read_value", "write_java", "write_js", "write_value",
)
