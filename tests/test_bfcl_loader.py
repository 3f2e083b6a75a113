"""BFCL v4 loader on the real data (counts, fields, anomalies, speed), bad input, and the wheel fetch."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest

from cipr.core.errors import DataError
from cipr.data.bfcl import PARTITIONS, TOTAL, BfclReport, bfcl_prompt_tool, bfcl_stats, load_bfcl
from cipr.data.fetch import BFCL_EVAL_SHA256, FetchError, download_wheel, fetch_bfcl
from cipr.tools.interface import Call

EXPECTED = {"live_multiple": 1053, "simple_python": 400, "live_simple": 258, "multiple": 200, "parallel": 200,
            "parallel_multiple": 200, "simple_java": 100, "simple_javascript": 50,
            "live_parallel_multiple": 24, "live_parallel": 16}

# Every place where BFCL's answers contradict their own schemas (kept, reported, never dropped).
EXPECTED_ANOMALIES = {
    ("live_multiple_862-181-3", "undeclared_argument",
     "ground_truth[0].Trains_1_FindTrains.journey_start_time"),
    ("live_multiple_964-207-0", "undeclared_argument", "ground_truth[0].transfer_to_human_agent.question"),
    ("live_multiple_964-207-0", "required_not_in_answer",
     "ground_truth[0].transfer_to_human_agent.statement"),
    ("parallel_multiple_12", "undeclared_argument",
     "ground_truth[1].calculate_voltage_difference.permeability"),
    ("parallel_multiple_26", "undeclared_argument", "ground_truth[1].bank.calculate_balance.type"),
    ("live_simple_106-63-0", "empty_accepted", "ground_truth[0].record.auto_loan_payment_start"),
    ("live_simple_106-63-0", "empty_accepted", "ground_truth[0].record.bank_hours_start"),
    ("live_simple_112-68-0", "empty_accepted", "ground_truth[0].record.acc_routing_start"),
    ("live_simple_112-68-0", "empty_accepted", "ground_truth[0].record.atm_finder_start"),
    ("live_simple_112-68-0", "empty_accepted", "ground_truth[0].record.faq_link_accounts_start"),
    ("live_simple_112-68-0", "empty_accepted", "ground_truth[0].record.get_balance_start"),
    ("live_simple_112-68-0", "empty_accepted", "ground_truth[0].record.get_transactions_start"),
    ("simple_java_64", "non_list_accepted",
     "ground_truth[0].DateScriptFieldType.createFieldType.meta.format"),
}


@pytest.fixture(scope="module")
def loaded(shared_data):
    report = BfclReport()
    t0 = time.perf_counter()
    examples = load_bfcl(shared_data, report=report)
    return examples, report, time.perf_counter() - t0


@pytest.fixture(scope="module")
def by_id(loaded):
    return {e.id: e for e in loaded[0]}


def test_counts_per_partition_and_total(loaded):
    examples, report, _ = loaded
    assert PARTITIONS == EXPECTED and TOTAL == 2501
    assert len(examples) == 2501
    assert report.counts == EXPECTED
    assert {p: sum(1 for e in examples if e.partition == p) for p in EXPECTED} == EXPECTED
    assert len({e.id for e in examples}) == 2501
    assert report.skipped == []


def test_loading_is_fast(loaded):
    assert loaded[2] < 2.0, f"loading took {loaded[2]:.2f} s"


def test_anomalies_are_reported_not_dropped(loaded, by_id):
    _, report, _ = loaded
    assert {(item, kind, field) for item, kind, field, _ in report.anomalies} == EXPECTED_ANOMALIES
    assert report.anomaly_counts() == \
        {"undeclared_argument": 4, "required_not_in_answer": 1, "empty_accepted": 7, "non_list_accepted": 1}
    assert "undeclared_argument: ground_truth[0].Trains_1_FindTrains.journey_start_time" in \
        by_id["live_multiple_862-181-3"].meta["anomalies"]
    assert by_id["live_multiple_862-181-3"].reference[0].arguments["journey_start_time"] == "09:00"
    assert by_id["live_simple_106-63-0"].reference[0].arguments["bank_hours_start"] == []
    assert "anomalies" not in by_id["simple_python_0"].meta


def test_bfcl_stats(shared_data):
    stats = bfcl_stats(shared_data)
    assert stats["partitions"] == EXPECTED and stats["total"] == 2501 and stats["skipped"] == 0
    assert sum(stats["anomalies"].values()) == len(EXPECTED_ANOMALIES)
    json.dumps(stats)


def test_example_fields(by_id):
    ex = by_id["simple_python_0"]
    assert ex.source == "bfcl" and ex.partition == "simple_python" and ex.meta["language"] == "python"
    assert [m.role for m in ex.messages] == ["user"] and "triangle" in ex.messages[0].content
    assert ex.interface.names == ("calculate_triangle_area",)
    params = ex.interface[0].parameters
    assert params["type"] == "object" and params["x-bfcl-type"] == "dict"
    assert ex.accepted == ({"base": (10,), "height": (5,), "unit": ("units", "")},)
    # "unit" accepts "" and is not required: omitted from the reference
    assert ex.reference == (Call("calculate_triangle_area", {"base": 10, "height": 5}),)


def test_system_messages_are_kept(loaded, by_id):
    ex = by_id["live_multiple_964-207-0"]
    assert [m.role for m in ex.messages] == ["system", "user"] and "Tipax" in ex.messages[0].content
    with_system = sum(1 for e in loaded[0] if e.messages[0].role == "system")
    assert with_system == 37 + 11 + 1  # live_multiple, live_simple, live_parallel


def test_reference_omission_rule(by_id):
    # "" accepted but the schema requires it: the first non-empty value is passed
    assert by_id["simple_python_17"].reference[0].arguments == {"number": 450, "formatted": True}
    assert by_id["live_multiple_144-56-0"].reference[0].arguments["perPage"] == 100
    # "" is the only accepted value of a required argument: it is passed as ""
    assert by_id["live_multiple_507-149-4"].reference[0].arguments["origin_airport"] == ""
    # optional arguments ("" accepted, not required) are left out
    assert "airlines" not in by_id["live_multiple_507-149-4"].reference[0].arguments


def test_parallel_and_nested_references(by_id):
    par = by_id["parallel_0"]
    assert [c.arguments for c in par.reference] == [{"artist": "Taylor Swift", "duration": 20},
                                                   {"artist": "Maroon 5", "duration": 15}]
    # dict values and the dicts of a list of dicts are unwrapped from their accepted lists, one level deep
    assert by_id["live_multiple_121-46-0"].reference[0].arguments == {
        "ego_info": {"position": {"lateral": 10.5, "longitudinal": 50}, "orientation": 30},
        "lane_info": {"lane_id": "L123", "lane_type": "regular"},
        "bounding_boxes": [{"x": 60.2, "y": 12.3}]}
    assert by_id["live_multiple_63-25-0"].reference[0].arguments["items"] == [
        {"item": "burgers", "quantity": 5}, {"item": "chicken wings", "quantity": 6}]


def test_java_and_javascript_references_are_source_literals(by_id):
    java = by_id["simple_java_22"]
    assert java.meta["language"] == "java"
    assert java.reference[0].arguments == {"ids": "new ArrayList<Long>(Arrays.asList(101L, 202L, 303L))",
                                           "newStatus": "2"}
    assert by_id["simple_java_1"].reference[0].arguments == {
        "object": "Customers", "useShortName": "true",
        "params": 'new HashMap<String, Object>() {{ put("limit", 50); put("schemaFilter", "public"); }}'}
    assert by_id["simple_java_25"].reference[0].arguments["id"] == "42L"
    js = by_id["simple_javascript_13"]
    assert js.meta["language"] == "javascript"
    assert js.reference[0].arguments == {"userData": '["userDataArray"]', "scalingFactor": "3.0",
                                         "dashboard": "dashboardElement"}
    assert by_id["simple_javascript_0"].reference[0].arguments["isComplete"] == "true"


def test_prompt_view_of_java_and_javascript_tools(by_id):
    java = by_id["simple_java_22"].interface[0]
    shown = bfcl_prompt_tool(java, "java")
    assert shown.description.endswith(" Note that the provided function is in Java 8 SDK syntax.")
    ids = shown.properties["ids"]
    assert ids["type"] == "string" and ids["x-bfcl-type"] == "ArrayList" and "items" not in ids
    assert ids["description"].endswith("This is Java ArrayList type parameter in string representation. The "
                                       "list elements are of type long; they are not in string "
                                       "representation.")
    assert java.properties["ids"]["type"] == "array"  # the Example's typed schema is untouched
    js = bfcl_prompt_tool(by_id["simple_javascript_5"].interface[0], "javascript")
    store = js.properties["store"]
    assert store["type"] == "string" and "properties" not in store and "initialState" in store["description"]
    assert js.properties["context"]["description"].endswith(
        "This parameter can be of any type of JavaScript object in string representation.")
    py = by_id["simple_python_0"].interface[0]
    assert bfcl_prompt_tool(py, "python").parameters == py.parameters


def test_partition_subset_and_unknown(shared_data):
    exs = load_bfcl(shared_data, ["simple_javascript", "live_parallel"])
    assert [e.partition for e in exs] == ["simple_javascript"] * 50 + ["live_parallel"] * 16
    with pytest.raises(ValueError, match="unknown BFCL partition"):
        load_bfcl(shared_data, ["irrelevance"])


def test_missing_data_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="cipr-data fetch data_root="):
        load_bfcl(tmp_path)


# ----------------------------------------------------------------------------------- bad input

def _question(qid="simple_python_0", functions=None, turns=None):
    functions = functions if functions is not None else [
        {"name": "area", "description": "Area.", "parameters": {
            "type": "dict", "properties": {"base": {"type": "integer"}, "unit": {"type": "string"}},
            "required": ["base"]}}]
    turns = turns if turns is not None else [[{"role": "user", "content": "Area of base 3?"}]]
    return {"id": qid, "question": turns, "function": functions}


def _answer(qid="simple_python_0", truth=None):
    return {"id": qid,
            "ground_truth": truth if truth is not None else [{"area": {"base": [3], "unit": ["", "m"]}}]}


def _write(root: Path, questions, answers, partition="simple_python", raw_question_lines=None) -> Path:
    base = root / "bfcl_v4"
    (base / "possible_answer").mkdir(parents=True, exist_ok=True)
    lines = raw_question_lines if raw_question_lines is not None else [json.dumps(q) for q in questions]
    (base / f"BFCL_v4_{partition}.json").write_text("\n".join(lines) + "\n")
    (base / "possible_answer" / f"BFCL_v4_{partition}.json").write_text(
        "\n".join(json.dumps(a) for a in answers))
    return base / f"BFCL_v4_{partition}.json"


def _load(root):
    return load_bfcl(root, ["simple_python"])


def test_small_valid_file(tmp_path):
    _write(tmp_path, [_question()], [_answer()])
    (ex,) = _load(tmp_path)
    assert ex.reference == (Call("area", {"base": 3}),)
    assert ex.interface[0].properties["base"] == {"type": "integer", "x-bfcl-type": "integer"}


def test_malformed_json_line(tmp_path):
    good = json.dumps(_question("simple_python_0"))
    bad = '{"id": "simple_python_1", "question": [[{"role": "user", "content": "x"}]], "function": ['
    path = _write(tmp_path, [], [_answer("simple_python_0"), _answer("simple_python_1")],
                  raw_question_lines=[good, bad])
    with pytest.raises(DataError) as e:
        _load(tmp_path)
    assert e.value.file == str(path) and e.value.item == "simple_python_1" and e.value.field == "line 2"
    assert "not valid JSON" in str(e.value)


def test_duplicate_tool_names(tmp_path):
    fn = _question()["function"][0]
    path = _write(tmp_path, [_question(functions=[fn, dict(fn)])], [_answer()])
    with pytest.raises(DataError, match="duplicate tool name 'area'") as e:
        _load(tmp_path)
    assert (e.value.file, e.value.item, e.value.field) == (str(path), "simple_python_0", "function[1].name")


@pytest.mark.parametrize("params", [["base"], {"type": "string"}, "dict"])
def test_schema_not_an_object(tmp_path, params):
    fn = {"name": "area", "description": "Area.", "parameters": params}
    _write(tmp_path, [_question(functions=[fn])], [_answer()])
    with pytest.raises(DataError) as e:
        _load(tmp_path)
    assert e.value.item == "simple_python_0" and e.value.field == "function[0].parameters"


def test_unknown_type_name(tmp_path):
    fn = {"name": "area", "description": "",
          "parameters": {"type": "dict", "properties": {"base": {"type": "intt"}}}}
    _write(tmp_path, [_question(functions=[fn])], [_answer()])
    with pytest.raises(DataError, match="unknown type 'intt'") as e:
        _load(tmp_path)
    assert e.value.field == "function[0].parameters.base.type"


def test_reference_to_undeclared_tool(tmp_path):
    _write(tmp_path, [_question()], [_answer(truth=[{"volume": {"base": [3]}}])])
    with pytest.raises(DataError, match="'volume', which the item does not declare") as e:
        _load(tmp_path)
    assert e.value.file.endswith("possible_answer/BFCL_v4_simple_python.json")
    assert (e.value.item, e.value.field) == ("simple_python_0", "ground_truth[0].volume")


def test_accepted_values_not_a_list(tmp_path):
    _write(tmp_path, [_question()], [_answer(truth=[{"area": {"base": 3}}])])
    with pytest.raises(DataError, match="accepted values must be a list") as e:
        _load(tmp_path)
    assert e.value.field == "ground_truth[0].area.base"


def test_empty_accepted_for_a_scalar(tmp_path):
    _write(tmp_path, [_question()], [_answer(truth=[{"area": {"base": []}}])])
    with pytest.raises(DataError, match="empty accepted-values list") as e:
        _load(tmp_path)
    assert e.value.field == "ground_truth[0].area.base"


def test_multi_turn_question_in_single_turn_partition(tmp_path):
    turns = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
    _write(tmp_path, [_question(turns=turns)], [_answer()])
    with pytest.raises(DataError, match="exactly one turn") as e:
        _load(tmp_path)
    assert e.value.field == "question"


def test_bad_message(tmp_path):
    _write(tmp_path, [_question(turns=[[{"role": "robot", "content": "a"}]])], [_answer()])
    with pytest.raises(DataError) as e:
        _load(tmp_path)
    assert e.value.field == "question[0][0]"


def test_answers_and_questions_must_line_up(tmp_path):
    _write(tmp_path, [_question()], [_answer(), _answer("simple_python_9")])
    with pytest.raises(DataError, match="answer\\(s\\) without a question") as e:
        _load(tmp_path)
    assert e.value.item == "simple_python_9"
    _write(tmp_path, [_question(), _question()], [_answer()])
    with pytest.raises(DataError, match="duplicate question id"):
        _load(tmp_path)


def test_question_without_answer_is_skipped_and_counted(tmp_path):
    path = _write(tmp_path, [_question(), _question("simple_python_1")], [_answer()])
    report = BfclReport()
    exs = load_bfcl(tmp_path, ["simple_python"], report=report)
    assert [e.id for e in exs] == ["simple_python_0"]
    assert report.skipped == [(str(path), "simple_python_1", "no reference answer")]
    assert report.to_json()["skipped"] == 1 and report.counts == {"simple_python": 1}


# ----------------------------------------------------------------------------------------- fetch

def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.integration
def test_fetch_matches_the_shared_copy(tmp_path, shared_data):
    """The full user path: pip download, hash check, extract; same files as ../shared/data/bfcl_v4."""
    target = fetch_bfcl(tmp_path / "data")
    assert target == tmp_path / "data" / "bfcl_v4"
    shared = shared_data / "bfcl_v4"
    files = sorted(p.relative_to(shared) for p in shared.rglob("*") if p.is_file() and p.name != "LICENSE")
    assert len(files) > 30
    for rel in files:
        assert _sha(target / rel) == _sha(shared / rel), rel
    assert not any(p.name.endswith(".py") for p in target.rglob("*"))  # only bfcl_eval/data/
    assert len(load_bfcl(tmp_path / "data")) == 2501
    with pytest.raises(FetchError, match="already exists"):
        fetch_bfcl(tmp_path / "data")


@pytest.mark.integration
def test_fetch_rejects_a_wheel_with_another_hash(tmp_path):
    wheel = download_wheel(tmp_path)
    tampered = tmp_path / "tampered" / wheel.name
    tampered.parent.mkdir()
    shutil.copy(wheel, tampered)
    with tampered.open("ab") as f:
        f.write(b"\0")
    with pytest.raises(FetchError, match="SHA-256 mismatch"):
        fetch_bfcl(tmp_path / "out", wheel=tampered)
    assert not (tmp_path / "out" / "bfcl_v4").exists()
    # the untouched wheel passes, and overwrite replaces an existing copy
    (tmp_path / "out" / "bfcl_v4").mkdir(parents=True)
    target = fetch_bfcl(tmp_path / "out", wheel=wheel, overwrite=True)
    assert (target / "possible_answer" / "BFCL_v4_simple_python.json").is_file()
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["bfcl_v4"]  # no staging folder left behind
    assert _sha(wheel) == BFCL_EVAL_SHA256


@pytest.mark.integration
def test_fetch_reports_a_failed_download(tmp_path):
    with pytest.raises(FetchError, match="pip download"):
        download_wheel(tmp_path, version="0.0.0.dev999")
