"""The recipes of docs/extending.md, run as written: a perturbation type and a benchmark from a user's own
files (the consistency term's recipe is tests/test_objective.py's user file). The code blocks are read from
the document itself (`support.recipes`), so a recipe that stops working fails here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from support.recipes import recipe


@pytest.fixture
def user_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "user"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    for name in ("my_perturb", "my_benchmark", "my_terms"):
        sys.modules.pop(name, None)
    return folder


def _eval(tmp_path: Path, model_dir: Path, *overrides: str) -> dict:
    from hydra import compose, initialize_config_dir

    from cipr.cli.eval import CONFIG_DIR, run

    base = [f"model={model_dir}", "max_new_tokens=4", f"out_dir={tmp_path / 'run'}", "progress=false",
            "device=cpu", "consistency.enabled=true"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="eval", overrides=[*base, *overrides])
    return run(cfg)


def test_a_perturbation_type_from_a_users_file_is_evaluated(user_dir, tmp_path):
    from support.tiny_models import save_tiny

    from cipr.perturb import PERTURBATIONS, apply_perturbation

    (user_dir / "my_perturb.py").write_text(recipe("my_perturb.py"))
    try:
        summary = _eval(tmp_path, save_tiny(tmp_path / "tiny"), "plugins=[my_perturb]", "benchmark=synthetic",
                        "limit=3", "perturbations=[original,reverse_tools]", "names=[original,canonical]")
        assert PERTURBATIONS["reverse_tools"][0] == "mine"
        recs = [json.loads(x) for x in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
        kinds = {(r["perturbation"], r["names"]) for r in recs}
        assert {("reverse_tools", "original"), ("reverse_tools", "canonical")} <= kinds
        assert "mine" in summary["names"]["original"]["groups"]
        consistency = json.loads((tmp_path / "run" / "summary.json").read_text())["consistency"]
        assert "reverse_tools" in json.dumps(consistency)  # its action KL was read too
        from cipr.data.synthetic import SyntheticConfig

        ex = next(e for e in SyntheticConfig(n=10, seed=0, tools_per_example=(3, 3)).generate(split="test"))
        out, corr = apply_perturbation(ex, "reverse_tools", seed=0)
        assert out.interface.names == tuple(reversed(ex.interface.names))
        assert [corr.equivalent(i) for i in range(3)] == list(reversed(ex.interface.names))
    finally:
        PERTURBATIONS.pop("reverse_tools", None)


def test_a_bad_plugin_is_one_line(tmp_path):
    from cipr.core.config import ConfigError
    from cipr.eval.config import EvalConfig

    with pytest.raises(ConfigError, match=r"plugins: cannot import 'no_such_plugin_cipr'"):
        EvalConfig(plugins=["no_such_plugin_cipr"])


def test_a_benchmark_from_a_users_converter_is_evaluated(user_dir, tmp_path):
    from support.tiny_models import save_tiny

    (user_dir / "my_benchmark.py").write_text(recipe("my_benchmark.py"))
    import my_benchmark

    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = [{"name": "get_weather", "description": "Current weather in a city.", "parameters": city},
             {"name": "get_time", "description": "Local time in a city.", "parameters": city}]
    asks = (("weather", "get_weather"), ("time", "get_time"))
    items = [{"query": f"What is the {what} in {place}?", "tools": tools,
              "answer": {"name": name, "arguments": {"city": place}}}
             for place in ("Oslo", "Lima") for what, name in asks]
    path = tmp_path / "mine.jsonl"
    my_benchmark.write(items, path)
    summary = _eval(tmp_path, save_tiny(tmp_path / "tiny"), "benchmark=messages", f"benchmark.path={path}",
                    "perturbations=[original,typos]", "names=[original,canonical]")
    recs = [json.loads(x) for x in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert len({r["id"] for r in recs}) == 4 and summary["n_records"] == 4 * 2 * 2
    assert {r["perturbation"] for r in recs} == {"original", "typos"}
