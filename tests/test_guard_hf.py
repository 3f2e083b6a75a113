"""End to end through the transformers backend with the tiny (untrained) model: garbage in, nothing executed."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from cipr.formats.base import CallFormat, Decision, ParseResult
from cipr.formats.toolrl import ToolRLFormat
from cipr.guard import AuditLog, ContractSnapshot, Guard, GuardConfig, HFBackend, read_audit
from cipr.guard.backend import forced_prefix
from cipr.tools.interface import Call, Interface, Message, Tool

WEATHER = Tool("get_weather", "Current weather for a city.", {
    "type": "object", "properties": {"location": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["location", "days"]})
EMAIL = Tool("send_email", "Send an email.", {
    "type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]})
SNAPSHOT = ContractSnapshot.from_tools([WEATHER, EMAIL])
MESSAGES = [Message("user", "Weather in Paris for the next 3 days?")]
BUDGET = 24


class ReactFormat(CallFormat):
    """A minimal ReAct-style format (`Action: name\\nAction Input: {json}`) to test format-agnostic prefixes."""

    name = "react_test"

    def chat(self, messages, interface, *, native_tools=False):
        tools = "\n".join(t.name for t in interface)
        return [{"role": "system", "content": f"Tools:\n{tools}"}] + [m.to_dict() for m in messages], None

    def render_target(self, calls: Sequence[Call], *, response=None, think=None) -> str:
        c = calls[0]
        return f"Thought: go\nAction: {c.name}\nAction Input: {json.dumps(dict(c.arguments))}"

    def parse(self, text: str) -> ParseResult:
        try:
            head, args = text.split("\nAction Input: ", 1)
            return ParseResult((Call(head.split("Action: ", 1)[1].strip(), json.loads(args)),))
        except (ValueError, IndexError) as e:
            return ParseResult((), ok=False, error=str(e))

    def decisions(self, text: str) -> list[Decision]:
        i = text.find("Action: ")
        if i < 0:
            return []
        return [Decision(i, "Action: ", "\n", text[i + 8:].split("\n", 1)[0])]


def test_forced_prefix_follows_the_call_format():
    assert forced_prefix(None, "get_weather") == '{"name": "get_weather", "arguments": '
    assert forced_prefix(None, "required") == '{"name": "'
    assert forced_prefix(None, None) == "" and forced_prefix(ReactFormat(), "auto") == ""
    assert forced_prefix(ReactFormat(), "get_weather") == "Thought: go\nAction: get_weather\n"
    assert forced_prefix(ReactFormat(), "required") == "Thought: go\nAction: "
    toolrl = forced_prefix(ToolRLFormat(), 'we"ird')
    assert toolrl.endswith('<tool_call>\n{"name": "we\\"ird"') and toolrl.startswith("<think>")


@pytest.mark.parametrize("call_format", [None, ToolRLFormat()], ids=["native-json", "toolrl"])
def test_tiny_model_garbage_is_unresolved_never_executed_and_logged(tiny_model, tiny_tokenizer, tmp_path,
                                                                    call_format):
    backend = HFBackend(tiny_model, tiny_tokenizer, call_format)
    log = AuditLog(tmp_path / "audit.jsonl")
    guard = Guard(SNAPSHOT, backend, budget=BUDGET, call_format=call_format, audit=log,
                  config=GuardConfig(require_call=True))
    proposed, usage = backend.generate([m.to_dict() for m in MESSAGES], tools=SNAPSHOT.interface.to_openai(),
                                       max_tokens=BUDGET)
    assert usage.prompt_tokens > 0 and 0 < usage.completion_tokens <= BUDGET
    out = guard.process(MESSAGES, proposed, proposal_usage=usage, item_id="tiny")
    assert out.status == "unresolved" and out.calls == () and not out.executed
    (rec,) = read_audit(tmp_path / "audit.jsonl")
    assert rec["final"]["executed"] is False and rec["original"]["text"] == proposed
    assert rec["steps"], "an invalid or missing call must trigger the candidate retry"
    assert rec["steps"][0]["kind"] == "candidate_retry"
    assert rec["steps"][0]["reply"].startswith(forced_prefix(call_format, "required"))
    for step in rec["steps"]:
        assert 0 < step["usage"]["completion_tokens"] <= BUDGET and step["latency_s"] > 0
    assert rec["tokens"]["total_tokens"] == sum(s["usage"]["total_tokens"] for s in rec["steps"])


def test_tiny_model_repair_is_forced_onto_the_tool(tiny_model, tiny_tokenizer):
    backend = HFBackend(tiny_model, tiny_tokenizer)
    guard = Guard(SNAPSHOT, backend, budget=BUDGET)
    out = guard.process(MESSAGES, [Call("get_weather", {"city": "Paris"})])
    (step,) = out.record.steps
    assert step.kind == "repair" and step.tool_choice == "get_weather"
    assert step.reply.startswith('{"name": "get_weather", "arguments": ')
    assert out.calls == () and out.status == "unresolved"


def test_backend_renders_tools_through_the_format(tiny_model, tiny_tokenizer):
    backend = HFBackend(tiny_model, tiny_tokenizer, ToolRLFormat())
    prompt = backend.render([m.to_dict() for m in MESSAGES], Interface([WEATHER]).to_openai())
    assert "1. Name: get_weather" in prompt and "Weather in Paris" in prompt


def test_batched_generation_matches_one_by_one(tiny_model, tiny_tokenizer):
    backend = HFBackend(tiny_model, tiny_tokenizer, batch_size=2)
    requests = [([{"role": "user", "content": q}], tools) for q, tools in
                [("Weather in Paris?", SNAPSHOT.interface.to_openai()), ("Hi", None),
                 ("Email bob a long note about the weather tomorrow in Rome", [EMAIL.to_openai()])]]
    batched = backend.generate_batch(requests, max_tokens=6)
    single = [backend.generate(m, tools=t, max_tokens=6) for m, t in requests]
    assert [t for t, _ in batched] == [t for t, _ in single]
    assert [u for _, u in batched] == [u for _, u in single]  # padding is not counted as prompt tokens
