"""What the hand-written parsers and renderers of the call formats share: the `<think>` block a response
may open with (Hermes, ToolRL, Qwen3.5), the scan state that starts with it, skipping whitespace, and
refusing text a parser would read back as structure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

THINK, THINK_END = "<think>", "</think>"


@dataclass(frozen=True)
class LeadingThink:
    """A `<think>` block opening a response (after leading whitespace), as the formats that allow one read it.

    `text`: the stripped reasoning (None when the response does not open with `<think>`); `end`: the
    index just after `</think>` (None without a block or when it is never closed); `error`: the message
    for a block that is never closed (the rest of the response is then its text).
    """

    text: str | None = None
    end: int | None = None
    error: str | None = None


def leading_think(text: str) -> LeadingThink:
    """Read the `<think>` block opening `text`, if any (Hermes and ToolRL responses share this rule)."""
    i = len(text) - len(text.lstrip())
    if not text.startswith(THINK, i):
        return LeadingThink()
    j = text.find(THINK_END, i + len(THINK))
    if j < 0:
        return LeadingThink(text[i + len(THINK):].strip(), None,
                            f"<think> at char {i} is never closed by </think>")
    return LeadingThink(text[i + len(THINK):j].strip(), j + len(THINK_END))


def refuse_tags(text: str, tags: Sequence[str], what: str, fmt: str) -> None:
    """ValueError when `text` (a part of a target being rendered) holds one of `tags`: the `fmt` format's
    parser would read it as structure, so the rendered target could not be parsed back."""
    for tag in tags:
        if tag in text:
            raise ValueError(f"{fmt} format: the {what} text {text[:40]!r} contains {tag!r}, so it could "
                             "not be parsed back")


def skip_space(text: str, i: int) -> int:
    """The first index at or after `i` that is not whitespace (`len(text)` when there is none)."""
    while i < len(text) and text[i].isspace():
        i += 1
    return i


@dataclass
class ThinkScan:
    """What a format's response scan starts with (Hermes, ToolRL): the leading reasoning and the errors."""

    think: str | None = None
    errors: list[str] = field(default_factory=list)

    def read_think(self, text: str) -> LeadingThink:
        """Read the `<think>` block opening `text` into `think` (an unclosed one into `errors`)."""
        found = leading_think(text)
        self.think = found.text
        if found.error is not None:
            self.errors.append(found.error)
        return found

    def answer_start(self, text: str) -> int | None:
        """Read the opening `<think>` block (`read_think`); where the answer starts: after the block and the
        whitespace behind it, 0 without a block, None when the block is never closed."""
        think = self.read_think(text)
        if think.error is not None:
            return None
        return skip_space(text, think.end) if think.end is not None else 0
