"""ToyShop: an offline, seeded WebShop-like environment and its scripted expert.

WebShop (Yao et al., 2022) acts through two actions, `search[query]` and `click[element]`. ToyShop
keeps that action interface and the page structure (search results, item page with options, Buy
Now) on a generated catalog, so trajectories for self-distillation (paper §4.3) can be generated
and replayed without the real site. Rewards follow WebShop's spirit: the share of the requested
attributes (product type, colour, size, price bound) that the bought item satisfies.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from cipr.envs.base import StepResult
from cipr.tools.interface import Call, Interface, Message, Tool

ACTIONS = Interface((
    Tool("search", "Search the shop for products matching a text query; shows a page of results.",
         {"type": "object", "properties": {"argument": {"type": "string", "description": "the query"}},
          "required": ["argument"]}),
    Tool("click", "Click an element shown on the current page: a product id, an option, 'Buy Now', "
                  "'Back to Search', 'Next >' or '< Prev'.",
         {"type": "object", "properties": {"argument": {"type": "string", "description": "the element"}},
          "required": ["argument"]}),
))

_TYPES = ["t-shirt", "hoodie", "sneakers", "backpack", "water bottle", "desk lamp", "yoga mat", "headphones",
          "coffee mug", "rain jacket", "wallet", "sunglasses"]
_COLORS = ["red", "blue", "black", "white", "green", "grey", "pink", "yellow"]
_SIZES = ["small", "medium", "large", "x-large"]
_MATERIALS = ["cotton", "leather", "steel", "bamboo", "recycled plastic", "wool"]


@dataclass(frozen=True)
class Product:
    pid: str
    kind: str
    color: str
    material: str
    price: float
    sizes: tuple[str, ...]

    @property
    def title(self) -> str:
        return f"{self.color.title()} {self.material} {self.kind}"


@dataclass(frozen=True)
class Task:
    kind: str
    color: str
    size: str
    max_price: float

    @property
    def instruction(self) -> str:
        return (f"i need a {self.color} {self.kind} in size {self.size}, and price lower than "
                f"{self.max_price:.2f} dollars")


@dataclass
class ToyShop:
    """The shop: a seeded catalog, tasks with a satisfying product, and WebShop-style pages."""

    seed: int = 0
    n_products: int = 120
    interface: Interface = ACTIONS
    catalog: list[Product] = field(init=False)
    _page: str = field(init=False, default="start")
    _task: Task | None = field(init=False, default=None)
    _results: list[Product] = field(init=False, default_factory=list)
    _item: Product | None = field(init=False, default=None)
    _size: str | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        rng = random.Random(self.seed)
        self.catalog = [
            Product(f"B{rng.randrange(16**8):08X}", rng.choice(_TYPES), rng.choice(_COLORS),
                    rng.choice(_MATERIALS), round(rng.uniform(5, 120), 2),
                    tuple(sorted(rng.sample(_SIZES, rng.randint(1, 4)), key=_SIZES.index)))
            for _ in range(self.n_products)
        ]

    def task(self, task_id: int) -> Task:
        """Task `task_id`: built from a catalog product, so at least one product satisfies it."""
        rng = random.Random(self.seed * 100_003 + task_id)
        p = self.catalog[rng.randrange(len(self.catalog))]
        return Task(p.kind, p.color, rng.choice(p.sizes), round(p.price + rng.uniform(1, 30), 0))

    def reset(self, task_id: int) -> str:
        (self._task, self._page, self._results, self._item,
         self._size) = self.task(task_id), "start", [], None, None
        return f"WebShop [SEP] Instruction: [SEP] {self._task.instruction} [SEP] Search"

    def _search(self, query: str) -> str:
        words = set(query.lower().split())
        scored = sorted(self.catalog, key=lambda p: -len(words & set(f"{p.title} {p.kind}".lower().split())))
        self._results, self._page = scored[:5], "results"
        rows = " [SEP] ".join(f"{p.pid} [SEP] {p.title} [SEP] ${p.price:.2f}" for p in self._results)
        return f"Instruction: [SEP] {self._task.instruction} [SEP] Back to Search [SEP] Page 1 [SEP] {rows}"

    def _item_page(self) -> str:
        p = self._item
        opts = " [SEP] ".join(p.sizes)
        return (f"Instruction: [SEP] {self._task.instruction} [SEP] Back to Search [SEP] < Prev [SEP] size "
                f"[SEP] {opts} [SEP] {p.title} [SEP] Price: ${p.price:.2f} [SEP] Buy Now")

    def reward(self, product: Product, size: str | None) -> float:
        t = self._task
        hits = [product.kind == t.kind, product.color == t.color, size == t.size,
                product.price <= t.max_price]
        return sum(hits) / len(hits)

    def step(self, call: Call) -> StepResult:
        arg = str(call.arguments.get("argument", "")).strip()
        if call.name == "search" and self._page in ("start", "results"):
            return StepResult(self._search(arg), 0.0, False)
        if call.name == "click":
            if arg == "Back to Search":
                self._page = "start"
                return StepResult(f"Instruction: [SEP] {self._task.instruction} [SEP] Search", 0.0, False)
            if self._page == "results":
                match = [p for p in self._results if p.pid.lower() == arg.lower()]
                if match:
                    self._item, self._page, self._size = match[0], "item", None
                    return StepResult(self._item_page(), 0.0, False)
            if self._page == "item":
                if arg == "< Prev":
                    self._page = "results"
                    return StepResult(self._search(" ".join([self._task.color, self._task.kind])), 0.0, False)
                if arg in self._item.sizes:
                    self._size = arg
                    return StepResult(self._item_page(), 0.0, False)
                if arg == "Buy Now":
                    return StepResult("Thank you for shopping with us!", self.reward(self._item, self._size),
                                      True)
        return StepResult("Invalid action!", 0.0, False, valid=False)

    def expert(self, task_id: int, *, seed: int = 0, max_steps: int = 10) -> tuple[list[Message], float]:
        """A scripted expert trajectory as messages, and its reward.

        User turns carry the instruction page, then `Observation:` pages; each assistant turn is one step as
        structured data: its thought in `content`, its action in `calls` (one
        `Call(name, {"argument": ...})`). The text is left to the call format (`webshop`), so the trajectory
        renders under any action names and the action reader's openers match the text exactly. No system
        message: the format's instruction lists the actions. Thoughts do not name the actions, so renaming
        changes only the action lines and the instruction.
        """
        rng = random.Random(seed * 7919 + task_id)
        obs = self.reset(task_id)
        t = self._task
        msgs = [Message("user", obs)]
        plan: list[tuple[str, Call]] = [(f"I think I should look for a {t.color} {t.kind}.",
                                         Call("search", {"argument": f"{t.color} {t.kind}"}))]
        reward = 0.0
        for _ in range(max_steps):
            thought, call = plan.pop(0)
            msgs.append(Message("assistant", thought, (call,)))
            res = self.step(call)
            if res.done:
                reward = res.reward
                break
            msgs.append(Message("user", f"Observation:\n{res.observation}"))
            if self._page == "results":
                good = [p for p in self._results if p.kind == t.kind and p.color == t.color
                        and p.price <= t.max_price and t.size in p.sizes]
                pick = good[0] if good else self._results[rng.randrange(len(self._results))]
                why = "matches the colour, type and price" if good else "is the closest match"
                plan.append((f"I think {pick.pid} {why}.", Call("click", {"argument": pick.pid})))
            elif self._page == "item" and self._size is None and t.size in self._item.sizes:
                plan.append((f"I think I should select size {t.size}.", Call("click", {"argument": t.size})))
            elif self._page == "item":
                plan.append(("I think this item fits the instruction, so I buy it.",
                             Call("click", {"argument": "Buy Now"})))
        return msgs, reward
