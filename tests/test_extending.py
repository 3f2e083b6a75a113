"""The recipes of docs/extending.md, run as written: a perturbation type (evaluated, and trained on as the
training perturbation) and a benchmark from a user's own files (the consistency term, gate and context
recipes are tests/test_objective.py's user files). The code blocks are read from the document itself
(`support.recipes`), so a recipe that stops working fails here."""

from __future__ import annotations

import json
import os
import subprocess
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


@pytest.mark.integration
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


@pytest.mark.integration
def test_a_training_perturbation_from_a_users_file_trains(user_dir, tmp_path):
    """`my_perturb.py` as written, named by `perturb.preset` and imported by `plugins=`: each canonical
    example's copy is the registered type's (the tools in reverse order, classes following them), trained on
    through cipr-train; a preset that is neither built in nor registered is one line, exit 2."""
    from support.tiny_models import save_tiny, tiny_tokenizer

    from cipr.formats import get_format
    from cipr.perturb import PERTURBATIONS
    from cipr.perturb.config import PerturbConfig, resolved
    from cipr.train.data import DataConfig, build_prompts, load_examples

    (user_dir / "my_perturb.py").write_text(recipe("my_perturb.py"))
    model = save_tiny(tmp_path / "tiny")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(user_dir), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1"}
    common = [f"model.name_or_path={model}", "model=tiny", "model.call_format=compact",
              "algo=multi_interface", "algo.regime=supervised", "data.n=10", "data.eval_examples=2",
              "data.tools_per_example=[2,3]",
              "trainer.max_steps=2", "trainer.save_steps=2", "trainer.per_device_train_batch_size=2",
              "trainer.warm_start.steps=0", "trainer.warm_start.eval_examples=0",
              "trainer.gradient_checkpointing=false", "logging.progress_bar=false", "plugins=[my_perturb]"]
    train = [sys.executable, "-m", "cipr.cli.train", *common]
    try:
        proc = subprocess.run([*train, "perturb.preset=reverse_tools", f"trainer.run_dir={tmp_path / 'run'}"],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-2000:]
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["stages"]["supervised"] and summary["final"]["supervised"]["step"] == 2
        config = json.loads((tmp_path / "run" / "config.json").read_text())
        assert config["perturb"]["preset"] == "reverse_tools" and config["plugins"] == ["my_perturb"]
        import my_perturb  # noqa: F401 - registers reverse_tools here, as plugins= did in the run

        data = DataConfig(n=10, eval_examples=2, tools_per_example=(2, 3))
        perturb = resolved(PerturbConfig(preset="reverse_tools"), "multi_interface")
        records = build_prompts(load_examples(data), data, perturb, fmt=get_format("compact"),
                                tokenizer=tiny_tokenizer()).records
        for canonical, copy in zip(records[::2], records[1::2], strict=True):
            assert copy.side == "perturbed" and copy.tools == tuple(reversed(canonical.tools))
            assert copy.classes == tuple(reversed(range(len(canonical.tools))))
        bad = subprocess.run([*train, "perturb.preset=no_such_type", f"trainer.run_dir={tmp_path / 'bad'}"],
                             env=env, capture_output=True, text=True, timeout=300)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        assert "perturb.preset='no_such_type'" in bad.stderr
    finally:
        PERTURBATIONS.pop("reverse_tools", None)


def test_a_bad_plugin_is_one_line(tmp_path):
    from cipr.core.config import ConfigError
    from cipr.eval.config import EvalConfig
    from cipr.train.config import compose_train

    with pytest.raises(ConfigError, match=r"plugins: cannot import 'no_such_plugin_cipr'"):
        EvalConfig(plugins=["no_such_plugin_cipr"])
    with pytest.raises(ConfigError, match=r"plugins: cannot import 'no_such_plugin_cipr'"):
        compose_train(["plugins=[no_such_plugin_cipr]"])


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
