"""What every call format provides: prompt rendering, target rendering, parsing, decisions.

A call format is the textual protocol by which a policy emits tool calls (JSON in tags, ReAct
lines, ...). The action reader (`cipr.method.actions`) needs to know, for a response text, where the
policy made each decision, which text `o` opens a call there, and which text closes a tool name,
so that it can score every declared name after `o` in one forward pass.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cipr.formats.json_calls import to_plain
from cipr.tools.interface import Call, Interface, Message


@dataclass(frozen=True)
class ParseResult:
    """Calls parsed out of generated text. Never raised: `error` says what was wrong, if anything.

    `ok` is False when the text does not follow the format (missing/duplicated tags, invalid JSON,
    a call without a name, ...). `calls` holds what could be parsed even then (possibly nothing).
    `response` is the text answer, if the format has one; `think` the reasoning, if any.
    """

    calls: tuple[Call, ...] = ()
    ok: bool = True
    error: str | None = None
    response: str | None = None
    think: str | None = None


@dataclass(frozen=True)
class Decision:
    """A position in a response where the policy either opens a tool call or ends its turn without one.

    - `start`: character offset in the response where the decision's text begins (the text before it
      is the y_<t the action distribution conditions on).
    - `opener`: the text `o` that opens a call at this position and precedes the tool name.
    - `name_suffix`: the text right after a tool name that closes it (so names that are prefixes of
      each other are told apart), e.g. `"` for JSON, a newline for RoTBench ReAct, `[` for WebShop.
    - `taken`: the tool name called at this decision, or None when the response ends the turn here.
    """

    start: int
    opener: str
    name_suffix: str
    taken: str | None


class CallFormat(ABC):
    """A pluggable call format. Subclasses are registered in `cipr.formats.FORMATS` by `name`."""

    name: str = ""

    @abstractmethod
    def chat(self, messages: Sequence[Message], interface: Interface, *,
             native_tools: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """Chat-template input: (messages as dicts, `tools=` argument or None). With `native_tools` the
        interface goes through the template's `tools=` (OpenAI format), else into the system prompt."""

    def render_prompt(self, tokenizer: Any, messages: Sequence[Message], interface: Interface) -> str:
        """The full prompt text, ending with the generation prompt of the assistant turn."""
        native = supports_native_tools(tokenizer)
        chat, tools = self.chat(messages, interface, native_tools=native and self.uses_native_tools)
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
        if tools is not None:
            kwargs["tools"] = tools
        return tokenizer.apply_chat_template(chat, **kwargs)

    uses_native_tools: bool = False

    @abstractmethod
    def render_target(self, calls: Sequence[Call], *, response: str | None = None,
                      think: str | None = None) -> str:
        """The assistant text that makes `calls` (or answers with `response` when there are none)."""

    @abstractmethod
    def parse(self, text: str) -> ParseResult:
        """Calls out of generated text; never raises."""

    @abstractmethod
    def decisions(self, text: str) -> list[Decision]:
        """Every decision in a response text, in order."""

    def name_text(self, name: str) -> str:
        """How `name` is written between a decision's `opener` and `name_suffix` (the action reader scores
        `opener + name_text(name) + name_suffix`): JSON formats escape it (`a"b` is `a\\"b`); verbatim formats
        keep the default."""
        return name


@dataclass(frozen=True)
class TemplateFormat(CallFormat):
    """A format that follows a model's own chat template: the tools go only through the template's `tools=`.

    `end_decision`: whether the end of the turn after the last call is a ∅ decision. A subclass names the
    TRL templates of its family (`templates`, for the error on a template without tools) and gives the
    messages as that template takes them (`template_messages`).
    """

    end_decision: bool = True

    uses_native_tools = True
    templates = ""

    def chat(self, messages: Sequence[Message], interface: Interface, *,
             native_tools: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        if not native_tools:
            raise ValueError(f"call format {self.name!r} writes the tools only through the chat template's "
                             "`tools=`, which is off here: the tokenizer's template takes none (use the "
                             f"model's own, model.chat_template={self.templates}), or an OpenAI server is "
                             "asked without them (openai.native_tools=true); else pick another call format")
        return self.template_messages(messages), (interface.to_openai() if len(interface) else None)

    @abstractmethod
    def template_messages(self, messages: Sequence[Message]) -> list[dict[str, Any]]:
        """The conversation as the family's chat template takes it (OpenAI-format messages)."""


def native_message(m: Message) -> dict[str, Any]:
    """A message as a chat template's `messages` entry: calls as OpenAI `tool_calls`, arguments objects."""
    d: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.calls:
        d["tool_calls"] = [{"type": "function",
                            "function": {"name": c.name, "arguments": to_plain(c.arguments)}}
                           for c in m.calls]
    if m.name is not None:
        d["name"] = m.name
    return d


def supports_native_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders a `tools=` argument."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(template.values())
    return "tools" in template
