"""`cipr-data` on the real data: stats, export under original/canonical names and perturbations."""

import json

from cipr.cli.data import main
from cipr.tools.interface import Call


def test_stats_bfcl(shared_data, capsys):
    assert main(["stats", "source=bfcl", f"data_root={shared_data}"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["total"] == 2501 and out["partitions"]["live_multiple"] == 1053


def test_stats_rotbench_and_toolrl(shared_data, capsys):
    main(["stats", "source=rotbench", f"data_root={shared_data}"])
    rot = json.loads(capsys.readouterr().out)
    assert [rot["First_Turn"][lv]["items"] for lv in ("clean", "slight", "medium", "heavy", "union")] == [
        105, 210, 210, 210, 105]
    assert [rot["Third_Turn"][lv]["items"] for lv in ("clean", "slight", "medium", "heavy", "union")] == [
        70, 140, 140, 140, 70]
    main(["stats", "source=toolrl", f"data_root={shared_data}"])
    tr = json.loads(capsys.readouterr().out)
    assert tr["rlla_4k/test.parquet"]["total"] == 80 and tr["rlla_4k/test.parquet"]["with_calls"] == 71


def test_export_canonical_round_trips_through_name_map(shared_data, tmp_path):
    from cipr.data.bfcl import load_bfcl

    out = tmp_path / "c.jsonl"
    assert main(["export", "source=bfcl", f"data_root={shared_data}", "names=canonical", f"out={out}"]) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    originals = {e.id: e for e in load_bfcl(shared_data)}
    assert len(lines) == 2501
    for rec in lines[:300]:
        assert {t["function"]["name"] for t in rec["tools"]} == set(rec["name_map"])
        assert all(n.startswith("function_") for n in rec["name_map"])
        back = [rec["name_map"][c["name"]] for c in rec["reference_calls"]]
        assert back == [c.name for c in originals[rec["id"]].reference]
        assert "accepted" in rec


def test_export_perturbed_has_correspondence(shared_data, tmp_path):
    out = tmp_path / "p.jsonl"
    main(["export", "source=bfcl", f"data_root={shared_data}", "perturb=cost_tag_explicit", "names=canonical",
          "order=costly_first", "limit=50", f"out={out}"])
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(recs) == 50
    for rec in recs:
        assert rec["perturbation"] == "cost_tag_explicit" and rec["order"] == "costly_first"
        names = [t["function"]["name"] for t in rec["tools"]]
        assert set(rec["correspondence"]) == set(names)
        assert None in rec["correspondence"].values()  # the added costlier equivalent maps to nothing
        for c in rec["reference_calls"]:
            assert rec["correspondence"][c["name"]] is not None
        # costly-first: the added (costlier) equivalent precedes the tool the reference calls
        called = rec["reference_calls"][0]["name"]
        added = [n for n in names if rec["correspondence"][n] is None]
        assert min(names.index(a) for a in added) < names.index(called)


def test_export_synthetic_and_list(tmp_path, capsys):
    out = tmp_path / "s.jsonl"
    main(["export", "source=synthetic", "n=20", "seed=3", f"out={out}"])
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(recs) == 20
    assert all(Call.from_dict(c).name in rec["name_map"] for rec in recs for c in rec["reference_calls"])
    assert main(["list-perturbations"]) == 0
    listing = capsys.readouterr().out
    assert "cost_tag_implicit" in listing and "typos_distractors" in listing


def test_help_lists_every_option_with_its_default_and_bad_input_is_one_line(capsys):
    assert main(["export", "--help"]) == 0
    out = capsys.readouterr().out
    assert "  source=(required)" in out and "  names=original" in out and "(original | canonical)" in out
    assert "  limit=null" in out and "only the first N items" in out and "Examples" in out
    assert main(["--help"]) == 0 and "cipr-data trajectories key=value" in capsys.readouterr().out
    for argv, message in ((["export", "source=bfcl", "nmes=canonical", "out=x"], "Did you mean 'names'?"),
                          (["export", "source=bfcl", "names=both", "out=x"], "'names' must be one of"),
                          (["export", "source=bfcl", "limit=x", "out=x"], "'limit' must be"),
                          (["export", "source=bfcl"], "'out' is required"),
                          (["exprot", "source=bfcl"], "unknown command 'exprot'"), ([], "no command given")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("cipr-data: ") and message in err, err
