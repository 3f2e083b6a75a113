"""The drift evaluation on real BFCL items, with a fake model whose behaviour fixes every count."""

from __future__ import annotations

import json

import pytest

from cipr.guard.backend import FunctionBackend, Request
from cipr.guard.contract import ContractSnapshot
from cipr.guard.evaluate import STUDY_PARTITIONS, GuardEvalConfig, drifted, evaluate_guard, study_sample
from cipr.guard.repair import CANDIDATE_INSTRUCTIONS, REPAIR_INSTRUCTIONS
from cipr.guard.validator import CallValidator


@pytest.fixture(scope="module")
def study(shared_data):
    from cipr.data.bfcl import load_bfcl

    return load_bfcl(shared_data, partitions=STUDY_PARTITIONS)


def test_study_sample_is_fifty_per_partition_and_seeded(study):
    sample = study_sample(study, seed=0)
    assert len(sample) == 200 and [e.partition for e in sample[::50]] == list(STUDY_PARTITIONS)
    assert len({e.id for e in sample}) == 200
    assert [e.id for e in study_sample(study, seed=0)] == [e.id for e in sample]
    assert [e.id for e in study_sample(study, seed=1)] != [e.id for e in sample]


def _calls_text(calls) -> str:
    return json.dumps([c.to_dict() for c in calls]) if len(calls) > 1 else json.dumps(calls[0].to_dict())


def test_counts_with_a_model_that_keeps_stale_names_but_repairs_well(study, tmp_path):
    """The fake model answers every task prompt with the undrifted reference call (the familiar, stale
    names: right on the clean interface) and every guard repair or candidate prompt with the drifted
    reference. So: clean all correct; a drifted item is wrong exactly when the stale call is wrong
    there; repair fixes every stale call the validator rejects; the baselines re-ask the task
    prompt and get the stale call again."""
    sample = study_sample(study, per_partition=3, seed=0)
    shifted = {e.id: drifted(e, "mild", 0) for e in sample}

    def reply(req: Request) -> str:
        text = " ".join(str(m["content"]) for m in req.messages)
        ex = next(e for e in sample if e.query in text)
        if req.messages[0]["content"] in (REPAIR_INSTRUCTIONS, CANDIDATE_INSTRUCTIONS):
            return _calls_text(shifted[ex.id].reference)
        return _calls_text(ex.reference)

    from cipr.guard.evaluate import bfcl_correct

    stale_valid = [all(CallValidator(ContractSnapshot.from_tools(shifted[e.id].interface)).validate(c).valid
                       for c in e.reference) for e in sample]
    stale_right = [bfcl_correct(e.reference, shifted[e.id]) for e in sample]
    n, broken = len(sample), sum(not r for r in stale_right)
    assert broken > 0  # mild drift renames passed arguments: the familiar call breaks

    result = evaluate_guard(sample, FunctionBackend(reply), GuardEvalConfig(setting="mild"), out_dir=tmp_path)
    s = result.summaries
    assert s["none"]["accuracy_clean"] == 1.0 and s["none"]["drift_failures"] == broken
    assert s["none"]["accuracy_before"] == s["none"]["accuracy_after"] == pytest.approx(1 - broken / n)
    assert s["repair"]["repair_triggered"] == sum(not v for v in stale_valid)
    assert s["repair"]["drift_failures_recovered"] == \
        sum(not v and not r for v, r in zip(stale_valid, stale_right, strict=True))
    assert s["repair"]["harms"] == 0 and s["repair"]["unresolved"] == 0
    assert s["repair"]["guard_tokens"] > 0 and s["repair"]["token_overhead"] > 0
    for baseline in ("naive_retry", "tool_list"):
        assert s[baseline]["drift_failures_recovered"] == 0
        assert s[baseline]["unresolved"] == s["repair"]["repair_triggered"]
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [e.id for e in sample]
    audit = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert len(audit) == 3 * n  # one record per item and guarded policy
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["perturbation"] == "drift_mild" and set(summary["policies"]) == set(s)


def test_cli_eval_smoke_with_the_tiny_model(tmp_path, shared_data, tiny_dir, capsys):
    """`cipr-eval guard.enabled=true ...`: the one command line of the drift evaluation."""
    from hydra import compose, initialize_config_dir

    from cipr.cli.eval import CONFIG_DIR, run

    def cipr_eval(*overrides: str) -> int:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
            cfg = compose(config_name="eval", overrides=[
                "guard.enabled=true", "format=json", "guard.setting=medium", "limit=1",
                "guard.policies=[none]", "max_new_tokens=2", f"out_dir={tmp_path}",
                f"data_root={shared_data}", *overrides])
        try:
            run(cfg)
        except SystemExit as e:
            return e.code
        return 0

    assert cipr_eval(f"model={tiny_dir}") == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["n"] == 1 and summary["perturbation"] == "drift_medium"
    assert summary["policies"]["none"]["accuracy_after"] == 0.0  # an untrained model's garbage
    (row,) = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert row["drift_tokens"] > 0 and row["policies"]["none"]["status"] == "none"
    assert "none:" in capsys.readouterr().out
    assert cipr_eval(f"model={tmp_path / 'nope'}") == 2
    with pytest.raises(ValueError, match="unknown drift setting"):
        GuardEvalConfig(setting="wild")


@pytest.mark.parametrize("setting", ["mild", "medium"])
def test_validator_sees_stale_calls_and_accepts_drifted_references(study, setting):
    """On real BFCL drift: every drifted reference call is valid (no trigger, so no harm, on a correct
    call), and every familiar call the drift breaks is visible to the validator (the study found all
    its BFCL drift failures validator-visible)."""
    from cipr.guard.evaluate import bfcl_correct

    sample = study_sample(study, per_partition=25, seed=0)
    broken = visible = 0
    for example in sample:
        shifted = drifted(example, setting, 0)
        validator = CallValidator(ContractSnapshot.from_tools(shifted.interface))
        assert all(validator.validate(c).valid for c in shifted.reference), example.id
        if not bfcl_correct(example.reference, shifted):
            broken += 1
            visible += not all(validator.validate(c).valid for c in example.reference)
    assert broken > 0 and visible == broken


class Interrupted(Exception):
    """Stands for a crash or a kill in the middle of an item."""


def _stale_model(sample):
    shifted = {e.id: drifted(e, "mild", 0) for e in sample}

    def reply(req: Request) -> str:
        text = " ".join(str(m["content"]) for m in req.messages)
        ex = next(e for e in sample if e.query in text)
        if req.messages[0]["content"] in (REPAIR_INSTRUCTIONS, CANDIDATE_INSTRUCTIONS):
            return _calls_text(shifted[ex.id].reference)
        return _calls_text(ex.reference)

    return FunctionBackend(reply)


def _crash_at(item_id: str, after: int):
    """A scorer that raises on its `after`-th call for `item_id` (clean, drift, then each guarded policy)."""
    from cipr.guard.evaluate import bfcl_correct

    seen = {"n": 0}

    def scorer(calls, example):
        if example.id == item_id:
            seen["n"] += 1
            if seen["n"] == after:
                raise Interrupted(item_id)
        return bfcl_correct(calls, example)

    return scorer


def _stable(summary: dict) -> dict:
    return {p: {k: v for k, v in s.items() if "latency" not in k} for p, s in summary["policies"].items()}


def test_an_interrupted_run_resumes_every_unit_exactly_once(study, tmp_path):
    sample = study_sample(study, per_partition=2, seed=0)
    cfg = GuardEvalConfig(setting="mild")
    ref = evaluate_guard(sample, _stale_model(sample), cfg, out_dir=tmp_path / "ref")
    out = tmp_path / "run"
    k = 5
    with pytest.raises(Interrupted):  # item k dies after its first guarded policy ran
        evaluate_guard(sample, _stale_model(sample), cfg, out_dir=out, scorer=_crash_at(sample[k].id, 4))
    results, audit = (out / "results.jsonl").read_bytes(), (out / "audit.jsonl").read_bytes()
    assert [json.loads(x)["id"] for x in results.splitlines()] == [e.id for e in sample[:k]]
    assert len(audit.splitlines()) == 3 * k  # the interrupted item left no partial unit
    with (out / "results.jsonl").open("ab") as f:  # and a torn line, as a kill during a write leaves
        f.write(b'{"id": "torn')
    resumed = evaluate_guard(sample, _stale_model(sample), cfg, out_dir=out)
    after_results, after_audit = (out / "results.jsonl").read_bytes(), (out / "audit.jsonl").read_bytes()
    assert after_results.startswith(results) and after_audit.startswith(audit)  # earlier lines byte-identical
    rows = [json.loads(x) for x in after_results.splitlines()]
    assert [r["id"] for r in rows] == [e.id for e in sample]
    units = [json.loads(x)["item_id"] for x in after_audit.splitlines()]
    assert sorted(units) == \
        sorted(f"{e.id}|{p}" for e in sample for p in ("naive_retry", "tool_list", "repair"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == len(sample) and summary["resumed"] == k
    assert _stable(summary) == _stable(json.loads((tmp_path / "ref" / "summary.json").read_text()))
    assert [r["id"] for r in resumed.rows] == [r["id"] for r in ref.rows]
    again = evaluate_guard(sample, _stale_model(sample), cfg, out_dir=out)  # nothing left: nothing appended
    assert (out / "results.jsonl").read_bytes() == after_results and \
        (out / "audit.jsonl").read_bytes() == after_audit
    assert again.summaries["repair"] == resumed.summaries["repair"]


def test_a_larger_rerun_extends_and_a_different_one_is_refused_untouched(study, tmp_path):
    from cipr.core.errors import CiprError

    sample = study_sample(study, per_partition=2, seed=0)
    out = tmp_path / "run"
    evaluate_guard(sample[:3], _stale_model(sample), GuardEvalConfig(setting="mild"), out_dir=out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    refusals = [
        (dict(config=GuardEvalConfig(setting="medium")), "another configuration"),
        (dict(config=GuardEvalConfig(setting="mild", policies=("none", "repair"))), "another configuration"),
        (dict(config=GuardEvalConfig(setting="mild", budget=64)), "budget"),
        (dict(config=GuardEvalConfig(setting="mild"), identity={"model": "other"}), "model"),
        (dict(config=GuardEvalConfig(setting="mild"), examples=sample[1:3]), "does not ask for"),
    ]
    for kwargs, message in refusals:
        examples = kwargs.pop("examples", sample)
        with pytest.raises(CiprError, match=message):
            evaluate_guard(examples, _stale_model(sample), out_dir=out, **kwargs)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    evaluate_guard(sample, _stale_model(sample), GuardEvalConfig(setting="mild"), out_dir=out)
    rows = (out / "results.jsonl").read_bytes()
    assert rows.startswith(before["results.jsonl"]) and len(rows.splitlines()) == len(sample)


def test_a_folder_of_other_data_is_refused_untouched(study, tmp_path):
    from cipr.core.errors import CiprError

    sample = study_sample(study, per_partition=1, seed=0)
    other = tmp_path / "eval_run"
    other.mkdir()
    lines = "".join(json.dumps({"id": f"x{i}", "correct": True}) + "\n" for i in range(1000))
    (other / "results.jsonl").write_text(lines[:-1])  # not even a torn-looking last line is cut
    with pytest.raises(CiprError, match="no run.json"):
        evaluate_guard(sample, _stale_model(sample), out_dir=other)
    (other / "run.json").write_text(json.dumps({"model": "m", "benchmark": "bfcl"}))
    with pytest.raises(CiprError, match="another kind of run"):
        evaluate_guard(sample, _stale_model(sample), out_dir=other)
    assert (other / "results.jsonl").read_text() == lines[:-1]
    assert sorted(p.name for p in other.iterdir()) == ["results.jsonl", "run.json"]


def test_a_run_that_failed_before_any_unit_does_not_pin_its_configuration(study, tmp_path):
    sample = study_sample(study, per_partition=1, seed=0)
    out = tmp_path / "run"
    with pytest.raises(Interrupted):
        evaluate_guard(sample, _stale_model(sample), GuardEvalConfig(setting="medium"), out_dir=out,
                       scorer=_crash_at(sample[0].id, 1))
    assert json.loads((out / "run.json").read_text())["config"]["setting"] == "medium"
    evaluate_guard(sample, _stale_model(sample), GuardEvalConfig(setting="mild"), out_dir=out)
    assert json.loads((out / "run.json").read_text())["config"]["setting"] == "mild"
    assert len((out / "results.jsonl").read_text().splitlines()) == len(sample)
