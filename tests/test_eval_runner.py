"""Runner on hand-built items with the replay backend: scoring, adapter, taxonomy, resume after a crash,
report and comparison outputs."""

from __future__ import annotations

import json

import pytest

from cipr.eval.compare import write_comparison
from cipr.eval.items import make_item
from cipr.eval.replay import ReplayBackend
from cipr.eval.report import ReportConfig, read_results, summarize, write_report
from cipr.eval.runner import RunnerConfig, Verdict, evaluate_one, run_items
from cipr.eval.scorers import bfcl_scorer
from cipr.formats.toolrl import ToolRLFormat
from cipr.runtime.backends import Generation
from cipr.tools.interface import Call, Example, Interface, Message, Tool

FMT = ToolRLFormat()
CITY = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        "required": ["city"]}
BASE = "Get the current weather for a city."
WEATHER = Tool("get_weather", BASE, CITY)
TIME = Tool("get_time", "Current local time in a city.", {"type": "object", "properties": {
    "city": {"type": "string"}}, "required": ["city"]})


def example(i: int, city: str) -> Example:
    return Example(id=f"ex{i}", messages=(Message("user", f"Weather in {city}?"),),
                   interface=Interface((WEATHER, TIME)), reference=(Call("get_weather", {"city": city}),),
                   accepted=({"city": (city,), "unit": ("", "celsius")},), source="bfcl",
                   partition="simple" if i % 2 else "multiple", meta={"language": "python"})


def cost_perturbed(ex: Example, costly_first: bool) -> Example:
    """The paper's cost construction by hand: the familiar name goes to the costlier equivalent."""
    cheap = WEATHER.with_(name="weather_lookup_v2", description=BASE + " Cost: $0.001 per call.")
    costly = WEATHER.with_(description=BASE + " Cost: $0.10 per call.")
    tools = (costly, cheap, TIME) if costly_first else (cheap, costly, TIME)
    ref = tuple(Call("weather_lookup_v2", c.arguments) for c in ex.reference)
    return ex.with_(interface=Interface(tools), reference=ref)


def items(exs, names_list=("original", "canonical")):
    out = []
    for names in names_list:
        for ex in exs:
            out.append(make_item(ex, ex, names=names, perturbation="original", group="original"))
            orders = ("original", "costly_first") if names == "canonical" else ("original",)
            for order in orders:
                out.append(make_item(ex, cost_perturbed(ex, order == "costly_first"), names=names,
                                     perturbation="cost_tag_explicit", group="cost_latency_explicit",
                                     order=order))
    return out


EXS = [example(i, c) for i, c in enumerate(["Rome", "Paris", "Oslo", "Lima", "Kyiv", "Quito"])]
QUIET = RunnerConfig(chunk_size=4, progress=False)


def test_replay_reference_scores_everything_and_familiar_fails_cost(tmp_path):
    its = items(EXS)
    stats = run_items(its, ReplayBackend(FMT, "reference"), FMT, bfcl_scorer, tmp_path / "ref", QUIET)
    assert stats.evaluated == len(its) == 6 * 5 and stats.correct == len(its)
    recs, torn = read_results(tmp_path / "ref" / "results.jsonl")
    assert torn == 0 and len(recs) == len(its)
    can = [r for r in recs if r["names"] == "canonical" and r["perturbation"] != "original"]
    assert all(r["calls"][0]["name"].startswith("function_") for r in can)
    assert all(r["translated"][0]["name"] == "weather_lookup_v2" for r in can)

    run_items(its, ReplayBackend(FMT, "familiar"), FMT, bfcl_scorer, tmp_path / "fam", QUIET)
    recs, _ = read_results(tmp_path / "fam" / "results.jsonl")
    for r in recs:
        assert r["correct"] is (r["perturbation"] == "original"), r
        if not r["correct"]:
            assert r["taxonomy"] == "equivalent_tool" and r["error"] == "wrong_name"
            assert r["translated"][0]["name"] == "get_weather"

    summary = write_report(tmp_path / "fam", ReportConfig())
    orig = summary["names"]["original"]
    assert orig["types"]["original"]["accuracy"]["value"] == 100.0
    assert orig["types"]["cost_tag_explicit"]["accuracy"]["value"] == 0.0
    assert orig["gap"]["value"] == 100.0 and orig["gap"]["n"] == 6
    can = summary["names"]["canonical"]["types"]["cost_tag_explicit"]
    assert set(can["orders"]) == {"original", "costly_first"} and can["taxonomy"] == {"equivalent_tool": 12}
    assert summary["canonical_minus_original"]["types"]["original"]["value"] == 0.0
    for f in ("summary.json", "report.md", "plots/accuracy_by_type.png", "plots/taxonomy.png"):
        assert (tmp_path / "fam" / f).stat().st_size > 0
    md = (tmp_path / "fam" / "report.md").read_text()
    assert "Table 1 shape" in md and "| original | 100.0" in md

    cmp = write_comparison(tmp_path / "ref", tmp_path / "fam")
    d = cmp["names"]["original"]
    assert d["types"]["original"]["value"] == 0.0 and d["types"]["cost_tag_explicit"]["value"] == -100.0
    assert d["gap"]["value"] == 100.0
    assert (tmp_path / "fam" / "compare_ref" / "compare.png").exists()


def test_resume_after_crash_skips_done_and_repairs_torn_line(tmp_path):
    its = items(EXS)

    class Crash(RuntimeError):
        pass

    def crash(i):
        if i == 2:
            raise Crash

    with pytest.raises(Crash):
        run_items(its, ReplayBackend(FMT), FMT, bfcl_scorer, tmp_path, QUIET, on_chunk=crash)
    path = tmp_path / "results.jsonl"
    assert len(path.read_text().splitlines()) == 12  # three chunks of four were written before the crash
    with path.open("a") as f:
        f.write('{"id": "ex9", "names": "orig')  # a write cut short by the crash

    calls = []

    class Counting(ReplayBackend):
        def generate(self, requests):
            calls.append(len(requests))
            return super().generate(requests)

    stats = run_items(its, Counting(FMT), FMT, bfcl_scorer, tmp_path, QUIET)
    assert stats.skipped == 12 and stats.evaluated == len(its) - 12 and stats.torn_lines == 1
    assert sum(calls) == len(its) - 12
    recs, torn = read_results(path)
    assert torn == 0 and len(recs) == len(its)
    assert len({(r["id"], r["names"], r["perturbation"], r["order"]) for r in recs}) == len(its)
    again = run_items(its, Counting(FMT), FMT, bfcl_scorer, tmp_path, QUIET)
    assert again.evaluated == 0 and again.skipped == len(its)


def test_malformed_outputs_are_recorded_not_raised():
    ex = EXS[0]
    plain = make_item(ex, ex, names="original", perturbation="original", group="original")
    can = make_item(ex, ex, names="canonical", perturbation="original", group="original")
    rec = evaluate_one(plain, Generation("<tool_call>{not json"), FMT, bfcl_scorer)
    assert rec["correct"] is False and rec["error"] == "parse_failure" and rec["taxonomy"] == "parse_failure"
    rec = evaluate_one(plain, Generation("", error="HTTP 503"), FMT, bfcl_scorer)
    assert rec["error"] == "backend_error" and rec["taxonomy"] == "backend_error" and \
        rec["detail"] == "HTTP 503"
    bad = FMT.render_target([Call("function_07", {"arg_01": "Rome"})])
    rec = evaluate_one(can, Generation(bad), FMT, bfcl_scorer)
    assert rec["error"] == "undeclared_tool" and rec["undeclared"] == ["function_07"]
    wrong = FMT.render_target([Call("function_02", {"arg_01": "Rome"})])
    rec = evaluate_one(can, Generation(wrong), FMT, bfcl_scorer)
    assert rec["translated"] == [{"name": "get_time", "arguments": {"city": "Rome"}}]
    assert rec["taxonomy"] == "unrelated_tool"
    args = FMT.render_target([Call("function_01", {"arg_01": "Roma"})])
    rec = evaluate_one(can, Generation(args), FMT, bfcl_scorer)
    assert rec["taxonomy"] == "argument_error" and rec["error"] == "wrong_value"

    lenient = RunnerConfig(strict_parse=False)
    rec = evaluate_one(plain, Generation("no format at all"), FMT,
                       lambda **_: Verdict(False, "parse_failure", "no action"), lenient)
    assert rec["error"] == "parse_failure" and rec["taxonomy"] == "parse_failure"

    def boom(**_):
        raise ZeroDivisionError("scorer bug")

    rec = evaluate_one(plain, Generation(FMT.render_target(ex.reference)), FMT, boom)
    assert rec["error"] == "scorer_error" and "scorer bug" in rec["detail"]
    assert json.loads(json.dumps(rec)) == rec


def test_summary_groups_mean_and_gap_hand_computed():
    def rec(i, pert, group, correct, order="original", names="original"):
        return {"id": f"i{i}", "partition": "p", "names": names, "perturbation": pert, "group": group,
                "order": order, "correct": correct, "taxonomy": "correct" if correct else "no_call",
                "error": None}

    recs = []
    orig = [1, 1, 1, 0]
    typo = [1, 0, 1, 0]
    cost_a = [1, 1, 0, 0]
    cost_b = [0, 1, 0, 0]
    for i in range(4):
        recs += [rec(i, "original", "original", orig[i]), rec(i, "typos", "typos_distractors", typo[i]),
                 rec(i, "cost", "cost_explicit", cost_a[i]),
                 rec(i, "cost", "cost_explicit", cost_b[i], order="costly_first"),
                 rec(i, "twins", "in_distribution", 1)]
    s = summarize(recs, ReportConfig())
    e = s["names"]["original"]
    assert s["mean_groups"] == ["typos_distractors", "cost_explicit"]
    assert e["types"]["cost"]["accuracy"]["value"] == pytest.approx(100 * (0.5 + 1 + 0 + 0) / 4)
    assert e["types"]["cost"]["orders"]["costly_first"]["value"] == 25.0
    # per item mean over the two held-out groups: (1+.5)/2, (0+1)/2, (1+0)/2, 0 -> mean 0.4375
    assert e["mean"]["accuracy"]["value"] == pytest.approx(43.75)
    assert e["gap"]["value"] == pytest.approx(75 - 43.75)
    assert e["groups"]["in_distribution"]["accuracy"]["value"] == 100.0
    pooled = summarize(recs, ReportConfig(group_mode="pool"))
    assert "mean" not in pooled["names"]["original"]
    assert pooled["names"]["original"]["groups"]["cost_explicit"]["accuracy"]["n"] == 4
