"""`cipr-eval guard=...` runs the guard's drift evaluation through the evaluation entry point."""

import json

from cipr.cli.eval import run


def test_cipr_eval_guard_dispatch_with_tiny_model(tmp_path, shared_data):
    from omegaconf import OmegaConf

    from cipr.testing import save_tiny

    model_dir = save_tiny(tmp_path / "tiny")
    out = tmp_path / "guard"
    cfg = OmegaConf.create({"model": str(model_dir), "benchmark": {"name": "bfcl"}, "guard": ["repair"],
                            "guard_setting": "mild", "guard_sample": "study200", "guard_budget": 8, "limit": 3, "max_new_tokens": 8,
                            "batch_size": 3, "out_dir": str(out), "data_root": str(shared_data), "format": "toolrl"})
    summaries = run(cfg)
    assert set(summaries) == {"none", "repair"}
    written = json.loads((out / "summary.json").read_text())
    assert written and (out / "results.jsonl").is_file() and (out / "audit.jsonl").is_file()
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) >= 3
