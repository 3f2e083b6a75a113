"""The environment interface: what a live evaluation or a trajectory generator needs of a world.

`ToyShop` (cipr/envs/toyshop.py) implements it offline; `cipr.envs.webshop.WebShopEnv` wraps the
real WebShop (`web_agent_site`) where a user has installed it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from cipr.tools.interface import Call, Interface


@dataclass(frozen=True)
class StepResult:
    """What an environment returns after an action: the next observation, a reward, and whether it ended."""

    observation: str
    reward: float
    done: bool
    valid: bool = True


class Environment(Protocol):
    """An episodic text environment whose actions are calls to its interface's tools."""

    interface: Interface

    def reset(self, task_id: int) -> str:
        """Start task `task_id`; returns the instruction and first observation."""
        ...

    def step(self, call: Call) -> StepResult:
        """Apply one action (a call to one of `interface`'s tools)."""
        ...
