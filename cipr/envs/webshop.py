"""WebShop (Yao et al., 2022) behind the `Environment` protocol, for live evaluation where it is installed.

WebShop is not a PyPI package: install it from its repository (github.com/princeton-nlp/WebShop,
`setup.sh` downloads the product data and builds the search index), which provides the
`web_agent_site` package. It is imported only when a `WebShopEnv` is built, with a clear error when
missing, so the rest of the project never needs it.

The adapter keeps WebShop's two actions, `search[keywords]` and `click[value]`, as the interface
(`cipr.envs.toyshop.ACTIONS`), so trajectories, renamings and the call format are the same as for
ToyShop. `reset(task_id)` starts WebShop session `task_id` (a goal index, as AgentBench uses them);
`step` sends the action text and reports it invalid when WebShop would ignore it (no search bar on
the page, or a click value that is not among the page's clickables).
"""

from __future__ import annotations

from typing import Any

from cipr.envs.base import EpisodeLimits, EpisodeScore, StepResult
from cipr.envs.toyshop import ACTIONS
from cipr.tools.interface import Call, Interface

INSTALL_HINT = ("WebShop is not installed: clone https://github.com/princeton-nlp/WebShop, run its setup.sh "
                "(product data and search index) and `pip install -e .` there, so that `web_agent_site` "
                "imports; or evaluate on ToyShop (algo.eval.live_env=toyshop)")


class WebShopMissing(ImportError):
    """`web_agent_site` (WebShop) cannot be imported."""


def _text_env_class() -> Any:
    try:
        from web_agent_site.envs import WebAgentTextEnv
    except ImportError as e:
        raise WebShopMissing(f"{INSTALL_HINT} ({e})") from e
    return WebAgentTextEnv


class WebShopEnv:
    """WebShop's text environment as an `Environment` (observation_mode "text", as AgentLM's prompts use)."""

    interface: Interface = ACTIONS
    declared: Interface = ACTIONS
    name = "webshop"
    turn = 0

    def __init__(self, observation_mode: str = "text", num_products: int | None = None,
                 limits: EpisodeLimits | None = None, **kwargs: Any) -> None:
        self._env = _text_env_class()(observation_mode=observation_mode, num_products=num_products, **kwargs)
        self.limits = limits or EpisodeLimits(16, 1)
        self._reward = 0.0

    def tasks(self, split: str) -> list[str]:
        raise NotImplementedError("WebShop's goal indices have no train/held-out split here; pass task ids")

    def reset(self, task_id: int) -> str:
        observation, _ = self._env.reset(session=task_id)
        self._reward = 0.0
        return observation

    def end_turn(self, text: str) -> str | None:
        """WebShop has one instruction: answering without an action ends the episode."""
        return None

    def score(self) -> EpisodeScore:
        """WebShop's reward of the last step (0 before a purchase)."""
        return EpisodeScore(self._reward, self._reward >= 1.0, (self._reward >= 1.0,))

    def step(self, call: Call) -> StepResult:
        if call.name not in self.interface:
            return StepResult("Invalid action!", 0.0, False, valid=False)
        argument = str(call.arguments.get("argument", ""))
        available = self._env.get_available_actions()
        if call.name == "search":
            valid = bool(available.get("has_search_bar")) and bool(argument.strip())
        else:
            valid = argument.lower() in available.get("clickables", [])
        observation, reward, done, _ = self._env.step(f"{call.name}[{argument}]")
        self._reward = min(1.0, max(0.0, float(reward or 0.0)))
        return StepResult(observation, float(reward or 0.0), bool(done), valid=valid)
