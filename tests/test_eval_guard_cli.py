"""`cipr-eval guard.enabled=true` runs the guard's drift evaluation through the evaluation entry point, and
resumes it."""

import json

import pytest

from cipr.cli.eval import run


def _cfg(model_dir, out, shared_data, **changes):
    from omegaconf import OmegaConf

    return OmegaConf.create({"model": str(model_dir), "benchmark": {"name": "bfcl"}, "limit": 3,
                             "guard": {"enabled": True, "policies": ["repair"], "setting": "mild",
                                       "sample": "study200", "budget": 8},
                             "max_new_tokens": 8, "batch_size": 3, "out_dir": str(out),
                             "data_root": str(shared_data), "format": "toolrl", **changes})


def test_cipr_eval_guard_dispatch_with_tiny_model(tmp_path, shared_data):
    from support.tiny_models import save_tiny

    model_dir = save_tiny(tmp_path / "tiny")
    out = tmp_path / "guard"
    summaries = run(_cfg(model_dir, out, shared_data, limit=2))
    assert set(summaries) == {"none", "repair"}
    written = json.loads((out / "summary.json").read_text())
    assert written and (out / "results.jsonl").is_file() and (out / "audit.jsonl").is_file()
    results, audit = (out / "results.jsonl").read_bytes(), (out / "audit.jsonl").read_bytes()
    assert len(results.splitlines()) == 2 and len(audit.splitlines()) == 2
    run(_cfg(model_dir, out, shared_data, limit=3))  # a rerun continues: earlier lines kept byte for byte
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and len({r["id"] for r in rows}) == 3
    assert (out / "results.jsonl").read_bytes().startswith(results)
    assert (out / "audit.jsonl").read_bytes().startswith(audit)
    assert json.loads((out / "summary.json").read_text())["n"] == 3
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    for change in ({"guard": {"enabled": True, "policies": ["repair"], "setting": "medium", "budget": 8}},
                   {"model": str(save_tiny(tmp_path / "tiny2", seed=1))}):
        with pytest.raises(SystemExit) as e:  # another configuration in the same folder: refused, untouched
            run(_cfg(model_dir, out, shared_data, **change))
        assert e.value.code == 2
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
