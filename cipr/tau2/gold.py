"""A scripted agent that replays each τ² task's gold actions, and a scripted user, as a chat backend.

τ²'s solo mode (no user) is refused by its airline and retail environments, so the end-to-end check
runs τ²'s normal mode with both sides scripted, behind cipr-serve:

- The agent (requests naming their task in `cipr_task`, `<domain>/<task id>`) sees only the request
  the service forwards (canonical ids under `names=canonical`) and answers in that namespace. It knows
  each task's expected actions and the original tool schemas, and finds the tool by its description
  and each argument by its position, both of which the adapter keeps. Turn k calls the k-th action;
  after the last it answers with the task's `communicate_info` strings. A task passes only if the
  service renamed consistently, translated every call back, and replayed the conversation each turn.
- The user simulator (requests without a task) opens with a fixed request and, once the agent has
  answered in text, ends the conversation with τ²'s stop token.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cipr.core.errors import DataError
from cipr.core.io import read_json
from cipr.serve.backends import wire_call
from cipr.serve.protocol import ApiError, completion
from cipr.tools.interface import Call

USER_OPENING = "Hi, I need help with a request about my account."
USER_STOP = "###STOP###"


class GoldReplayBackend:
    """See the module docstring: tasks from `data_dir/tau2/domains`, original tools from
    `tools_dir/tools_<domain>.json` (the harness writes them before its first task)."""

    name = "gold"

    def __init__(self, data_dir: str | Path, tools_dir: str | Path) -> None:
        self.data_dir, self.tools_dir = Path(data_dir), Path(tools_dir)
        self._actions: dict[str, list[dict[str, Any]]] = {}
        self._communicate: dict[str, list[Any]] = {}
        self._tools: dict[str, list[dict[str, Any]]] = {}

    def models(self) -> list[str]:
        return ["gold"]

    def actions(self, domain: str, task_id: str) -> list[dict[str, Any]]:
        if domain not in self._tools:
            path = self.data_dir / "tau2" / "domains" / domain / "tasks.json"
            if not path.is_file():
                raise DataError("no tau2 tasks file", file=str(path))
            for task in read_json(path):
                crit = task.get("evaluation_criteria") or {}
                self._actions[f"{domain}/{task['id']}"] = [a for a in crit.get("actions") or []
                                                           if a.get("requestor", "assistant") == "assistant"]
                self._communicate[f"{domain}/{task['id']}"] = list(crit.get("communicate_info") or [])
            self._tools[domain] = read_json(self.tools_dir / f"tools_{domain}.json")
        return self._actions[f"{domain}/{task_id}"]

    def _call(self, action: Mapping[str, Any], domain: str, shown: list[dict[str, Any]]) -> Call:
        original = next(t["function"] for t in self._tools[domain] if t["function"]["name"] == action["name"])
        return self._by_description(original["description"], list(original["parameters"]["properties"]),
                                    action.get("arguments") or {}, shown)

    @staticmethod
    def _by_description(description: str, arg_order: list[str], arguments: Mapping[str, Any],
                        shown: list[dict[str, Any]]) -> Call:
        target = next((t["function"] for t in shown if t["function"].get("description") == description), None)
        if target is None:
            raise ApiError(500, f"gold agent: no tool in the request has the description "
                           f"{description[:80]!r}", type="server_error", code="gold_agent")
        names = list(target["parameters"]["properties"])
        return Call(target["name"], {names[arg_order.index(k)]: v for k, v in arguments.items()})

    def _user_turn(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The scripted user: one opening request, then the stop token (its own turns arrive as assistant)."""
        said = sum(1 for m in body["messages"] if m.get("role") == "assistant")
        text = USER_OPENING if said == 0 else USER_STOP
        return completion("gold-user", {"role": "assistant", "content": text}, finish_reason="stop")

    def complete(self, body: Mapping[str, Any]) -> dict[str, Any]:
        domain, _, task_id = str(body.get("cipr_task") or "").partition("/")
        if not task_id:
            return self._user_turn(body)
        steps = self.actions(domain, task_id)
        k = sum(1 for m in body["messages"] if m.get("role") == "assistant" and m.get("tool_calls"))
        if k < len(steps):
            call = self._call(steps[k], domain, list(body.get("tools") or []))
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [wire_call(call)]}
            return completion("gold", message, finish_reason="tool_calls")
        said = " ".join(str(x) for x in self._communicate[f"{domain}/{task_id}"])
        return completion("gold",
                          {"role": "assistant", "content": f"Your request is handled. {said}".strip()},
                          finish_reason="stop")
