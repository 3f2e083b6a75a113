"""The `messages` + `tools` source (cipr/data/messages.py) on the shipped ten-row example file.

Expectations are counted by hand from tests/data/messages_example.jsonl: 10 rows; the flights row is
multi-turn (search, tool result, book, tool result, final answer: 3 examples), the translate row
answers without a call, the stocks row makes two parallel calls; every other row makes one call.
So 12 examples: 10 that call (9 with one call, 1 with two) and 2 that answer without one. Tools
per row: 2, 3, 3, 2, 4, 2, 2, 3, 2, 3 (min 2, mean 2.6, max 4). Rows 5 and 6 have no `id`.
"""

from __future__ import annotations

import copy
import json
from collections import Counter
from pathlib import Path

import pytest

from cipr.core.errors import ConfigError, DataError
from cipr.core.io import read_jsonl
from cipr.data.messages import BadRow, load_messages, messages_stats
from cipr.perturb.config import PerturbConfig
from cipr.tools.canonical import canonicalize
from cipr.tools.interface import Call, Example, Message

EXAMPLE = Path(__file__).resolve().parent / "data" / "messages_example.jsonl"
ROWS = read_jsonl(EXAMPLE)


def by_id(examples: list[Example]) -> dict[str, Example]:
    return {e.id: e for e in examples}


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_example_file_counts():
    data = load_messages(EXAMPLE)
    assert messages_stats(data) == {
        "rows": 10, "rows_used": 10, "examples": 12, "call_examples": 10, "no_call_examples": 2,
        "tools_per_row": {"min": 2, "mean": 2.6, "max": 4}, "calls_per_turn": {"1": 9, "2": 1},
        "parallel_turns": 1, "skipped_rows": {}, "skip_details": {},
    }
    assert [e.id for e in data.examples] == [
        "weather-1_m1", "stocks-1_m1", "flights-1_m2", "flights-1_m4", "flights-1_m6", "translate-1_m1",
        "messages_example_4_m1", "messages_example_5_m1", "recipes-1_m1", "orders-1_m1",
        "places-1_m2", "web-1_m1"]
    assert {e.source for e in data.examples} == {"messages"}
    assert {e.partition for e in data.examples} == {"messages_example"}


def test_reference_calls_and_prompts():
    ex = by_id(load_messages(EXAMPLE).examples)
    # arguments given as a JSON string
    assert ex["weather-1_m1"].reference == (Call("get_current_weather", {"location": "Lisbon, Portugal",
                                                                         "unit": "celsius"}),)
    assert ex["weather-1_m1"].messages == \
        (Message("user", "What's the weather like in Lisbon right now, in celsius?"),)
    assert ex["weather-1_m1"].response is None
    # a parallel turn, arguments given as objects
    assert ex["stocks-1_m1"].reference == (Call("get_stock_price", {"symbol": "AAPL"}),
                                           Call("get_stock_price", {"symbol": "MSFT"}))
    # arguments as objects, the bare {name, description, parameters} tool form
    assert ex["messages_example_5_m1"].reference == (
        Call("calculate_mortgage_payment", {"principal": 350000, "annual_rate": 6.5, "years": 30}),)
    assert ex["messages_example_5_m1"].interface.names == ("calculate_mortgage_payment", "convert_currency")
    assert ex["recipes-1_m1"].reference[0].arguments["ingredients"] == ["chickpeas", "spinach"]


def test_multi_turn_row():
    ex = by_id(load_messages(EXAMPLE).examples)
    first, second, last = ex["flights-1_m2"], ex["flights-1_m4"], ex["flights-1_m6"]
    assert [m.role for m in first.messages] == ["system", "user"]
    assert first.reference == \
        (Call("search_flights", {"origin": "BOS", "destination": "ORD", "date": "2024-06-14"}),)
    assert first.meta["content"] == "Let me look for flights first."
    # the second call's prompt holds the first turn and its result; the tool message is named by tool_call_id
    assert [m.role for m in second.messages] == ["system", "user", "assistant", "tool"]
    assert second.messages[2] == Message("assistant", "Let me look for flights first.", first.reference)
    assert second.messages[3].name == "search_flights" and "UA512" in second.messages[3].content
    assert second.reference == (Call("book_flight", {"flight_id": "UA512", "passenger_name": "Dana Reyes"}),)
    # the final answer after the tool result is an example that makes no call
    assert last.reference == () and last.response.startswith("You're booked on UA512")
    assert [m.name for m in last.messages if m.role == "tool"] == ["search_flights", "book_flight"]
    assert ex["translate-1_m1"].reference == () and \
        ex["translate-1_m1"].response == "You're welcome! Have a great day."


def test_canonicalization_renames_earlier_calls_and_tool_messages():
    last = by_id(load_messages(EXAMPLE).examples)["flights-1_m6"]
    canon, nmap = canonicalize(last)
    assert canon.interface.names == ("function_01", "function_02", "function_03")
    calls = [c for m in canon.messages for c in m.calls]
    assert calls == [Call("function_01", {"arg_01": "BOS", "arg_02": "ORD", "arg_03": "2024-06-14"}),
                     Call("function_02", {"arg_01": "UA512", "arg_02": "Dana Reyes"})]
    assert [m.name for m in canon.messages if m.role == "tool"] == ["function_01", "function_02"]
    text = json.dumps([m.to_dict() for m in canon.messages])
    assert "search_flights" not in text and "book_flight" not in text
    # book_flight's description names search_flights: the schemas are renamed like the messages
    assert canon.interface[1].description == "Book a seat on a flight found by function_01."
    assert "search_flights" not in json.dumps(canon.interface.to_openai())
    assert nmap.translate_back(calls[1]) == \
        Call("book_flight", {"flight_id": "UA512", "passenger_name": "Dana Reyes"})


# ---------------------------------------------------------------- malformed rows


def _flights() -> dict:
    return copy.deepcopy(ROWS[2])


def _set(path: tuple, value):
    def change(row: dict) -> dict:
        target = row
        for key in path[:-1]:
            target = target[key]
        if value is KeyError:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return row
    return change


BAD = [  # (how the flights row is broken, field named, reason counted in skip mode)
    (_set(("messages", 2, "tool_calls", 0, "function", "arguments"), '{"origin": "BOS",'),
     "messages[2].tool_calls[0].function.arguments", "arguments not valid JSON"),
    (_set(("messages", 4, "tool_calls", 0, "function", "arguments"), "[1, 2]"),
     "messages[4].tool_calls[0].function.arguments", "arguments not an object"),
    (_set(("messages", 4, "tool_calls", 0, "function", "arguments"), ["UA512"]),
     "messages[4].tool_calls[0].function.arguments", "arguments not an object"),
    (_set(("messages", 4, "tool_calls", 0, "function", "name"), "cancel_flight"),
     "messages[4].tool_calls[0].function.name", "call to undeclared tool"),
    (_set(("messages", 3, "tool_call_id"), "call_9"), "messages[3].tool_call_id", "unknown tool_call_id"),
    (_set(("messages", 1, "role"), "human"), "messages[1].role", "unknown role"),
    (_set(("messages", 6, "content"), [{"type": "image_url", "image_url": "x"}]), "messages[6].content",
     "non-text content"),
    (_set(("tools",), KeyError), "tools", "missing tools"),
    (_set(("tools", 1, "function", "parameters"), {"type": "array"}), "tools[1]", "malformed tool"),
    (_set(("tools", 2, "function", "name"), "search_flights"), "tools", "duplicate tool name"),
    (_set(("messages",), [{"role": "user", "content": "Hi"}]), "messages", "no assistant turn"),
    (_set(("messages",), []), "messages", "missing messages"),
]


@pytest.mark.parametrize("change,field,kind", BAD, ids=[b[2] + f"#{i}" for i, b in enumerate(BAD)])
def test_bad_row_error_names_file_line_and_field(tmp_path, change, field, kind):
    path = write_jsonl(tmp_path / "mine.jsonl", [ROWS[0], "", change(_flights())])  # a blank line 2
    with pytest.raises(BadRow) as ei:
        load_messages(path)
    e = ei.value
    assert isinstance(e, DataError)
    assert (e.file, e.item, e.field, e.kind) == (str(path), "line 3", field, kind)
    assert "\n" not in str(e) and f"file '{path}', item 'line 3', field '{field}'" in str(e)
    assert str(e).endswith("on_bad_row=skip (cipr-train: data.on_bad_row=skip) counts and skips such rows "
                           "instead")


def test_an_evaluation_refuses_a_bad_row_without_offering_to_skip_it(tmp_path):
    """cipr-eval has no skip option: its denominator is the file, so the message says to fix the row."""
    from cipr.eval.benchmarks import load_examples
    from cipr.eval.config import BenchmarkConfig, EvalConfig

    path = write_jsonl(tmp_path / "mine.jsonl", [ROWS[0], ROWS[0] | {"tools": 3}])
    cfg = EvalConfig(benchmark=BenchmarkConfig(name="messages", path=str(path)))
    with pytest.raises(DataError) as ei:
        load_examples(cfg)
    assert (ei.value.file, ei.value.item, ei.value.field) == (str(path), "line 2", "tools")
    assert "on_bad_row" not in str(ei.value) and str(ei.value).endswith("so fix or remove this one")


def test_whole_row_problems(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", [ROWS[0], '{"messages": [', "[1, 2]", ROWS[0]])
    with pytest.raises(BadRow, match=r"item 'line 2': not valid JSON"):
        load_messages(path)
    data = load_messages(path, on_bad_row="skip")
    assert data.skipped == Counter({"row not valid JSON": 1, "row not an object": 1, "duplicate id": 1})
    assert data.skip_details["duplicate id"] == [
        f"file '{path}', item 'line 4', field 'id': id 'weather-1' is used by an earlier row"]
    json_list = tmp_path / "mine.json"
    json_list.write_text(json.dumps([ROWS[0], _set(("messages", 1, "role"), "bot")(_flights())]))
    with pytest.raises(BadRow, match=r"item 'row 1', field 'messages\[1\]\.role'"):
        load_messages(json_list)


def test_skip_mode_counts_every_bad_row(tmp_path):
    rows = [r for r in ROWS] + [change(_flights()) for change, _, _ in BAD]
    for i, r in enumerate(rows[10:]):
        r["id"] = f"bad-{i}"
    path = write_jsonl(tmp_path / "mixed.jsonl", rows)
    data = load_messages(path, on_bad_row="skip")
    assert data.rows == 10 + len(BAD) and len(data.examples) == 12
    assert data.skipped == Counter(kind for _, _, kind in BAD)
    stats = messages_stats(data)
    assert stats["rows_used"] == 10 and sum(stats["skipped_rows"].values()) == len(BAD)
    with pytest.raises(ValueError, match="on_bad_row"):
        load_messages(path, on_bad_row="ignore")  # type: ignore[arg-type]


def test_tool_message_names_and_call_forms(tmp_path):
    row = _flights()
    del row["messages"][5]["name"]  # named by its tool_call_id
    del row["messages"][3]["tool_call_id"]  # no name, no id: the single call of the turn before
    row["messages"][4]["tool_calls"][0] = {"id": "call_2", "name": "book_flight",  # a bare call
                                           "arguments": {"flight_id": "UA512"}}
    row["tools"] = json.dumps(row["tools"])  # tools as a JSON string
    row["messages"][1]["content"] = [{"type": "text", "text": "Book it."},
                                     {"type": "text", "text": "Thanks."}]
    row["messages"][0]["role"] = "developer"
    ex = load_messages(write_jsonl(tmp_path / "forms.jsonl", [row])).examples
    assert [m.name for m in ex[-1].messages if m.role == "tool"] == ["search_flights", "book_flight"]
    assert ex[1].reference == (Call("book_flight", {"flight_id": "UA512"}),)
    assert ex[0].messages[0].role == "system" and ex[0].messages[1].content == "Book it.\nThanks."
    bare = _flights()
    bare["messages"][4]["tool_calls"][0] = {"name": "book_it", "arguments": {}}
    with pytest.raises(BadRow, match=r"field 'messages\[4\]\.tool_calls\[0\]\.name'"):
        load_messages(write_jsonl(tmp_path / "bare.jsonl", [bare]))


# ---------------------------------------------------------------- file formats


def _without_location(examples: list[Example]) -> list[Example]:
    return [e.with_(meta={k: v for k, v in e.meta.items() if k not in ("file", "item")}) for e in examples]


def _ordered(examples: list[Example]) -> str:
    """Every example as JSON with key order kept (argument order decides canonical ids)."""
    return json.dumps([[e.id, [m.to_dict() for m in e.messages], e.interface.to_openai(),
                        [c.to_dict() for c in e.reference], e.response] for e in examples])


def _columnar(row: dict) -> dict:
    """A row as Hub datasets store it: `tools` and every call's arguments as JSON strings."""
    row = copy.deepcopy(row)
    row["tools"] = json.dumps(row["tools"])
    for m in row["messages"]:
        for c in m.get("tool_calls") or []:
            if not isinstance(c["function"]["arguments"], str):
                c["function"]["arguments"] = json.dumps(c["function"]["arguments"])
    return row


def test_formats_give_identical_examples(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets import Dataset

    reference = load_messages(EXAMPLE).examples
    (tmp_path / "json").mkdir()
    as_json = tmp_path / "json" / "messages_example.json"
    as_json.write_text(json.dumps(ROWS, indent=1))
    (tmp_path / "parquet").mkdir()
    as_parquet = tmp_path / "parquet" / "messages_example.parquet"
    pq.write_table(pa.Table.from_pylist([_columnar(r) for r in ROWS]), as_parquet)
    saved = tmp_path / "saved" / "messages_example"
    Dataset.from_list([_columnar(r) for r in ROWS]).save_to_disk(str(saved))
    folder = tmp_path / "folder"
    (folder / "train").mkdir(parents=True)
    (folder / "train" / "messages_example.jsonl").write_text(EXAMPLE.read_text())
    for path in (as_json, as_parquet, saved, folder):
        loaded = load_messages(path).examples
        assert _without_location(loaded) == _without_location(reference), path
        assert _ordered(loaded) == _ordered(reference), path
    assert load_messages(as_parquet).examples[0].meta["item"] == "row 0"


def test_struct_columns_lose_no_values(tmp_path):
    """Tools kept as Arrow structs: the nulls the struct union adds are dropped (key order may change:
    the module docstring says to store tools as JSON strings)."""
    from datasets import Dataset

    rows = [_columnar(r) for r in ROWS]
    for r, orig in zip(rows, ROWS, strict=True):
        r["tools"] = orig["tools"]
    path = tmp_path / "messages_example.parquet"
    Dataset.from_list(rows).to_parquet(str(path))
    assert _without_location(load_messages(path).examples) == \
        _without_location(load_messages(EXAMPLE).examples)


def test_missing_and_unsupported_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        load_messages(tmp_path / "nothing.jsonl")
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported file type '.csv'"):
        load_messages(tmp_path / "rows.csv")
    with pytest.raises(DataError, match="holds no .jsonl"):
        load_messages(tmp_path)
    (tmp_path / "obj.json").write_text("{}")
    with pytest.raises(DataError, match="expected a JSON list"):
        load_messages(tmp_path / "obj.json")


# ---------------------------------------------------------------- training, evaluation and the command


class _ChatStub:
    """A tokenizer stand-in whose chat template joins the messages (no tools=): enough for build_prompts."""

    chat_template = ""

    def apply_chat_template(self, chat, **kwargs):
        return "".join(f"<{m['role']}>{m['content']}\n" for m in chat) + "<assistant>"


def test_training_source(tmp_path):
    from cipr.formats import get_format
    from cipr.train.data import DataConfig, build_prompts, check_source, load_examples, load_source

    cfg = DataConfig(source="messages", path=str(EXAMPLE), n=0, eval_examples=2)
    examples = load_examples(cfg)
    assert _without_location(examples) == _without_location(load_messages(EXAMPLE).examples)
    assert len(load_examples(DataConfig(source="messages", path=str(EXAMPLE), n=5))) == 5
    prompts = build_prompts(examples, cfg, PerturbConfig(names="canonical", paired=True),
                            fmt=get_format("toolrl"),
                            tokenizer=_ChatStub())
    assert len(prompts.records) == 2 * (12 - 2) and not prompts.skipped
    records = [r for r in prompts.records + prompts.eval_records if r.example.id == "flights-1_m6"]
    # history calls and results renamed
    assert records and all("book_flight" not in r.prompt for r in records)
    bad = write_jsonl(tmp_path / "bad.jsonl", ROWS + [_set(("messages", 1, "role"), "bot")(_flights())])
    skip = DataConfig(source="messages", path=str(bad), n=0, eval_examples=2, on_bad_row="skip")
    examples, skipped = load_source(skip)
    assert len(examples) == 12 and skipped == Counter({"bad row: unknown role": 1})
    prompts = build_prompts(examples, skip, PerturbConfig(names="original", paired=False),
                            fmt=get_format("toolrl"),
                            tokenizer=_ChatStub(), skipped=skipped)
    assert prompts.skipped == Counter({"bad row: unknown role": 1})
    with pytest.raises(BadRow):
        load_examples(DataConfig(source="messages", path=str(bad)))
    assert check_source(DataConfig(source="messages", path=str(tmp_path))) == tmp_path  # a folder is fine
    with pytest.raises(ConfigError, match="needs data.path"):
        check_source(DataConfig(source="messages"))
    with pytest.raises(ConfigError, match="does not exist"):
        check_source(DataConfig(source="messages", path=str(tmp_path / "no.jsonl")))
    with pytest.raises(ConfigError, match="on_bad_row"):
        check_source(DataConfig(source="toolrl", path=str(EXAMPLE), on_bad_row="skip"))


def test_training_config_file():
    import yaml

    from cipr.core.config import from_dict
    from cipr.train.data import DataConfig

    root = Path(__file__).resolve().parents[1]
    cfg = from_dict(DataConfig, yaml.safe_load((root / "configs/train/data/messages.yaml").read_text()))
    assert (cfg.source, cfg.on_bad_row, cfg.n) == ("messages", "raise", 0)


def test_benchmark(tmp_path):
    import yaml

    from cipr.eval.benchmarks import BuildReport, build_items, load_examples, resolve_perturbations
    from cipr.eval.config import eval_config_from_dict

    root = Path(__file__).resolve().parents[1]
    bench = yaml.safe_load((root / "configs/eval/benchmark/messages.yaml").read_text())
    cfg = eval_config_from_dict({"benchmark": {**bench, "path": str(EXAMPLE)}, "out_dir": str(tmp_path)})
    examples = load_examples(cfg)
    assert [e.id for e in examples] == [e.id for e in load_messages(EXAMPLE).examples]
    perts = resolve_perturbations(["original", "held_out"], cfg)
    report = BuildReport()
    items = build_items(examples, perts, ["original", "canonical"], 0, report)
    built = {(i.perturbation, i.names) for i in items}
    assert {("original", "original"), ("original", "canonical")} <= built
    assert len({p for p, _ in built}) > 10  # most held-out types apply to these examples
    no_path = eval_config_from_dict({"benchmark": bench, "out_dir": str(tmp_path)})
    with pytest.raises(ConfigError, match="benchmark.path"):
        load_examples(no_path)


def test_stats_command(capsys, tmp_path):
    from cipr.cli.data import main

    assert main(["stats", "source=messages", f"path={EXAMPLE}"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["rows"], out["examples"], out["no_call_examples"], out["calls_per_turn"]) == \
        (10, 12, 2, {"1": 9, "2": 1})
    bad = write_jsonl(tmp_path / "bad.jsonl", ROWS + ["not json"])
    assert main(["stats", "source=messages", f"path={bad}", "on_bad_row=skip"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped_rows"] == {"row not valid JSON": 1}
    assert main(["stats", "source=messages", f"path={bad}"]) == 2
    assert "item 'line 11'" in capsys.readouterr().err
    assert main(["stats", "source=messages"]) == 2
    assert "path=FILE_OR_DIR" in capsys.readouterr().err


@pytest.mark.parametrize("overrides", [["data=messages"], ["data.source=messages"]])
def test_train_command_config(overrides):
    """`cipr-train data=messages data.path=FILE` (or `data.source=messages`) composes and validates."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from cipr.cli.train import CONFIG_DIR
    from cipr.train.run import config_from_dict, validate

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        composed = compose("train", overrides=[*overrides, f"data.path={EXAMPLE}", "data.on_bad_row=skip"])
    cfg = config_from_dict(OmegaConf.to_container(composed, resolve=True))
    assert (cfg.data.source, cfg.data.path, cfg.data.on_bad_row) == ("messages", str(EXAMPLE), "skip")
    validate(cfg)
