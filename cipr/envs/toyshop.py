"""ToyShop: an offline, seeded WebShop-like shop, under two action sets, with a scripted expert.

One world (a seeded catalog of products, tasks built from a catalog product so one always satisfies them),
two interfaces:

- `actions="webshop"` (`ACTIONS`): WebShop's two actions (Yao et al., 2022), `search[query]` and
  `click[element]`, with its page texts. Self-distillation (paper §4.3) and `cipr.envs.webshop` use it;
  `ToyShop(seed=...)` builds it, so the distillation path is unchanged.
- `actions="tools"` (`TOOLS`, the multi-turn environment `env=toyshop`): nine tools whose descriptions
  overlap, so which one to call is a decision: `search_products` vs `filter_results` (both list products),
  `view_item` vs `compare_items` (both show a product's details), `buy_now` vs `add_to_cart` vs `checkout`
  (all act on a purchase), `select_option`, `back`. Each takes at most one string argument, so the `webshop`
  call format renders every tool too; a one-parameter tool also takes that format's `argument` key.

Tasks of the tools variant (task id k, seeded by (seed, k)): `buy` (one user turn: find the item and buy
it) or `cart` (two user turns: put it in the cart without buying, then check the cart out). Reward in
[0, 1]: per user turn the share of the requested attributes (type, colour, size, price bound) the best
item of that turn's outcome satisfies, divided by the number of items in it (buying extra items costs);
a purchase counts only in the turn that asks for it. `buy`: the purchase's value; `cart`: the mean of the
cart at the end of turn 1 and the purchase in turn 2. Success: reward 1. The split: `tasks(split)` draws
`heldout_fraction` of task ids 0..n_tasks-1 with `random.Random(f"toyshop-split:{split_seed}")` as
held-out; the rest are train.

The scripted expert (`expert_calls`) plays a task with privileged knowledge of the catalog: per user turn
the list of calls that earns reward 1 (search, filter, view, select, then buy or add to the cart; checkout).
`expert` (webshop actions) keeps the trajectories self-distillation trains on.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Literal

from cipr.envs.base import EpisodeLimits, EpisodeScore, StepResult, check_split, no_such_tool
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


def _tool(name: str, description: str, arg: str | None = None, arg_description: str = "") -> Tool:
    if arg is None:
        return Tool(name, description, {"type": "object", "properties": {}})
    return Tool(name, description, {"type": "object", "required": [arg], "properties": {
        arg: {"type": "string", "description": arg_description}}})


TOOLS = Interface((
    _tool("search_products", "Search the shop's catalog with a text query and list the matching products "
          "(id, title, price), best matches first.", "query", "words describing the product"),
    _tool("filter_results", "Narrow the listed products to those matching a constraint (a colour, a size, "
          "a product type, a material or a price bound such as 'under 30') and list the rest.",
          "constraint", "the constraint, e.g. 'red', 'size large', 'under 40 dollars'"),
    _tool("view_item", "Open the page of a listed product: its title, price, material and sizes.",
          "item_id", "the product id, e.g. B1A2B3C4D"),
    _tool("compare_items", "Show several listed products side by side: price, colour, material and sizes "
          "of each.", "item_ids", "two or more product ids separated by commas"),
    _tool("select_option", "Choose an option, such as a size, on the open product page.", "option",
          "the option, e.g. medium"),
    _tool("add_to_cart", "Put the open product, with its selected option, into the shopping cart without "
          "buying it."),
    _tool("buy_now", "Buy the open product with its selected option right away: the purchase is made and "
          "the shopping session ends."),
    _tool("checkout", "Buy everything in the shopping cart: the purchase is made and the shopping session "
          "ends."),
    _tool("back", "Go back to the previous page (from a product page to the list, from a filtered list to "
          "the one before)."),
))

_TYPES = ["t-shirt", "hoodie", "sneakers", "backpack", "water bottle", "desk lamp", "yoga mat", "headphones",
          "coffee mug", "rain jacket", "wallet", "sunglasses"]
_COLORS = ["red", "blue", "black", "white", "green", "grey", "pink", "yellow"]
_SIZES = ["small", "medium", "large", "x-large"]
_MATERIALS = ["cotton", "leather", "steel", "bamboo", "recycled plastic", "wool"]
_PRICE = re.compile(r"(?:under|below|less than|cheaper than|at most|<=?|max(?:imum)?)"
                    r"\s*\$?\s*(\d+(?:\.\d+)?)")
ARGUMENT = "argument"
"""The key the `webshop` call format puts a call's one argument under."""
PAGE_SIZE = 5


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

    def line(self) -> str:
        return f"[{self.pid}] {self.title} - ${self.price:.2f}"


@dataclass(frozen=True)
class Task:
    kind: str
    color: str
    size: str
    max_price: float
    goal: Literal["buy", "cart"] = "buy"

    @property
    def instruction(self) -> str:
        """WebShop's instruction text (the webshop actions)."""
        return (f"i need a {self.color} {self.kind} in size {self.size}, and price lower than "
                f"{self.max_price:.2f} dollars")

    @property
    def user_turns(self) -> tuple[str, ...]:
        """The user's messages under the tools (one for `buy`, two for `cart`)."""
        want = (f"a {self.color} {self.kind} in size {self.size} that costs less than "
                f"{self.max_price:.0f} dollars")
        if self.goal == "buy":
            return (f"I need {want}. Please buy it for me.",)
        return (f"Find me {want} and put it in my cart, but don't buy anything yet.",
                "Thanks! Please check out my cart now.")


@dataclass
class ToyShopConfig:
    """`env=toyshop`: the shop's options (`make_env("toyshop", **options)`).

    - `seed`: the catalog and the tasks; `n_products`: catalog size.
    - `actions`: `tools` (the nine tools, multi-turn) or `webshop` (WebShop's two actions).
    - `n_tasks`, `heldout_fraction`, `split_seed`: the task ids and their seeded train/held-out split.
    - `max_turns`, `max_calls`, `max_steps_per_turn` (null: no bound): the episode's bounds
      (`cipr.envs.base.EpisodeLimits`).
    """

    seed: int = 0
    n_products: int = 120
    actions: Literal["tools", "webshop"] = "tools"
    n_tasks: int = 1000
    heldout_fraction: float = 0.2
    split_seed: int = 0
    max_turns: int = 16
    max_calls: int = 4
    max_steps_per_turn: int | None = None

    def __post_init__(self) -> None:
        if self.actions not in ("tools", "webshop"):
            raise ValueError(f"toyshop: actions must be tools or webshop, got {self.actions!r}")
        if self.n_products < 1 or self.n_tasks < 2:
            raise ValueError(f"toyshop: n_products={self.n_products} must be >= 1 and n_tasks={self.n_tasks} "
                             ">= 2")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"toyshop: heldout_fraction={self.heldout_fraction} must lie in (0, 1)")
        try:
            EpisodeLimits(self.max_turns, self.max_calls, self.max_steps_per_turn)
        except ValueError as e:
            raise ValueError(f"toyshop: {e}") from None

    def build(self) -> ToyShop:
        return ToyShop(**{f.name: getattr(self, f.name) for f in fields(ToyShopConfig)})


def task_number(task_id: Any) -> int:
    """The integer of a task id: 17, "17" or "toyshop_17"."""
    text = str(task_id).rsplit("_", 1)[-1]
    if not text.isdigit():
        raise ValueError(f"toyshop: task id {task_id!r} is not a number or toyshop_<number>")
    return int(text)


@dataclass
class _Page:
    """A page of the tools variant: a product list (`results`) or a product (`item`, with `size`)."""

    results: tuple[Product, ...] = ()
    item: Product | None = None
    size: str | None = None


@dataclass
class ToyShop(ToyShopConfig):
    """The shop: a seeded catalog, tasks with a satisfying product, WebShop pages or the nine tools.

    Its options are `ToyShopConfig`'s fields, with WebShop's two actions as the default (`ToyShop(seed=...)`
    is the distillation path's shop; `ToyShopConfig().build()` the multi-turn environment's).
    """

    actions: Literal["tools", "webshop"] = "webshop"
    name: ClassVar[str] = "toyshop"
    catalog: list[Product] = field(init=False)
    _page: str = field(init=False, default="start")
    _task: Task | None = field(init=False, default=None)
    _results: list[Product] = field(init=False, default_factory=list)
    _item: Product | None = field(init=False, default=None)
    _size: str | None = field(init=False, default=None)
    _turn: int = field(init=False, default=0)
    _stack: list[_Page] = field(init=False, default_factory=list)
    _cart: list[tuple[Product, str | None]] = field(init=False, default_factory=list)
    _cart_at_turn_end: list[tuple[Product, str | None]] = field(init=False, default_factory=list)
    _purchase: tuple[int, list[tuple[Product, str | None]]] | None = field(init=False, default=None)
    _last_reward: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        super().__post_init__()
        rng = random.Random(self.seed)
        self.catalog = [
            Product(f"B{rng.randrange(16**8):08X}", rng.choice(_TYPES), rng.choice(_COLORS),
                    rng.choice(_MATERIALS), round(rng.uniform(5, 120), 2),
                    tuple(sorted(rng.sample(_SIZES, rng.randint(1, 4)), key=_SIZES.index)))
            for _ in range(self.n_products)
        ]
        self._by_id = {p.pid: p for p in self.catalog}

    @property
    def limits(self) -> EpisodeLimits:
        return EpisodeLimits(self.max_turns, self.max_calls, self.max_steps_per_turn)

    @property
    def interface(self) -> Interface:  # type: ignore[override]
        return TOOLS if self.actions == "tools" else ACTIONS

    @property
    def declared(self) -> Interface:
        return self.interface

    @property
    def turn(self) -> int:
        return self._turn

    def task(self, task_id: Any) -> Task:
        """Task `task_id`: built from a catalog product, so at least one product satisfies it."""
        k = task_number(task_id)
        rng = random.Random(self.seed * 100_003 + k)
        p = self.catalog[rng.randrange(len(self.catalog))]
        size, price = rng.choice(p.sizes), round(p.price + rng.uniform(1, 30), 0)
        goal: Literal["buy", "cart"] = "cart" if rng.random() < 0.5 else "buy"
        return Task(p.kind, p.color, size, price, goal if self.actions == "tools" else "buy")

    def tasks(self, split: str) -> list[str]:
        """Task ids `toyshop_<k>` of `split` (module docstring: the seeded split)."""
        check_split(split, "toyshop")
        n_held = max(1, round(self.heldout_fraction * self.n_tasks))
        held = set(random.Random(f"toyshop-split:{self.split_seed}").sample(range(self.n_tasks), n_held))
        return [f"toyshop_{k}" for k in range(self.n_tasks) if (k in held) == (split == "heldout")]

    def reset(self, task_id: Any) -> str:
        (self._task, self._page, self._results, self._item,
         self._size) = self.task(task_id), "start", [], None, None
        self._turn, self._stack, self._cart, self._cart_at_turn_end = 0, [], [], []
        self._purchase, self._last_reward = None, 0.0
        if self.actions == "tools":
            return self._task.user_turns[0]
        return f"WebShop [SEP] Instruction: [SEP] {self._task.instruction} [SEP] Search"

    # ------------------------------------------------------------------ WebShop actions
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
        """The share of the task's attributes (type, colour, size, price bound) `product` in `size` meets."""
        t = self._task
        hits = [product.kind == t.kind, product.color == t.color, size == t.size,
                product.price <= t.max_price]
        return sum(hits) / len(hits)

    def step(self, call: Call) -> StepResult:
        if self.actions == "tools":
            if call.name not in TOOLS:
                return StepResult(no_such_tool(call.name), 0.0, False, valid=False)
            return self._tool_step(call)
        res = self._webshop_step(call)  # an undeclared name is WebShop's "Invalid action!"
        if res.done:
            self._last_reward = res.reward
        return res

    def _webshop_step(self, call: Call) -> StepResult:
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

    # ------------------------------------------------------------------ the tools
    def _argument(self, call: Call) -> str | StepResult:
        """The call's one string argument ("" for a tool without one), or the refusal."""
        tool = TOOLS.get(call.name)
        params = list(tool.properties) if tool is not None else []
        args = dict(call.arguments)
        if not params:
            if args and set(args) != {ARGUMENT} or str(args.get(ARGUMENT, "")).strip():
                return self._refuse(f"{call.name} takes no arguments, got {sorted(args)}")
            return ""
        value = args.pop(params[0], args.pop(ARGUMENT, None) if len(args) == 1 else None)
        if value is None:
            return self._refuse(f"{call.name} needs its argument {params[0]!r}")
        if args:
            return self._refuse(f"{call.name} got unknown arguments {sorted(args)}")
        return str(value).strip()

    @staticmethod
    def _refuse(text: str) -> StepResult:
        return StepResult(f"Error: {text}", 0.0, False, valid=False)

    def _list_text(self, head: str) -> str:
        shown = self._results[:PAGE_SIZE]
        rows = "\n".join(p.line() for p in shown)
        more = f" Showing the first {len(shown)}." if len(self._results) > PAGE_SIZE else ""
        return f"{head}: {len(self._results)} products.{more}\n{rows}"

    def _item_text(self) -> str:
        p = self._item
        chosen = f" Selected size: {self._size}." if self._size else " No size selected."
        return (f"[{p.pid}] {p.title}. Price: ${p.price:.2f}. Material: {p.material}. Colour: {p.color}. "
                f"Sizes: {', '.join(p.sizes)}.{chosen}")

    def _save(self) -> None:
        self._stack.append(_Page(tuple(self._results), self._item, self._size))

    def _tool_step(self, call: Call) -> StepResult:
        arg = self._argument(call)
        if isinstance(arg, StepResult):
            return arg
        if self._purchase is not None:
            return self._refuse("the purchase is made; the shop is closed")
        handler = getattr(self, f"_do_{call.name}")
        return handler(arg)

    def _do_search_products(self, query: str) -> StepResult:
        words = set(re.findall(r"[\w-]+", query.lower()))
        if not words:
            return self._refuse("the query is empty")
        scored = [(len(words & set(f"{p.title} {p.kind}".lower().split())), i, p)
                  for i, p in enumerate(self.catalog)]
        self._save()
        self._results = [p for s, _, p in sorted(scored, key=lambda x: (-x[0], x[1])) if s > 0]
        self._item, self._size, self._page = None, None, "results"
        if not self._results:
            return StepResult(f"No products match {query!r}.")
        return StepResult(self._list_text(f"Results for {query!r}"))

    def _do_filter_results(self, constraint: str) -> StepResult:
        if self._page != "results":
            return self._refuse("there is no product list to filter: search first (or go back to the list)")
        text = constraint.lower()
        tests = []
        for vocab, attr in ((_COLORS, "color"), (_MATERIALS, "material"), (_TYPES, "kind")):
            named = [v for v in vocab if re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-])", text)]
            if named:
                tests.append(lambda p, a=attr, n=tuple(named): getattr(p, a) in n)
        sizes = [s for s in _SIZES if re.search(rf"(?<![\w-]){re.escape(s)}(?![\w-])", text)]
        if sizes:
            tests.append(lambda p, n=tuple(sizes): any(s in p.sizes for s in n))
        price = _PRICE.search(text)
        if price:
            bound = float(price.group(1))
            tests.append(lambda p, m=bound: p.price <= m)
        if not tests:
            return self._refuse(f"cannot read the constraint {constraint!r}: name a colour, a size, a "
                                "product type, a material or a price bound such as 'under 30'")
        self._save()
        self._results = [p for p in self._results if all(t(p) for t in tests)]
        return StepResult(self._list_text(f"Filtered by {constraint!r}"))

    def _listed(self, pid: str) -> Product | None:
        return next((p for p in self._results if p.pid.lower() == pid.strip().strip("[]").lower()), None)

    def _do_view_item(self, pid: str) -> StepResult:
        if self._page != "results":
            return self._refuse("open a product from a list: search first (or go back to the list)")
        p = self._listed(pid)
        if p is None:
            return self._refuse(f"{pid!r} is not in the current list")
        self._save()
        self._item, self._size, self._page = p, None, "item"
        return StepResult(self._item_text())

    def _do_compare_items(self, pids: str) -> StepResult:
        ids = [s for s in re.split(r"[,\s]+", pids) if s]
        if len(ids) < 2:
            return self._refuse("give two or more product ids separated by commas")
        found = [self._listed(i) for i in ids]
        if self._page != "results" or None in found:
            missing = [i for i, p in zip(ids, found, strict=True) if p is None]
            return self._refuse(f"not in the current list: {', '.join(missing) or ', '.join(ids)}")
        rows = "\n".join(f"[{p.pid}] {p.kind}, {p.color}, {p.material}, ${p.price:.2f}, sizes "
                         f"{'/'.join(p.sizes)}" for p in found if p is not None)
        return StepResult(f"Comparison:\n{rows}")

    def _do_select_option(self, option: str) -> StepResult:
        if self._page != "item":
            return self._refuse("no product page is open")
        if option.lower() not in self._item.sizes:
            sizes = ", ".join(self._item.sizes)
            return self._refuse(f"{option!r} is not an option of this product ({sizes})")
        self._size = option.lower()
        return StepResult(self._item_text())

    def _chosen(self) -> tuple[Product, str] | StepResult:
        if self._page != "item":
            return self._refuse("no product page is open")
        if self._size is None:
            return self._refuse("select a size first")
        return self._item, self._size

    def _do_add_to_cart(self, _: str) -> StepResult:
        chosen = self._chosen()
        if isinstance(chosen, StepResult):
            return chosen
        self._cart.append(chosen)
        return StepResult(f"Added {chosen[0].title} (size {chosen[1]}) to the cart; the cart holds "
                          f"{len(self._cart)} item(s).")

    def _do_buy_now(self, _: str) -> StepResult:
        chosen = self._chosen()
        if isinstance(chosen, StepResult):
            return chosen
        self._purchase = (self._turn, [chosen])
        return StepResult(f"Purchased {chosen[0].title} (size {chosen[1]}). Thank you for shopping with us!",
                          done=True)

    def _do_checkout(self, _: str) -> StepResult:
        if not self._cart:
            return self._refuse("the cart is empty")
        self._purchase = (self._turn, list(self._cart))
        return StepResult(f"Purchased the cart ({len(self._cart)} item(s)). Thank you for shopping with us!",
                          done=True)

    def _do_back(self, _: str) -> StepResult:
        if not self._stack:
            return self._refuse("there is no previous page")
        page = self._stack.pop()
        self._results, self._item, self._size = list(page.results), page.item, page.size
        self._page = "item" if page.item is not None else ("results" if page.results else "start")
        return StepResult(self._item_text() if page.item is not None else
                          self._list_text("Back to the list") if page.results else "Back to the start page.")

    # ------------------------------------------------------------------ turns and score
    def end_turn(self, text: str) -> str | None:
        """The next user message of a `cart` task, else None (the webshop actions have one turn)."""
        if self.actions != "tools" or self._task is None or self._purchase is not None:
            return None
        if self._turn + 1 >= len(self._task.user_turns):
            return None
        self._cart_at_turn_end = list(self._cart)
        self._turn += 1
        return self._task.user_turns[self._turn]

    def _value(self, items: list[tuple[Product, str | None]]) -> float:
        if not items:
            return 0.0
        return max(self.reward(p, s) for p, s in items) / len(items)

    def score(self) -> EpisodeScore:
        """Reward and per-turn checks (module docstring); the webshop actions: the last purchase's reward."""
        if self._task is None:
            raise RuntimeError("toyshop: score() before reset()")
        if self.actions != "tools":
            return EpisodeScore(self._last_reward, self._last_reward >= 1.0, (self._last_reward >= 1.0,))
        turn, bought = self._purchase if self._purchase is not None else (-1, [])
        if self._task.goal == "buy":
            values = [self._value(bought) if turn == 0 else 0.0]
        else:
            cart = self._cart_at_turn_end if self._turn >= 1 else list(self._cart)
            values = [self._value(cart) if turn != 0 else 0.0, self._value(bought) if turn == 1 else 0.0]
        reward = sum(values) / len(values)
        details = {"goal": self._task.goal, "turn_values": values,
                   "purchased": [[p.pid, s] for p, s in bought], "cart": [[p.pid, s] for p, s in self._cart]}
        return EpisodeScore(reward, reward >= 1.0, tuple(v >= 1.0 for v in values), details)

    # ------------------------------------------------------------------ experts
    def expert_calls(self, task_id: Any) -> list[list[Call]]:
        """The tools variant's scripted expert: per user turn, the calls that earn reward 1 (played on a
        copy of the shop, so this one is left as it was)."""
        shop = replace(self, actions="tools")
        shop.reset(task_id)
        t = shop._task
        good = next(p for p in shop.catalog if p.kind == t.kind and p.color == t.color
                    and p.price <= t.max_price and t.size in p.sizes)
        first = [Call("search_products", {"query": f"{t.color} {t.kind}"}),
                 Call("filter_results", {"constraint": f"{t.color} {t.kind}, size {t.size}, under "
                                                       f"{t.max_price:.0f}"}),
                 Call("view_item", {"item_id": good.pid}), Call("select_option", {"option": t.size})]
        if t.goal == "buy":
            return [first + [Call("buy_now")]]
        return [first + [Call("add_to_cart")], [Call("checkout")]]

    def expert(self, task_id: int, *, seed: int = 0, max_steps: int = 10) -> tuple[list[Message], float]:
        """A scripted expert trajectory under the webshop actions as messages, and its reward.

        User turns carry the instruction page, then `Observation:` pages; each assistant turn is one step as
        structured data: its thought in `content`, its action in `calls` (one
        `Call(name, {"argument": ...})`). The text is left to the call format (`webshop`), so the trajectory
        renders under any action names and the action reader's openers match the text exactly. No system
        message: the format's instruction lists the actions. Thoughts do not name the actions, so renaming
        changes only the action lines and the instruction.
        """
        if self.actions != "webshop":
            raise ValueError("toyshop: expert() plays the webshop actions; use expert_calls() for the tools")
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

