"""BFCL v4's multi-turn categories as an `Environment`, executed and scored by BFCL's own code.

Data (`<data root>/bfcl_v4/`): `BFCL_v4_multi_turn_{base,miss_func,miss_param,long_context}.json` (200
items each: `question` as a list of user turns, `initial_config`, `involved_classes`, `missed_function`
for miss_func), the function docs in `multi_turn_func_doc/` and the answers in `possible_answer/`.

As BFCL runs them (bfcl-eval 2026.3.23; `model_handler/base_handler.py`'s `inference_multi_turn_FC`):
- The tools are the docs of the item's involved classes, each description ending with BFCL's Python note
  (`utils.add_language_specific_hint_to_function_doc`); miss_func's held-out functions are left out
  until their turn, which has no user message: the functions are appended (without the note, as BFCL's
  loader removes them before adding it) and the user message is BFCL's
  `DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC`. `excluded_function` is not read (BFCL does not).
- `interface` is the tools shown now, `declared` every function of the item's docs, withheld ones
  included: `step` executes a withheld function before its turn, as BFCL's execution does (its ground
  truth for multi_turn_miss_func_49 calls `tail` two turns before `tail` is shown), and refuses any
  name outside the docs.
- Execution: the API classes of the installed `bfcl-eval` (`multi_turn_eval/func_source_code/`), one
  instance per class and episode loaded from `initial_config` (`long_context` for that category), each
  call through `multi_turn_utils.execute_multi_turn_func_call`, its result string being the observation.
  A call reaches it as BFCL's handlers write one (`model_handler/utils.convert_to_function_call`:
  `name(k=repr(v),...)`, rewritten here because that module needs tree_sitter); an argument name that
  is not a Python identifier or a value that is not JSON data is refused, never evaluated.
- Scoring (`score`): `multi_turn_checker.multi_turn_checker` (state and response checks after every turn
  with a ground truth) on the executed calls per turn, after the force-termination check of
  `eval_checker/eval_runner._evaluate_single_multi_turn_entry` (fewer turns than the ground truth: invalid;
  that module imports every model SDK, so its check is restated here). Per-turn checks: the checker on
  the first k turns, k = 1, 2, ... until one fails (the checker stops at its first failing turn, so a
  prefix that fails fails every longer one). `reward="episode"`: 1 if valid, else 0 (BFCL's accuracy);
  `"turns"`: the share of turns passed before the first failure (denser, for training).
- Limits: BFCL force-quits an episode after 20 steps in one user turn (`MAXIMUM_STEP_LIMIT`): the
  episode loop does the same with `limits.max_steps_per_turn`.

The split (`tasks`): item k of each category is one scenario told four ways (base_k, miss_func_k,
miss_param_k and long_context_k share their conversation), so items are split by their number k:
`random.Random(f"bfcl-multi-turn-split:{split_seed}")` draws `heldout_fraction` of the numbers as
held-out, the rest are train, the same numbers for every category.

BFCL's execution keeps instances in its module's globals under a name built from a model name and the
item id; every episode and every checker run here uses a fresh name and deletes its instances after.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import keyword
import os
import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cipr.core.errors import DataError, MissingInputError
from cipr.envs.base import EpisodeLimits, EpisodeScore, StepResult, check_split, no_such_tool
from cipr.tools.interface import Call, Interface, Tool

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
PYTHON_NOTE = " Note that the provided function is in Python 3 syntax."
"""BFCL's note on every shown function (`utils._get_language_specific_hint`, Python categories)."""
BFCL_VERSION = "2026.3.23"
INSTALL_HINT = (f"the BFCL multi-turn environment executes bfcl-eval's API classes: pip install "
                f"bfcl-eval=={BFCL_VERSION}")


def _bfcl() -> Any:
    """bfcl-eval's multi-turn modules (a clear error when the package is missing)."""
    try:
        from bfcl_eval.constants import default_prompts, executable_backend_config
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_checker, multi_turn_utils
    except ImportError as e:
        raise MissingInputError(f"{INSTALL_HINT} ({e})") from e
    return multi_turn_utils, multi_turn_checker, default_prompts, executable_backend_config


@dataclass(frozen=True)
class BFCLItem:
    """One multi-turn item: user turns (None for miss_func's reveal turn), the state, the answer."""

    id: str
    category: str
    turns: tuple[str | None, ...]
    initial_config: Mapping[str, Any]
    involved_classes: tuple[str, ...]
    missed: Mapping[int, tuple[str, ...]]
    ground_truth: tuple[tuple[str, ...], ...]

    @property
    def number(self) -> int:
        return int(self.id.rsplit("_", 1)[1])

    @property
    def long_context(self) -> bool:
        return "long_context" in self.category

    def entry(self) -> dict[str, Any]:
        """The test entry BFCL's checker reads (id, initial_config, involved_classes)."""
        return {"id": self.id, "initial_config": json.loads(json.dumps(self.initial_config)),
                "involved_classes": list(self.involved_classes)}


@dataclass
class BFCLMultiTurnConfig:
    """`env=bfcl_multi_turn` (module docstring).

    - `categories`: any of base, miss_func, miss_param, long_context.
    - `data_root`: None for `$CIPR_DATA_ROOT` or ../shared/data.
    - `heldout_fraction`, `split_seed`: the split of item numbers.
    - `reward`: `episode` (BFCL's verdict) or `turns` (share of turns passed before the first failure).
    - `max_turns` (assistant messages per episode), `max_calls` (calls per message), `max_steps_per_turn`
      (BFCL's 20).
    """

    categories: list[str] = field(default_factory=lambda: list(CATEGORIES))
    data_root: str | None = None
    heldout_fraction: float = 0.5
    split_seed: int = 0
    reward: Literal["episode", "turns"] = "turns"
    max_turns: int = 160
    max_calls: int = 8
    max_steps_per_turn: int = 20

    def __post_init__(self) -> None:
        bad = [c for c in self.categories if c not in CATEGORIES]
        if bad or not self.categories:
            raise ValueError(f"bfcl_multi_turn: categories must be a non-empty list of "
                             f"{', '.join(CATEGORIES)}, got {self.categories}")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"bfcl_multi_turn: heldout_fraction={self.heldout_fraction} must lie in (0, 1)")
        if self.reward not in ("episode", "turns"):
            raise ValueError(f"bfcl_multi_turn: reward must be episode or turns, got {self.reward!r}")

    def build(self) -> BFCLMultiTurn:
        return BFCLMultiTurn(self)


# ---------------------------------------------------------------------- data
def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise MissingInputError(f"{path} not found: the BFCL v4 data (`cipr-data fetch`) holds it",
                                file=str(path))
    out = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"line {i} is not JSON: {e}", file=str(path)) from None
    return out


def bfcl_root(data_root: str | None = None) -> Path:
    """`<data root>/bfcl_v4`: the argument, `$CIPR_DATA_ROOT`, or ../shared/data beside the checkout
    (`cipr.data.paths.data_root`'s rule, restated: environments sit below the data layer)."""
    beside = Path(__file__).resolve().parents[3] / "shared" / "data"
    root = Path(data_root or os.environ.get("CIPR_DATA_ROOT") or beside)
    path = root / "bfcl_v4"
    if not path.is_dir():
        raise MissingInputError(f"BFCL v4 data not found at {path}: give data_root=DIR or set CIPR_DATA_ROOT "
                                "(`cipr-data fetch data_root=DIR` downloads it)", file=str(path))
    return path


@functools.lru_cache(maxsize=8)
def load_items(data_root: str | None, categories: tuple[str, ...]) -> dict[str, BFCLItem]:
    """The items of `categories` by id, in file order (cached per data root and categories)."""
    root = bfcl_root(data_root)
    items: dict[str, BFCLItem] = {}
    for cat in categories:
        qfile = root / f"BFCL_v4_multi_turn_{cat}.json"
        afile = root / "possible_answer" / f"BFCL_v4_multi_turn_{cat}.json"
        answers = {a.get("id"): a for a in _read_jsonl(afile)}
        for q in _read_jsonl(qfile):
            qid = q.get("id")
            if qid not in answers:
                raise DataError("no ground truth for this item", file=str(afile), item=qid, field="id")
            try:
                turns = tuple((t[0]["content"] if t else None) for t in q["question"])
                missed = {int(k): tuple(v) for k, v in (q.get("missed_function") or {}).items()}
                truth = tuple(tuple(t) for t in answers[qid]["ground_truth"])
                item = BFCLItem(qid, f"multi_turn_{cat}", turns, q["initial_config"],
                                tuple(q["involved_classes"]), missed, truth)
            except (KeyError, IndexError, TypeError, ValueError) as e:
                raise DataError(f"malformed multi-turn item: {type(e).__name__}: {e}", file=str(qfile),
                                item=qid, field="question") from None
            if len(item.turns) != len(item.ground_truth):
                raise DataError(f"{len(item.turns)} user turns but {len(item.ground_truth)} ground-truth "
                                "turns", file=str(afile), item=qid, field="ground_truth")
            items[qid] = item
    return items


@functools.lru_cache(maxsize=32)
def class_tools(data_root: str | None, class_name: str) -> tuple[Tool, ...]:
    """The tools of one API class from its function doc, schemas normalized, without BFCL's note."""
    from cipr.tools.schema import normalize_schema

    *_, config = _bfcl()
    path = bfcl_root(data_root) / "multi_turn_func_doc" / config.MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    tools = []
    for i, fn in enumerate(_read_jsonl(path)):
        params = normalize_schema(fn.get("parameters"), language="python",
                                  where=f"line {i + 1}.parameters", file=str(path), item=fn.get("name"))
        tools.append(Tool(fn["name"], str(fn.get("description") or ""), params))
    return tuple(tools)


def item_tools(item: BFCLItem, data_root: str | None = None
               ) -> tuple[tuple[Tool, ...], dict[int, tuple[Tool, ...]]]:
    """The tools shown from the start (BFCL's note added) and, per reveal turn, the held-out ones."""
    every = [t for c in item.involved_classes for t in class_tools(data_root, c)]
    by_name = {t.name: t for t in every}
    held = {n for names in item.missed.values() for n in names}
    unknown = sorted(held - set(by_name))
    if unknown:
        raise DataError(f"missed functions {unknown} are not in the docs of {list(item.involved_classes)}",
                        item=item.id, field="missed_function")
    visible = tuple(t.with_(description=t.description + PYTHON_NOTE) for t in every if t.name not in held)
    return visible, {k: tuple(by_name[n] for n in names) for k, names in sorted(item.missed.items())}


@functools.lru_cache(maxsize=256)
def _signature(class_name: str, method: str) -> inspect.Signature | None:
    import importlib

    *_, config = _bfcl()
    cls = getattr(importlib.import_module(config.CLASS_FILE_PATH_MAPPING[class_name]), class_name)
    fn = getattr(cls, method, None)
    return inspect.signature(fn) if callable(fn) and not method.startswith("_") else None


def parse_call(text: str, classes: Sequence[str], *, item: str = "") -> Call:
    """A ground-truth call string (`mv(source='a', destination='b')`, positional arguments allowed) as a
    Call with keyword arguments, positional ones named by the executing method's signature."""
    try:
        node = ast.parse(text, mode="eval").body
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            raise ValueError("not a call of a plain name")
        name = node.func.id
        sig = next((s for c in classes if (s := _signature(c, name)) is not None), None)
        if sig is None:
            raise ValueError(f"no class of {list(classes)} has a method {name!r}")
        params = [p for p in sig.parameters if p != "self"]
        if len(node.args) > len(params):
            raise ValueError(f"{len(node.args)} positional arguments for {len(params)} parameters")
        args = {params[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
        args.update({k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg is not None})
    except (SyntaxError, ValueError) as e:
        raise DataError(f"cannot read the ground-truth call {text!r}: {e}", item=item,
                        field="ground_truth") from None
    return Call(name, args)


def ground_truth_calls(item: BFCLItem) -> list[list[Call]]:
    """The item's ground truth per turn as keyword Calls."""
    return [[parse_call(s, item.involved_classes, item=item.id) for s in turn] for turn in item.ground_truth]


_JSON = (str, int, float, bool, type(None))


def _plain(value: Any) -> bool:
    if isinstance(value, _JSON):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, Mapping):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def call_text(call: Call) -> str:
    """The call as BFCL's handlers write it for execution (`convert_to_function_call`); ValueError for an
    argument name that is not an identifier or a value that is not JSON data (never evaluated)."""
    for k, v in call.arguments.items():
        if not isinstance(k, str) or not k.isidentifier() or keyword.iskeyword(k):
            raise ValueError(f"argument name {k!r} is not a Python identifier")
        if not _plain(v):
            raise ValueError(f"argument {k!r} is not JSON data: {v!r}"[:200])
    return f"{call.name}({','.join(f'{k}={v!r}' for k, v in call.arguments.items())})"


def _drop_instances(prefix: str) -> None:
    """Delete the instances BFCL's execution cached under `prefix` in its module globals."""
    utils, *_ = _bfcl()
    space = vars(utils)
    for key in [k for k in space if k.startswith(prefix)]:
        del space[key]


def check_episode(item: BFCLItem, executed: Sequence[Sequence[str]]) -> dict[str, Any]:
    """BFCL's verdict on the executed calls per turn (`executed[t]` the call strings of turn t): the
    force-termination check, then `multi_turn_checker` (each call as its own step; the checker runs a
    turn's steps in order on the same instances, so grouping does not change its verdict)."""
    _, checker, *_ = _bfcl()
    if len(executed) != len(item.ground_truth):
        return {"valid": False, "error_type": "multi_turn:force_terminated",
                "error_message": f"Model was force-terminated during inference phase. The length of the "
                                 f"model result turns ({len(executed)}) does not match the length of the "
                                 f"ground truth turns ({len(item.ground_truth)})."}
    name = f"cipr_check_{uuid.uuid4().hex}"
    try:
        return checker.multi_turn_checker([[[c] for c in turn] for turn in executed],
                                          [list(t) for t in item.ground_truth], item.entry(), item.category,
                                          name)
    finally:
        _drop_instances(name)


def turn_checks(item: BFCLItem, executed: Sequence[Sequence[str]]) -> tuple[bool | None, ...]:
    """Per turn of the ground truth: the checker on the first k turns passes (True) or not (False); None
    after the first failure and for turns never reached."""
    out: list[bool | None] = []
    for k in range(1, len(item.ground_truth) + 1):
        if k > len(executed):
            break
        ok = bool(check_episode(_prefix(item, k), executed[:k])["valid"])
        out.append(ok)
        if not ok:
            break
    return tuple(out) + (None,) * (len(item.ground_truth) - len(out))


def _prefix(item: BFCLItem, k: int) -> BFCLItem:
    return BFCLItem(item.id, item.category, item.turns[:k], item.initial_config, item.involved_classes,
                    {t: v for t, v in item.missed.items() if t < k}, item.ground_truth[:k])


class BFCLMultiTurn:
    """One BFCL multi-turn episode at a time (`reset` starts the next; module docstring)."""

    name = "bfcl_multi_turn"

    def __init__(self, config: BFCLMultiTurnConfig | None = None) -> None:
        self.config = config or BFCLMultiTurnConfig()
        self.limits = EpisodeLimits(self.config.max_turns, self.config.max_calls,
                                    self.config.max_steps_per_turn)
        self.items = load_items(self.config.data_root, tuple(self.config.categories))
        self._item: BFCLItem | None = None
        self._tools: list[Tool] = []
        self._visible: tuple[Tool, ...] = ()
        self._reveal: dict[int, tuple[Tool, ...]] = {}
        self._declared: set[str] = set()
        self._turn = 0
        self._executed: list[list[str]] = []
        self._prefix = ""
        self._over = False

    # ------------------------------------------------------------------ the protocol
    @property
    def interface(self) -> Interface:
        return Interface(tuple(self._tools))

    @property
    def declared(self) -> Interface:
        """Every tool of the item's docs: those shown, then the withheld ones in the order of their turns."""
        return Interface((*self._visible, *(t for ts in self._reveal.values() for t in ts)))

    @property
    def turn(self) -> int:
        return self._turn

    @property
    def item(self) -> BFCLItem:
        if self._item is None:
            raise RuntimeError("bfcl_multi_turn: no episode started (call reset)")
        return self._item

    def tasks(self, split: str) -> list[str]:
        """Item ids of the configured categories whose number is in `split` (module docstring)."""
        check_split(split, "bfcl_multi_turn")
        numbers = sorted({it.number for it in self.items.values()})
        n_held = max(1, round(self.config.heldout_fraction * len(numbers)))
        held = set(random.Random(f"bfcl-multi-turn-split:{self.config.split_seed}").sample(numbers, n_held))
        return [i for i, it in self.items.items() if (it.number in held) == (split == "heldout")]

    def reset(self, task_id: Any) -> str:
        """Start item `task_id` from its initial_config; returns its first user message."""
        if str(task_id) not in self.items:
            raise KeyError(f"bfcl_multi_turn: no item {task_id!r} in categories {self.config.categories}")
        self.close()
        item = self._item = self.items[str(task_id)]
        self._visible, self._reveal = item_tools(item, self.config.data_root)
        self._declared = {t.name for t in self.declared}
        self._tools, self._turn, self._executed, self._over = list(self._visible), 0, [[]], False
        self._prefix = f"cipr_{uuid.uuid4().hex}"
        self._execute([])  # loads the instances from initial_config, as BFCL's inference does first
        first = item.turns[0]
        if first is None:
            raise DataError("the first turn has no user message", item=item.id, field="question[0]")
        return first

    def step(self, call: Call) -> StepResult:
        """Execute one call through BFCL's execution; refused unless `declared` holds its name."""
        if call.name not in self._declared:
            return StepResult(no_such_tool(call.name), valid=False)
        if self._over:
            return StepResult("Error: the episode is over.", valid=False)
        try:
            text = call_text(call)
        except ValueError as e:
            return StepResult(f"Error: the call was not executed: {e}", valid=False)
        result = self._execute([text])[0]
        self._executed[-1].append(text)
        return StepResult(result)

    def end_turn(self, text: str) -> str | None:
        """The next user turn's message (BFCL's reveal prompt on a miss_func turn), or None after the last."""
        item = self.item
        if self._over or self._turn + 1 >= len(item.turns):
            self._over = True
            return None
        self._turn += 1
        self._executed.append([])
        if self._turn in self._reveal:
            *_, prompts, _ = _bfcl()
            self._tools.extend(self._reveal[self._turn])
            return prompts.DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
        message = item.turns[self._turn]
        if message is None:
            raise DataError("a turn without a user message that reveals no function", item=item.id,
                            field=f"question[{self._turn}]")
        return message

    def score(self) -> EpisodeScore:
        """BFCL's verdict and the per-turn checks (module docstring)."""
        item = self.item
        verdict = check_episode(item, self._executed)
        turns = turn_checks(item, self._executed)
        passed = next((k for k, ok in enumerate(turns) if ok is not True), len(turns))
        valid = bool(verdict["valid"])
        reward = float(valid) if self.config.reward == "episode" else (1.0 if valid else passed / len(turns))
        details = {"valid": valid, "error_type": verdict.get("error_type"),
                   "error_message": verdict.get("error_message"), "turns_passed": passed,
                   "executed": [list(t) for t in self._executed]}
        return EpisodeScore(reward, valid, turns, details)

    # ------------------------------------------------------------------ execution
    @property
    def executed(self) -> list[list[str]]:
        """The call strings executed so far, per user turn (what the checker reads)."""
        return [list(t) for t in self._executed]

    def _execute(self, calls: list[str]) -> list[str]:
        utils, *_ = _bfcl()
        item = self.item
        results, _ = utils.execute_multi_turn_func_call(
            calls, dict(item.initial_config), list(item.involved_classes), self._prefix, item.id,
            long_context=item.long_context, is_evaL_run=False)  # it deep-copies each class's config
        return results

    def close(self) -> None:
        """Drop this episode's API instances (BFCL keeps them in its module globals)."""
        if self._prefix:
            _drop_instances(self._prefix)
            self._prefix = ""

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
