"""A trajectory rendered as one chat text: where the prompt ends, where each assistant turn is, its decisions.

A trajectory trains on all its assistant turns at once (one sequence, as multi-turn SFT), rendered
once by the call format (`CallFormat.chat`) and the chat template; turn k's text starts where the
rendering of messages[:k] with the generation prompt ends. A template that rewrites earlier turns
(Qwen3's reasoning stripping) breaks that prefix property and is refused.

Choices:
- The prompt is the text through the first assistant turn's generation prompt; the response is the
  rest, through the end of the last assistant turn (later user turns are dropped: nothing follows
  them). Observation turns inside the response are context, never trained on.
- A turn's trained text is its content plus the template's end-of-turn token (the template's glue
  after it, a newline in ChatML, is not: the model never generates it).
- A turn's text is what the template writes between the generation prompt and the end-of-turn token
  (with native tool calls that is the template's rendering of the calls, not the message content);
  its decisions are the call format's decisions of that text, shifted to response offsets, so
  formats whose parser stops at an `Observation:` line still find every turn's actions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cipr.formats.base import CallFormat, Decision, supports_native_tools
from cipr.tools.interface import Example


class UnusableTrajectory(ValueError):
    """A trajectory that cannot be trained on; `reason` is a short fixed phrase (for skip counts)."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {detail}")


@dataclass(frozen=True)
class Rendered:
    """One rendering of a trajectory.

    - `text`: prompt + response; `prompt_end`: len(prompt) in chars.
    - `turns`: (start, end) char spans in `text` of each assistant turn's trained text.
    - `decisions`: every decision of every turn, `start` relative to the response.
    - `turn_of`: the turn index of each decision.
    - `tools`: the declared names, in interface order (class i = tool i).
    """

    text: str
    prompt_end: int
    turns: tuple[tuple[int, int], ...]
    decisions: tuple[Decision, ...]
    turn_of: tuple[int, ...]
    tools: tuple[str, ...]

    @property
    def prompt(self) -> str:
        return self.text[:self.prompt_end]

    @property
    def response(self) -> str:
        return self.text[self.prompt_end:]


def _template(tokenizer: Any, chat: list[dict[str, Any]], tools: Any, generation: bool) -> str:
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": generation}
    if tools is not None:
        kwargs["tools"] = tools
    return tokenizer.apply_chat_template(chat, **kwargs)


def render_conversation(example: Example, fmt: CallFormat, tokenizer: Any) -> Rendered:
    """Render `example` with `fmt` and the chat template. UnusableTrajectory without an assistant turn or
    when the template breaks the prefix property; the call format's ValueError for a turn it cannot render."""
    native = supports_native_tools(tokenizer) and fmt.uses_native_tools
    chat, tools = fmt.chat(example.messages, example.interface, native_tools=native)
    assistant = [k for k, m in enumerate(chat) if m["role"] == "assistant"]
    if not assistant:
        raise UnusableTrajectory("no assistant turn", f"trajectory {example.id} has nothing to learn from")
    chat = chat[:assistant[-1] + 1]
    text = _template(tokenizer, chat, tools, False)
    eos = getattr(tokenizer, "eos_token", None) or ""
    spans: list[tuple[int, int]] = []
    decisions: list[Decision] = []
    turn_of: list[int] = []
    prompt_end = None
    for t, k in enumerate(assistant):
        head = _template(tokenizer, chat[:k], tools, True)
        upto = _template(tokenizer, chat[:k + 1], tools, False)
        if not (text.startswith(head) and text.startswith(upto) and len(head) <= len(upto)):
            raise UnusableTrajectory("chat template rewrites earlier turns",
                                     f"trajectory {example.id}: turn {t} is not rendered as a prefix of the "
                                     f"conversation, so the turns cannot be located")
        start = len(head)
        end = len(upto.rstrip())
        if eos and eos in text[start:end]:
            end = text.index(eos, start)
        turn = text[start:end]
        if not turn.strip():
            raise UnusableTrajectory("empty assistant turn",
                                     f"trajectory {example.id}: turn {t} renders as no text")
        if prompt_end is None:
            prompt_end = start
        closed = bool(eos) and text.startswith(eos, end)  # the end-of-turn token is trained on too
        spans.append((start, end + len(eos) if closed else end))
        for d in fmt.decisions(turn):
            decisions.append(Decision(d.start + start - prompt_end, d.opener, d.name_suffix, d.taken))
            turn_of.append(t)
    assert prompt_end is not None
    return Rendered(text[:spans[-1][1]], prompt_end, tuple(spans), tuple(decisions), tuple(turn_of),
                    example.interface.names)


@dataclass(frozen=True)
class Tokenized:
    """Token ids of a rendering and each token's (start, end) char span in `Rendered.text`.

    Prompt and response are tokenized separately, no special tokens added, as the action reader does, so
    its decision plans and these ids index the same sequence; `prompt_len`: prompt tokens.
    """

    ids: tuple[int, ...]
    offsets: tuple[tuple[int, int], ...]
    prompt_len: int


def tokenize_rendered(tokenizer: Any, rendered: Rendered) -> Tokenized:
    """Ids and char spans of `rendered` (needs a fast tokenizer for the offsets)."""
    if not getattr(tokenizer, "is_fast", False):
        raise TypeError("self-distillation aligns tokens by their character offsets, which needs a fast "
                        "tokenizer")
    enc = tokenizer([rendered.prompt, rendered.response], add_special_tokens=False,
                    return_offsets_mapping=True)
    p_ids, r_ids = enc["input_ids"]
    p_off, r_off = enc["offset_mapping"]
    shift = rendered.prompt_end
    offsets = [tuple(o) for o in p_off] + [(a + shift, b + shift) for a, b in r_off]
    return Tokenized(tuple(p_ids) + tuple(r_ids), tuple(offsets), len(p_ids))
