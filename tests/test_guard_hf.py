"""End to end through the transformers backend with the tiny (untrained) model: garbage in, nothing
executed."""

from __future__ import annotations

import pytest

from cipr.formats.toolrl import ToolRLFormat
from cipr.guard import AuditLog, ContractSnapshot, Guard, GuardConfig, HFBackend, read_audit
from cipr.guard.backend import ask
from cipr.runtime.backends import GenRequest, chat_example, forced_prefix
from cipr.tools.interface import Call, Interface, Message, Tool

WEATHER = Tool("get_weather", "Current weather for a city.", {
    "type": "object", "properties": {"location": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["location", "days"]})
EMAIL = Tool("send_email", "Send an email.", {
    "type": "object", "properties": {"to": {"type": "string"}}, "required": ["to"]})
SNAPSHOT = ContractSnapshot.from_tools([WEATHER, EMAIL])
MESSAGES = [Message("user", "Weather in Paris for the next 3 days?")]
BUDGET = 24


@pytest.mark.parametrize("call_format", [None, ToolRLFormat()], ids=["native-json", "toolrl"])
def test_tiny_model_garbage_is_unresolved_never_executed_and_logged(tiny_model, tiny_tokenizer, tmp_path,
                                                                    call_format):
    backend = HFBackend(tiny_model, tiny_tokenizer, call_format)
    log = AuditLog(tmp_path / "audit.jsonl")
    guard = Guard(SNAPSHOT, backend, budget=BUDGET, call_format=call_format, audit=log,
                  config=GuardConfig(require_call=True))
    proposed, usage = ask(backend, MESSAGES, tools=SNAPSHOT.interface.to_openai(), max_tokens=BUDGET)
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
    backend = HFBackend(tiny_model, tiny_tokenizer, None)
    guard = Guard(SNAPSHOT, backend, budget=BUDGET)
    out = guard.process(MESSAGES, [Call("get_weather", {"city": "Paris"})])
    (step,) = out.record.steps
    assert step.kind == "repair" and step.tool_choice == "get_weather"
    assert step.reply.startswith('{"name": "get_weather", "arguments": ')
    assert out.calls == () and out.status == "unresolved"


def test_backend_renders_tools_through_the_format(tiny_model, tiny_tokenizer):
    backend = HFBackend(tiny_model, tiny_tokenizer, ToolRLFormat())
    prompt, _ = backend.prompt(GenRequest(chat_example(MESSAGES, Interface([WEATHER]).to_openai())))
    assert "1. Name: get_weather" in prompt and "Weather in Paris" in prompt
