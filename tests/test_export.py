"""cipr-export: a real (one-step, LoRA) training run exported, reloaded with transformers, same logits;
the manifest read back and honoured by cipr-eval; the refusals a user meets."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from cipr.core.errors import DataError, UnsafeOutputError
from cipr.runtime.export import (
    MANIFEST,
    ExportConfig,
    apply_manifest,
    eval_names_for,
    export,
    locate,
    read_manifest,
)


def _logits(model, tokenizer) -> torch.Tensor:
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is the weather in Paris?"}],
                                         tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(input_ids=ids).logits[0]


def sft_config(root, tiny, **model) -> dict:
    """A one-stage SFT run on the tiny model: two optimizer steps, saved every step; `model` adds model
    options."""
    return {
        "model": {"name_or_path": str(tiny), "gguf_package": None, "gguf_file": None, "short_name": "tiny",
                  "dtype": "float32", "call_format": "hermes", **model},
        "data": {"source": "synthetic", "n": 8, "seed": 0, "eval_examples": 0},
        "algo": {"name": "sft"},
        "trainer": {"run_dir": str(root / "run"), "max_steps": 2, "save_steps": 1, "save_total_limit": None,
                    "per_device_train_batch_size": 2, "learning_rate": 5e-2, "torch_threads": 1},
        "logging": {"progress_bar": False},
    }


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A finished one-stage SFT run with LoRA on the tiny model (two optimizer steps, saved every step)."""
    from support.tiny_models import save_tiny

    from cipr.train.run import config_from_dict, run

    root = tmp_path_factory.mktemp("export")
    tiny = save_tiny(root / "tiny")
    cfg = config_from_dict(sft_config(root, tiny, lora={"enabled": True, "r": 4, "alpha": 8, "dropout": 0.0}))
    run(cfg)
    return root / "run", cfg


def test_lora_run_exports_merged_weights_with_the_checkpoints_logits(lora_run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cipr.runtime.model import load_model

    run_dir, cfg = lora_run
    out = export(run_dir, tmp_path / "exp")
    files = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", MANIFEST, "README.md"} <= files
    assert "adapter_config.json" not in files and "adapter_model.safetensors" not in files
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".exp")]  # no temporary folder left

    trained, tok = load_model(cfg.model, weights=run_dir / "sft" / "final")  # PEFT: base + adapter
    base, _ = load_model(cfg.model)
    exported = AutoModelForCausalLM.from_pretrained(str(out))
    etok = AutoTokenizer.from_pretrained(str(out))
    assert etok.chat_template == tok.chat_template and etok.eos_token == "<|im_end|>"
    assert exported.generation_config.eos_token_id == etok.eos_token_id
    expected, got = _logits(trained.eval(), tok), _logits(exported.eval(), etok)
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()
    assert (expected - _logits(base.eval(), tok)).abs().max() > 1e-3  # the adapter did move the model

    m = read_manifest(out)
    assert (m.call_format, m.training_names, m.eval_names) == ("hermes", "canonical", ("canonical",))
    assert (m.algo, m.stage, m.step, m.finished, m.lora_merged) == ("sft", "sft", 2, True, True)
    card = (out / "README.md").read_text()
    assert "## Training configuration" in card and "call_format: hermes" in card and "loss" in card


@pytest.fixture(scope="module")
def frozen_run(tmp_path_factory):
    """A finished SFT run on the tiny model with its bottom layer frozen (weights saved without it), and the
    trained model's state dict as training left it in memory."""
    import copy

    from support.tiny_models import save_tiny

    from cipr.train import run as train_run
    from cipr.train import stage

    root = tmp_path_factory.mktemp("frozen")
    tiny = save_tiny(root / "tiny")
    cfg = train_run.config_from_dict(sft_config(root, tiny, freeze_bottom_layers=1))
    trained: dict[str, torch.Tensor] = {}
    finish = stage.finish_stage

    def keep_weights(trainer, stage_dir, steps):
        trained.update(copy.deepcopy(trainer.model.state_dict()))
        return finish(trainer, stage_dir, steps)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(stage, "finish_stage", keep_weights)
        train_run.run(cfg)
    return root / "run", cfg, trained


def test_run_with_frozen_layers_exports_the_full_model_with_the_trained_logits(frozen_run, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cipr.runtime.model import load_model

    run_dir, cfg, trained_weights = frozen_run
    final = run_dir / "sft" / "final"
    assert (final / "cipr_frozen.json").is_file()
    saved = set(load_file(final / "model.safetensors"))
    assert saved and all(k.startswith("model.layers.1.") or k == "model.norm.weight" for k in saved)

    out = export(run_dir, tmp_path / "exp")
    assert not (out / "cipr_frozen.json").exists()
    exported = AutoModelForCausalLM.from_pretrained(str(out))
    assert set(load_file(out / "model.safetensors")) > saved  # every tensor (the tied head once)
    base, tok = load_model(cfg.model)
    trained, _ = load_model(cfg.model)
    trained.load_state_dict(trained_weights)  # strict: the model exactly as training left it
    etok = AutoTokenizer.from_pretrained(str(out))
    expected, got = _logits(trained.eval(), tok), _logits(exported.eval(), etok)
    assert torch.equal(got, expected), (got - expected).abs().max()
    assert (expected - _logits(base.eval(), tok)).abs().max() > 1e-3  # training did move the model
    m = read_manifest(out)
    assert (m.stage, m.step, m.finished, m.lora_merged, m.dtype) == ("sft", 2, True, False, "float32")

    step = export(run_dir / "sft" / "checkpoint-1", tmp_path / "step1")  # a step folder: rebuilt the same way
    assert read_manifest(step).step == 1 and set(load_file(step / "model.safetensors")) == set(
        load_file(out / "model.safetensors"))
    alone = tmp_path / "alone"
    shutil.copytree(final, alone)
    with pytest.raises(DataError, match="trainable tensors only"):
        export(alone, tmp_path / "exp2", ExportConfig(call_format="hermes", names="canonical"))


def test_checkpoint_folder_exports_its_step_and_unfinished_run_is_refused(lora_run, tmp_path):
    run_dir, _ = lora_run
    source = locate(run_dir / "sft" / "checkpoint-1")
    assert (source.stage, source.step, source.finished, source.is_adapter) == ("sft", 1, False, True)
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    (copy / "sft" / "stage.json").unlink()
    with pytest.raises(DataError, match="has not finished.*checkpoint-2"):
        locate(copy)
    with pytest.raises(DataError, match="stage 'warm_start'"):
        locate(run_dir, stage="warm_start")
    zero = tmp_path / "checkpoint-7"
    (zero / "global_step7").mkdir(parents=True)
    (zero / "latest").write_text("global_step7")
    with pytest.raises(DataError, match="zero_to_fp32.py"):
        locate(zero)


def test_plain_model_folder_round_trip_and_idempotent_reexport(tmp_path):
    from support.tiny_models import save_tiny
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = save_tiny(tmp_path / "plain")
    with pytest.raises(DataError, match="give call_format= and names="):
        export(folder, tmp_path / "exp")
    out = export(folder, tmp_path / "exp", ExportConfig(call_format="toolrl", names="original"))
    original = AutoModelForCausalLM.from_pretrained(str(folder))
    exported = AutoModelForCausalLM.from_pretrained(str(out))
    tok = AutoTokenizer.from_pretrained(str(out))
    assert torch.equal(_logits(original.eval(), tok), _logits(exported.eval(), tok))
    assert read_manifest(out).eval_names == ("original",)

    stamp = (out / "model.safetensors").stat().st_mtime_ns
    export(folder, out, ExportConfig(call_format="toolrl", names="original"))  # same source: nothing to do
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp
    other = save_tiny(tmp_path / "other", seed=1)
    with pytest.raises(UnsafeOutputError, match="overwrite=true"):
        export(other, out, ExportConfig(call_format="toolrl", names="original"))


def test_eval_summary_goes_into_the_model_card(tmp_path):
    from support.tiny_models import save_tiny

    folder = save_tiny(tmp_path / "plain")
    ev = tmp_path / "ev"
    ev.mkdir()
    acc = {"value": 62.5, "half_width": 4.25}
    (ev / "summary.json").write_text(json.dumps({
        "n_items": 40, "groups": {"original": {}, "corrupted": {}},
        "names": {"canonical": {"groups": {"original": {"accuracy": acc}, "corrupted": {}}}}}))
    (ev / "run.json").write_text(json.dumps({"benchmark": "bfcl", "format": "toolrl", "backend": "hf"}))
    options = ExportConfig(call_format="toolrl", names="canonical")
    out = export(folder, tmp_path / "exp", options)
    assert "## Evaluation" not in (out / "README.md").read_text()
    export(folder, out, ExportConfig(call_format="toolrl", names="canonical", eval_dirs=(str(ev),)))
    card = (out / "README.md").read_text()
    assert "## Evaluation" in card and "| canonical | 62.5 ± 4.2 | – |" in card and "**bfcl**" in card
    with pytest.raises(DataError, match="no summary.json"):
        export(folder, out, ExportConfig(call_format="toolrl", names="canonical", eval_dirs=(str(tmp_path),)))


def test_read_manifest_names_the_bad_field(tmp_path):
    assert read_manifest(tmp_path) is None
    good = {"version": 1, "call_format": "react", "training_names": "masked", "eval_names": ["original"]}
    (tmp_path / MANIFEST).write_text(json.dumps(good))
    assert read_manifest(tmp_path).training_names == "masked"
    for bad, field in (({**good, "eval_names": ["both"]}, "eval_names"), ({**good, "version": 9}, "version"),
                       ({**good, "training_names": "random"}, "training_names"),
                       ({"version": 1}, "call_format")):
        (tmp_path / MANIFEST).write_text(json.dumps(bad))
        with pytest.raises(DataError, match=f"field '{field}'"):
            read_manifest(tmp_path)
    assert eval_names_for("masked") == ("original",) and eval_names_for("canonical") == ("canonical",)


def test_cipr_eval_takes_format_and_names_from_the_manifest(tmp_path, shared_data):
    from hydra import compose, initialize_config_dir
    from support.tiny_models import save_tiny

    from cipr.cli.eval import CONFIG_DIR, run, to_eval_config

    out = export(save_tiny(tmp_path / "plain"), tmp_path / "exp",
                 ExportConfig(call_format="hermes", names="canonical"))
    common = ["limit=2", "partitions=[simple_python]", "perturbations=[original]", "max_new_tokens=4",
              "progress=false", "device=cpu"]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base=None):
        cfg = compose(config_name="eval", overrides=[f"model={out}", f"out_dir={tmp_path / 'ev'}", *common])
        explicit = compose(config_name="eval", overrides=[f"model={out}", f"out_dir={tmp_path / 'ev2'}",
                                                          "format=toolrl", "names=[original]", *common])
    assert to_eval_config(cfg).call_format == "toolrl"  # the benchmark's default until the manifest is read
    summary = run(cfg)
    meta = json.loads((tmp_path / "ev" / "run.json").read_text())
    assert meta["format"] == "hermes" and meta["names"] == ["canonical"] and \
        list(summary["names"]) == ["canonical"]
    records = [json.loads(line) for line in (tmp_path / "ev" / "results.jsonl").read_text().splitlines()]
    assert len(records) == 2 and {r["names"] for r in records} == {"canonical"}
    ecfg = apply_manifest(to_eval_config(explicit))  # explicit overrides win over the manifest
    assert (ecfg.call_format, ecfg.names) == ("toolrl", ["original"])


def test_cli_exports_in_the_asked_dtype_and_reports_bad_input(tmp_path, capsys):
    from support.tiny_models import save_tiny
    from transformers import AutoModelForCausalLM

    from cipr.cli.export import main

    folder = save_tiny(tmp_path / "plain")
    assert main([f"run_dir={folder}", f"out_dir={tmp_path / 'exp'}", "call_format=hermes", "names=original",
                 "dtype=bfloat16"]) == 0
    assert next(AutoModelForCausalLM.from_pretrained(str(tmp_path / "exp")).parameters()).dtype == \
        torch.bfloat16
    assert read_manifest(tmp_path / "exp").dtype == "bfloat16"
    assert main([f"run_dir={tmp_path / 'missing'}", f"out_dir={tmp_path / 'exp2'}"]) == 2
    assert "not a folder" in capsys.readouterr().err
    assert main([f"run_dir={folder}", f"out_dir={tmp_path / 'exp3'}", "call_format=nope",
                 "names=original"]) == 2
    assert "unknown call format" in capsys.readouterr().err
    assert main([f"run_dir={folder}", f"out_dir={tmp_path / 'exp4'}", "dtype=float64"]) == 2
    assert "'dtype' must be one of 'auto', 'float32'" in capsys.readouterr().err


def test_export_never_replaces_its_source_or_a_folder_it_did_not_write(tmp_path):
    import os
    import stat

    from support.tiny_models import save_tiny

    folder = save_tiny(tmp_path / "plain")
    options = ExportConfig(call_format="toolrl", names="original", overwrite=True)
    for target in (folder, tmp_path):  # the source itself, and a folder holding it
        with pytest.raises(UnsafeOutputError, match="source"):
            export(folder, target, options)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(UnsafeOutputError, match="holds no cipr_manifest.json"):
        export(folder, mine, options)
    assert (mine / "notes.txt").read_text() == "keep" and (folder / "config.json").is_file()
    old = os.umask(0o022)
    try:
        out = export(folder, tmp_path / "exp", options)
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert stat.S_IMODE((out / MANIFEST).stat().st_mode) == 0o644


def test_evaluation_refuses_a_checkpoint_without_its_frozen_layers(tmp_path):
    """A weights folder that left its frozen tensors to the base is not a model on its own: cipr-eval says to
    export it instead of loading random frozen layers."""
    from cipr.core.checkpoints import FROZEN
    from cipr.core.errors import DataError
    from cipr.runtime.model import check_whole_model

    (tmp_path / FROZEN).write_text('{"omitted": ["model.layers.0.mlp.up_proj.weight"]}')
    with pytest.raises(DataError, match="cipr-export"):
        check_whole_model(str(tmp_path))
    check_whole_model(str(tmp_path / "elsewhere"))  # an ordinary folder passes
