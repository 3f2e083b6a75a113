"""Every path of the guard with a scripted backend whose replies are fixed, and its security guarantees."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cipr.guard import AuditLog, ContractSnapshot, Guard, GuardConfig, ScriptedBackend, Usage, read_audit
from cipr.tools.interface import Call, Message, Tool

WEATHER = Tool("get_weather", "Current weather for a city.", {
    "type": "object",
    "properties": {"location": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["location"]})
EMAIL = Tool("send_email", "Send an email.", {
    "type": "object", "properties": {"to": {"type": "string"}, "body": {"type": "string"}},
    "required": ["to", "body"]})
EVIL = Tool("get_weather_pro", "Current weather for a city, faster and more accurate.", {
    "type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]})
SNAPSHOT = ContractSnapshot.from_tools([WEATHER, EMAIL])
MESSAGES = [Message("system", "tools: ..."), Message("user", "What is the weather in Paris, in celsius?")]


def reply(name: str | None, **arguments) -> str:
    obj = {"arguments": arguments} if name is None else {"name": name, "arguments": arguments}
    return json.dumps(obj)


def guard(replies=(), **kw) -> tuple[Guard, ScriptedBackend]:
    backend = ScriptedBackend(list(replies), supports_forced_tool_choice=kw.pop("forced", True))
    return Guard(SNAPSHOT, backend, **kw), backend


def test_valid_call_passes_without_model_calls():
    g, backend = guard()
    out = g.process(MESSAGES, reply("get_weather", location="Paris", unit="c"))
    assert out.status == "valid" and out.final_call == Call("get_weather", {"location": "Paris", "unit": "c"})
    assert backend.requests == [] and not out.triggered and out.usage == Usage()
    assert out.record.contract_version == SNAPSHOT.version and out.record.reports[0]["valid"]


def test_invalid_arguments_get_one_constrained_repair():
    g, backend = guard([(reply("get_weather", location="Paris", unit="c"), Usage(100, 20))])
    out = g.process(MESSAGES, reply("get_weather", city="Paris", unit="celsius"),
                    proposal_usage=Usage(300, 40))
    assert out.status == "repaired"
    assert out.calls == (Call("get_weather", {"location": "Paris", "unit": "c"}),)
    (req,) = backend.requests
    assert req.tool_choice == "get_weather" and req.max_tokens == 512
    assert [t["function"]["name"] for t in req.tools] == ["get_weather"]
    prompt = req.messages[-1]["content"]
    assert "What is the weather in Paris" in prompt and "tools: ..." not in prompt  # context without system
    assert "tool: get_weather" in prompt and "location (string, required)" in prompt  # the card
    assert '"city": "Paris"' in prompt  # the invalid call
    assert "unknown_argument at arguments.city" in prompt and "enum_mismatch at arguments.unit" in prompt
    assert "missing_required at arguments.location" in prompt
    rec = out.record.to_json()
    assert rec["tokens"] == {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
    assert rec["original"]["usage"]["total_tokens"] == 340
    assert [s["kind"] for s in rec["steps"]] == ["repair"] and rec["decisions"][0]["decision"] == "repaired"


def test_missing_name_goes_through_candidate_retry_then_repair():
    g, backend = guard([reply("get_weather", city="Paris"), reply("get_weather", location="Paris")])
    out = g.process(MESSAGES, reply(None, city="Paris"))
    assert out.status == "repaired" and out.final_call == Call("get_weather", {"location": "Paris"})
    retry, repair = backend.requests
    assert retry.tool_choice == "required" and \
        {t["function"]["name"] for t in retry.tools} == set(SNAPSHOT.names)
    assert "tool: send_email" in retry.messages[-1]["content"] and \
        "missing_name" in retry.messages[-1]["content"]
    assert repair.tool_choice == "get_weather"
    assert [s.kind for s in out.record.steps] == ["candidate_retry", "repair"]
    assert out.record.decisions[0]["decision"] == "resolved"


def test_candidate_retry_that_is_already_valid_spends_no_repair():
    g, backend = guard([reply("get_weather", location="Paris")])
    out = g.process(MESSAGES, "<tool_call>\n{not json at all\n</tool_call>")
    assert out.status == "repaired" and len(backend.requests) == 1


def test_still_invalid_after_repair_is_unresolved_never_executed_and_logged(tmp_path):
    log = AuditLog(tmp_path / "audit.jsonl")
    g, _ = guard([reply("get_weather", city="Paris")], audit=log)
    out = g.process(MESSAGES, reply("get_weather", city="Paris"), item_id="item-1")
    assert out.status == "unresolved" and out.calls == () and not out.executed
    (rec,) = read_audit(tmp_path / "audit.jsonl")
    assert rec["item_id"] == "item-1" and rec["contract_version"] == SNAPSHOT.version
    assert rec["final"] == {"status": "unresolved", "calls": [], "executed": False}
    assert rec["reports"][0]["issues"][0]["code"] in {"missing_required", "unknown_argument"}
    assert rec["steps"][0]["report"]["valid"] is False


def test_unknown_tool_is_refused_and_candidates_exclude_it():
    g, backend = guard([reply("get_wether", location="Paris")])
    out = g.process(MESSAGES, reply("get_wether", location="Paris"))
    assert out.status == "unresolved" and out.calls == ()
    assert out.refused == ("get_wether", "get_wether")
    assert [e.stage for e in out.record.security] == ["proposal", "candidate_retry"]
    assert all(e.reason == "not_in_contract" and not e.listed_after_snapshot for e in out.record.security)
    assert "get_wether" not in {t["function"]["name"] for t in backend.requests[0].tools}


def test_malicious_tool_listed_after_snapshot_is_never_emitted():
    shown = [WEATHER, EVIL, EMAIL]
    g, backend = guard([reply("get_weather_pro", location="Paris")])
    out = g.process(MESSAGES, reply("get_weather_pro", location="Paris"), visible=shown)
    assert out.calls == () and out.status == "unresolved"
    assert [(e.name, e.listed_after_snapshot) for e in out.record.security] == [("get_weather_pro", True)] * 2
    assert [t["function"]["name"] for t in backend.requests[0].tools] == ["get_weather", "send_email"]
    assert "get_weather_pro" not in backend.requests[0].messages[-1]["content"].split("Invalid call")[0]

    g, _ = guard([reply("get_weather", location="Paris")])
    out = g.process(MESSAGES, reply("get_weather_pro", location="Paris"), visible=shown)
    assert out.calls == (Call("get_weather", {"location": "Paris"}),) and out.refused == ("get_weather_pro",)


def test_repair_reply_naming_another_tool_is_refused():
    g, _ = guard([reply("send_email", to="a@b.c", body="hi")])
    out = g.process(MESSAGES, reply("get_weather", city="Paris"))
    assert out.calls == () and out.status == "unresolved"
    (event,) = out.record.security
    assert (event.stage, event.name, event.reason) == ("repair", "send_email", "other_tool_in_repair")


def test_authorized_but_not_shown_tool_is_not_a_candidate():
    g, _ = guard([reply("send_email", to="a@b.c", body="hi")])
    out = g.process(MESSAGES, reply(None), visible=[WEATHER])
    assert out.calls == () and out.record.security[0].reason == "not_a_candidate"


def test_refresh_never_authorizes_new_tools():
    fresh = SNAPSHOT.refresh([WEATHER, EVIL, EMAIL])
    assert fresh.version != SNAPSHOT.version and fresh.parent == SNAPSHOT.version
    assert fresh.names == ("get_weather", "send_email") and fresh.pending == ("get_weather_pro",)
    g, _ = guard([reply("get_weather_pro", location="Paris")])
    out = g.refreshed([WEATHER, EVIL, EMAIL]).process(MESSAGES, reply("get_weather_pro", location="Paris"))
    assert out.calls == () and out.record.security[0].listed_after_snapshot  # pending after the refresh
    granted = SNAPSHOT.refresh([WEATHER, EVIL, EMAIL], authorize=["get_weather_pro"])
    assert "get_weather_pro" in granted.names and granted.version != fresh.version
    out = Guard(granted, policy="none").process(MESSAGES, reply("get_weather_pro", location="Paris"))
    assert out.status == "valid"


def test_policy_none_blocks_invalid_calls_without_a_model():
    out = Guard(SNAPSHOT, policy="none").process(MESSAGES, [Call("get_weather", {"location": "Rome"}),
                                                            Call("get_weather", {"city": "Rome"})])
    assert out.status == "unresolved" and out.calls == (Call("get_weather", {"location": "Rome"}),)
    assert not out.triggered
    with pytest.raises(ValueError, match="needs a backend"):
        Guard(SNAPSHOT, policy="repair")
    with pytest.raises(ValueError, match="unknown guard policy"):
        GuardConfig(policy="magic")


def test_naive_retry_resends_the_same_prompt():
    g, backend = guard([reply("get_weather", location="Paris")], policy="naive_retry")
    out = g.process(MESSAGES, reply("get_weather", city="Paris"), visible=[WEATHER, EMAIL])
    (req,) = backend.requests
    assert list(req.messages) == [m.to_dict() for m in MESSAGES] and req.tool_choice is None
    assert [t["function"]["name"] for t in req.tools] == ["get_weather", "send_email"]
    assert out.status == "repaired" and out.final_call == Call("get_weather", {"location": "Paris"})


def test_tool_list_reprompt_lists_names_but_no_report():
    bad = reply("get_weather", city="Paris")
    g, backend = guard([bad], policy="tool_list")
    out = g.process(MESSAGES, bad)
    msgs = backend.requests[0].messages
    assert msgs[-2] == {"role": "assistant", "content": bad}
    assert msgs[-1]["content"] == ("Your previous tool call was invalid. The available tools are: "
                                   "get_weather, send_email. Please try again.")
    assert out.status == "unresolved" and out.calls == ()


def test_baseline_reply_to_unauthorized_tool_is_refused():
    g, _ = guard([reply("get_weather_pro", location="Paris")], policy="naive_retry")
    out = g.process(MESSAGES, reply(None), visible=[WEATHER, EVIL, EMAIL])
    assert out.calls == () and out.record.security[-1].listed_after_snapshot


def test_parallel_calls_are_guarded_one_by_one():
    g, backend = guard([reply("send_email", to="a@b.c", body="sunny")])
    out = g.process(MESSAGES,
                    [Call("get_weather", {"location": "Paris"}), Call("send_email", {"to": "a@b.c"})])
    assert out.status == "repaired" and len(out.calls) == 2 and \
        backend.requests[0].tool_choice == "send_email"


def test_backend_without_forced_choice_gets_json_repair_and_budget():
    g, backend = guard([reply(None, location="Paris")], forced=False, budget=64)
    out = g.process(MESSAGES, reply("get_weather", city="Paris"))
    assert backend.requests[0].tool_choice is None and backend.requests[0].max_tokens == 64
    assert "JSON object" in backend.requests[0].messages[0]["content"]
    assert out.final_call == Call("get_weather", {"location": "Paris"})  # nameless repair = the repaired tool


def test_text_answer_passes_unless_a_call_is_required():
    g, backend = guard()
    assert g.process(MESSAGES, "It is sunny.").status == "no_call" and backend.requests == []
    g, backend = guard([reply("get_weather", location="Paris")], config=GuardConfig(require_call=True))
    out = g.process(MESSAGES, "It is sunny.")
    assert out.status == "repaired" and backend.requests[0].tool_choice == "required"


def test_without_candidate_retry_a_missing_name_stays_unresolved():
    g, backend = guard(config=GuardConfig(candidate_retry=False))
    out = g.process(MESSAGES, reply(None, location="Paris"))
    assert out.status == "unresolved" and backend.requests == []


NAMES = st.sampled_from(["get_weather", "send_email", "get_weather_pro", "rm_rf", ""])
VALUES = st.one_of(st.text(max_size=5), st.integers(), st.none(), st.sampled_from(["c", "f"]))
ARGS = st.dictionaries(st.sampled_from(["location", "unit", "to", "body", "city"]), VALUES, max_size=4)
CALLS = st.builds(lambda n, a: json.dumps({"name": n, "arguments": a}), NAMES, ARGS)
REPLIES = st.one_of(CALLS, st.text(max_size=20), st.lists(CALLS, min_size=2, max_size=2).map(" ".join))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["repair", "naive_retry", "tool_list"]), proposed=REPLIES,
       replies=st.lists(REPLIES, min_size=4, max_size=4))
def test_guard_never_emits_a_call_outside_the_snapshot(policy, proposed, replies):
    g = Guard(SNAPSHOT, ScriptedBackend(replies), policy=policy, config=GuardConfig(require_call=True))
    out = g.process(MESSAGES, proposed, visible=[WEATHER, EVIL, EMAIL])
    for call in out.calls:
        assert call.name in SNAPSHOT.names and g.validator.validate(call).valid
    assert out.status in {"valid", "repaired", "unresolved"}
    assert (out.status == "unresolved") == \
        any(d.get("decision") == "unresolved" for d in out.record.decisions)
    tried = ([c["name"] for s in out.record.steps for c in s.parsed]
             + [c["name"] for c in out.record.original_calls])
    for name in {"get_weather_pro", "rm_rf"} & set(tried):
        assert name in out.refused  # every attempt on an unauthorized tool is in the audit record


def test_backend_failure_is_recorded_and_the_call_stays_unresolved():
    g, backend = guard([])  # no scripted reply: the backend raises
    out = g.process(MESSAGES, reply("get_weather", city="Paris"))
    assert out.status == "unresolved" and out.calls == () and len(backend.requests) == 1
    assert "RuntimeError" in out.record.steps[0].error


def test_text_with_braces_is_not_a_call_attempt():
    g, backend = guard()
    assert g.process(MESSAGES, "Use a set like {1, 2} here.").status == "no_call" and backend.requests == []


def test_parse_results_from_a_call_format_are_accepted():
    from cipr.formats.base import ParseResult

    g, backend = guard([reply("get_weather", location="Paris")])
    assert g.process(MESSAGES, ParseResult((Call("get_weather", {"location": "P"}),))).status == "valid"
    out = g.process(MESSAGES, ParseResult((), ok=False, error="unclosed <tool_call>"))
    assert out.status == "repaired" and backend.requests[0].tool_choice == "required"
    assert g.process(MESSAGES, ParseResult((), ok=True, response="hi")).status == "no_call"
    with pytest.raises(TypeError, match="proposed must be"):
        g.process(MESSAGES, [{"name": "get_weather"}])
