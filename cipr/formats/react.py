"""ReAct call formats: RoTBench's `Action: name` + `Action Input: {json}`, and WebShop's `name[argument]`.

RoTBench (name "react"), as in its data:

    Thought: <reasoning, may be empty>
    Action: get_translation_nllb
    Action Input: {"input_text": "See you later", "tgt_lang": "jpn_Jpan"}

WebShop (name "webshop"), the action text of AgentLM's WebShop trajectories:

    Thought: I should search for the product first.
    Action: search[red shoes]

The RoTBench system prompt reproduces RoTBench's byte for byte (its instruction, the tools as a `json.dumps`
list of `{"name", "description", "parameters"}` with ASCII escapes, then "Let's Begin!"; checked on every
First_Turn and Third_Turn file). The WebShop prompt is this project's wording: each declared action as
`name[<argument>]: description`.

Choices the sources leave open, made here:
- One action per turn, as both environments execute: `render_target` refuses several calls; `parse` reports a
  second `Action:` (and returns every action it could read).
- A turn without a call is `Thought: ...\\nFinal Answer: <response>`, the usual ReAct ending (RoTBench's own
  `finish` tool is an ordinary call here).
- WebShop: a call has one argument, its bracket text, as `Call(name, {"argument": text})`; rendering takes the
  single argument under any key (so canonical `arg_01` renders too), parsing returns the key "argument". The
  action is one line: the name runs to the first `[`, the argument to the last `]`. Names may not contain `[`
  or a newline; arguments must be one-line strings (rendering raises otherwise).
- RoTBench's `Action Input` is written with `json.dumps` defaults (ASCII escapes), as most of its gold answers
  are; parsing accepts either and reads exactly one JSON object after the marker.
- Earlier turns: an assistant message with a call renders as a target whose thought is its content, one
  without as a Final Answer; a tool result is a user message `Observation: <result>`. A system message of the
  conversation goes before the format's instruction, with a blank line.
- Markers count only at the start of a line. `parse` reports (never raises) a missing `Thought:`, text before
  it, an `Action:` without a name, an `Action Input` that is missing, not valid JSON (with its position) or
  not an object, text after it, a second `Thought`/`Action`, an `Observation:` (the policy kept writing past
  its turn: ignored from there on), a Final Answer next to an action, and a text with neither. `calls` holds
  the actions valid on their own.

Decisions: one per `Action:` line whose name can be read, at the start of that line, with opener `Action: `
and name suffix a newline (RoTBench) or `[` (WebShop); names are written verbatim. A turn that answers has one
∅ decision at the start of its `Final Answer:` line (same opener). A ReAct turn ends with its action, so no
decision follows it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cipr.formats.base import CallFormat, Decision, ParseResult
from cipr.formats.json_calls import dumps, to_plain
from cipr.tools.interface import Call, Interface, Message

OPENER = "Action: "
ARGUMENT = "argument"
_MARKERS = ("Thought:", "Action Input:", "Action:", "Final Answer:", "Observation:")
_MARKER = re.compile(r"(?m)^(" + "|".join(re.escape(m) for m in _MARKERS) + ")")

ROTBENCH_INSTRUCTION = """You are an expert in using tools to handle real-time queries from users.
First I will give you the task description, and your task start.
At each step, your task is to give your thought to analyze the current state, decide the next step, with a \
function call to actually execute your step.
After the call, you will get the call result, and you are now in a new state.
Then you will analyze your status now, then decide what to do next...
After many (Thought-call) pairs, you finally perform the task, then you can give your final answer.

Desired format:
Thought: <The thought>
Action: <The tool you decide to use>
Action Input: <The parameters for the tool>

Remember:
1. You should ALWAYS think about what to do, but all the thought is short, at most in 3 sentences.
2. The action to take should be one of the given tools below.
3. The "Action Input" needs to provide a dict similar to {parameter_1: value_1, parameter_2: value_2} to \
call action.
4. Always use the "finish" tool upon task completion. The final answer should be comprehensive enough for \
the user. If the task is unmanageable, use the "finish" tool and respond with "I cannot handle the task".

Task description: You should use tools to help handle the real time user queries. Specifically, you have \
access of the following tools:
"""
ROTBENCH_END = "\n\nLet's Begin!"

WEBSHOP_INSTRUCTION = """You are shopping on a web store on behalf of the user.
Every round you see an observation of the current page and answer with exactly one action.
The available actions are:
{actions}
An action is its name followed by its argument in square brackets. An action that is not valid does nothing.
Your response should use the following format:

Thought: I think ...
Action: {example}"""


@dataclass
class _Action:
    start: int
    name: str | None
    call: Call | None = None
    has_input: bool = False
    clean: bool = True


@dataclass
class _Scan:
    think: str | None = None
    actions: list[_Action] = field(default_factory=list)
    final: str | None = None
    final_start: int | None = None
    errors: list[str] = field(default_factory=list)


class _ReAct(CallFormat):
    """What the two ReAct formats share: the Thought/Action/Final Answer scaffold."""

    name_suffix = "\n"
    uses_native_tools = False

    def instruction(self, interface: Interface) -> str:
        raise NotImplementedError

    def _action_text(self, call: Call) -> str:
        """What follows `Action: ` for one call."""
        raise NotImplementedError

    def _read_action(self, content: str, at: int, action: _Action, s: _Scan) -> None:
        """Fill `action` (name, and call if complete) from the text after `Action:`."""
        raise NotImplementedError

    def _read_input(self, content: str, at: int, action: _Action | None, s: _Scan) -> None:
        s.errors.append(f"unexpected 'Action Input:' at char {at} ({self.name} actions carry their argument)")

    def chat(self, messages: Sequence[Message], interface: Interface, *,
             native_tools: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The format's instruction with the tools as the system prompt; earlier turns as ReAct text."""
        extra = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
        system = self.instruction(interface)
        out: list[dict[str, Any]] = [{"role": "system",
                                      "content": f"{extra}\n\n{system}" if extra else system}]
        for m in messages:
            if m.role == "system":
                continue
            if m.role == "user":
                out.append({"role": "user", "content": m.content})
            elif m.role == "assistant":
                text = (self.render_target(m.calls, think=m.content or None) if m.calls
                        else self.render_target((), response=m.content))
                out.append({"role": "assistant", "content": text})
            elif m.role == "tool":
                out.append({"role": "user", "content": f"Observation: {m.content}"})
            else:
                raise ValueError(f"{self.name} format: unsupported message role {m.role!r}")
        return out, None

    def render_target(self, calls: Sequence[Call], *, response: str | None = None,
                      think: str | None = None) -> str:
        """`Thought: ...` then `Action: ...` for the one call, or `Final Answer: ...` without a call."""
        if len(calls) > 1:
            raise ValueError(f"{self.name} format: a ReAct turn holds one action, got {len(calls)} calls")
        if calls and response is not None:
            raise ValueError(f"{self.name} format: a ReAct turn either acts or answers, not both")
        _check_free_text(think or "", "think")
        head = "Thought:" + (f" {think}" if think else "")
        if calls:
            return f"{head}\n{OPENER}{self._action_text(calls[0])}"
        _check_free_text(response or "", "response")
        return f"{head}\nFinal Answer: {response or ''}"

    def _scan(self, text: str) -> _Scan:
        s = _Scan()
        found = list(_MARKER.finditer(text))
        first = found[0].start() if found else len(text)
        if text[:first].strip():
            s.errors.append(f"unexpected text before the first marker: {text[:first].strip()[:60]!r}")
        if not found or found[0].group(1) != "Thought:":
            s.errors.append("missing 'Thought:' at the start")
        for k, m in enumerate(found):
            marker, at = m.group(1), m.start()
            content = text[m.end():found[k + 1].start() if k + 1 < len(found) else len(text)]
            if marker == "Thought:":
                if s.think is None and not s.actions and s.final is None:
                    s.think = content.strip()
                else:
                    s.errors.append(f"second 'Thought:' at char {at} (a turn holds one step)")
            elif marker == "Action:":
                if s.actions:
                    s.errors.append(f"second 'Action:' at char {at} (a ReAct turn holds one action)")
                action = _Action(at, None)
                self._read_action(content, m.end(), action, s)
                s.actions.append(action)
            elif marker == "Action Input:":
                self._read_input(content, m.end(), s.actions[-1] if s.actions else None, s)
            elif marker == "Final Answer:":
                if s.final_start is None:
                    s.final, s.final_start = content.strip(), at
                else:
                    s.errors.append(f"second 'Final Answer:' at char {at}")
            else:
                s.errors.append(f"'Observation:' at char {at}: the text continues past the end of its turn "
                                "(ignored from there on)")
                break
        self._finish(s)
        if s.actions and s.final_start is not None:
            s.errors.append("both an Action and a Final Answer")
        if not s.actions and s.final_start is None:
            s.errors.append("no 'Action:' and no 'Final Answer:' line")
        return s

    def _finish(self, s: _Scan) -> None:
        """Errors that only show once every marker is read."""

    def parse(self, text: str) -> ParseResult:
        s = self._scan(text)
        calls = tuple(a.call for a in s.actions if a.call is not None)
        return ParseResult(calls=calls, ok=not s.errors, error="; ".join(s.errors) or None,
                           response=s.final, think=s.think)

    def decisions(self, text: str) -> list[Decision]:
        s = self._scan(text)
        out = [Decision(a.start, OPENER, self.name_suffix, a.name) for a in s.actions if a.name]
        if not s.actions and s.final_start is not None:
            out.append(Decision(s.final_start, OPENER, self.name_suffix, None))
        return out

    def _check_name(self, name: str, forbidden: str = "") -> None:
        if not name or name != name.strip() or "\n" in name or any(c in name for c in forbidden):
            raise ValueError(f"{self.name} format cannot write the tool name {name!r} (empty, surrounding "
                             f"whitespace, a newline{' or ' + repr(forbidden) if forbidden else ''})")


def _check_free_text(text: str, what: str) -> None:
    m = _MARKER.search(text)
    if m:
        raise ValueError(f"ReAct format: the {what} text has a line starting with {m.group(1)!r}, "
                         "so it could not be parsed back")


@dataclass(frozen=True)
class ReActFormat(_ReAct):
    """RoTBench's ReAct: `Action: <name>` then `Action Input: <JSON object>`."""

    name = "react"
    name_suffix = "\n"

    def instruction(self, interface: Interface) -> str:
        tools = [{"name": t.name, "description": t.description, "parameters": to_plain(t.parameters)}
                 for t in interface]
        return ROTBENCH_INSTRUCTION + json.dumps(tools) + ROTBENCH_END

    def _action_text(self, call: Call) -> str:
        self._check_name(call.name)
        return f"{call.name}\nAction Input: {dumps(call.arguments, ascii=True)}"

    def _read_action(self, content: str, at: int, action: _Action, s: _Scan) -> None:
        name = content.strip()
        if not name:
            s.errors.append(f"'Action:' at char {at} names no tool")
        elif "\n" in name:
            s.errors.append(f"'Action:' at char {at} spans several lines before 'Action Input:'")
            action.name, action.clean = name.split("\n")[0].strip() or None, False
        else:
            action.name = name

    def _read_input(self, content: str, at: int, action: _Action | None, s: _Scan) -> None:
        if action is None or action.has_input:
            s.errors.append(f"'Action Input:' at char {at} without an 'Action:' before it")
            return
        action.has_input = True
        body = content.lstrip()
        start = at + len(content) - len(body)
        try:
            value, end = json.JSONDecoder().raw_decode(body)
        except json.JSONDecodeError as e:
            s.errors.append(f"Action Input at char {start}: invalid JSON at char {start + e.pos}: {e.msg}")
            return
        except RecursionError:
            s.errors.append(f"Action Input at char {start}: JSON nested too deeply")
            return
        if not isinstance(value, dict):
            s.errors.append(f"Action Input at char {start} is a JSON {type(value).__name__}, not an object")
            return
        if body[end:].strip():
            s.errors.append(f"unexpected text after the Action Input at char {start + end}: "
                            f"{body[end:].strip()[:60]!r}")
        if action.name and action.clean:
            action.call = Call(action.name, value)

    def _finish(self, s: _Scan) -> None:
        for a in s.actions:
            if not a.has_input:
                s.errors.append(f"'Action:' at char {a.start} has no 'Action Input:'")


@dataclass(frozen=True)
class WebShopFormat(_ReAct):
    """WebShop's ReAct: `Action: <name>[<argument>]`; the argument is `Call.arguments["argument"]`."""

    name = "webshop"
    name_suffix = "["

    def instruction(self, interface: Interface) -> str:
        lines = []
        for t in interface:
            arg = next(iter(t.properties), None)
            slot = f"<{arg}>" if arg is not None else ""
            lines.append(f"- {t.name}[{slot}]: {t.description}")
        example = f"{interface[0].name}[...]" if len(interface) else "name[argument]"
        return WEBSHOP_INSTRUCTION.format(actions="\n".join(lines), example=example)

    def _action_text(self, call: Call) -> str:
        self._check_name(call.name, "[")
        return f"{call.name}[{_single_argument(call)}]"

    def _read_action(self, content: str, at: int, action: _Action, s: _Scan) -> None:
        body = content.strip()
        if "\n" in body:
            s.errors.append(f"the action at char {at} spans several lines")
            body = body.split("\n")[0].rstrip()
        k = body.find("[")
        if k < 0:
            s.errors.append(f"the action at char {at} has no '[': {body[:60]!r}")
            action.name = body or None
            return
        name = body[:k].strip()
        action.name = name or None
        if not name:
            s.errors.append(f"the action at char {at} names no tool before '['")
        elif not body.endswith("]"):
            s.errors.append(f"the action at char {at} does not end with ']': {body[:60]!r}")
        else:
            action.call = Call(name, {ARGUMENT: body[k + 1:-1]})


def _single_argument(call: Call) -> str:
    args: Mapping[str, Any] = call.arguments
    if len(args) > 1:
        raise ValueError(f"webshop format: an action takes one argument, {call.name!r} got {sorted(args)}")
    value = next(iter(args.values()), "")
    if not isinstance(value, str) or "\n" in value:
        raise ValueError(f"webshop format: the argument of {call.name!r} must be a one-line string, "
                         f"got {value!r}")
    return value


def extract_action(text: str) -> tuple[str, str] | None:
    """(action name, action input text) of a ReAct answer, extracted exactly as RoTBench does.

    Mirrors `get_test_value`/`cf_eval` in RoTBench's `Code/Evaluation/evaluate.py`: the name is the
    text from 8 characters after `Action:` up to `Action Input:`, minus one trailing newline; the
    input is the text from 14 characters after `Action Input:`. None when either marker is missing.
    """
    a, b = text.find("Action:"), text.find("Action Input:")
    if a < 0 or b < 0:
        return None
    name = text[a + 8:b]
    if name.endswith("\n"):
        name = name[:-1]
    return name, text[b + 14:]
