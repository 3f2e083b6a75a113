"""`cipr-train`: train a tool-calling policy with SFT, GRPO (ToolRL), multi-interface, masking, CIPR or
self-distillation (algo=distill), all on one engine (`cipr.train.run`).

Hydra composes `configs/train/train.yaml` with the groups model/, data/, algo/, rollout/, trainer/,
logging/, distributed/, launcher/ and experiment/ (each Hydra command has its own configs/ folder, so
one command's groups never capture the other's options).

    one CPU (the README's main job: embedded SmolLM2-135M, synthetic data, SFT warm start + CIPR):
        cipr-train
    one CPU, another algorithm or model folder (each algorithm brings the data group it needs):
        cipr-train algo=multi_interface trainer.run_dir=runs/mi
        cipr-train algo=distill trainer.run_dir=runs/distill
        cipr-train model=tiny model.name_or_path=runs/tiny_model trainer.max_steps=2
    one GPU (Qwen2.5-3B-Instruct, tools in the prompt, vLLM colocated):
        cipr-train experiment=qwen25_3b_cipr data.path=/data/toolrl/rlla_4k/train.parquet
    several GPUs on one node (re-launches itself under `accelerate launch`):
        cipr-train experiment=qwen25_3b_cipr launcher.num_processes=8 distributed=zero2
    several nodes (one process per GPU; see slurm/train_multinode.sbatch):
        accelerate launch --num_machines 2 --num_processes 16 ... -m cipr.cli.train experiment=qwen25_3b_cipr
    Slurm (preemptible: saves at the next step boundary on USR1 and requeues; resumes automatically):
        sbatch --gres=gpu:8 slurm/train.sbatch experiment=qwen25_3b_cipr launcher.num_processes=8 \\
            trainer.run_dir=runs/qwen25_3b_cipr

Rerunning continues the run folder from the latest complete checkpoint (`trainer.resume=auto`; a
damaged one is reported and the previous used). Exit status: 0 done (or preempted after a save), 2 bad
input, named on one line (`--debug` or CIPR_DEBUG=1 shows the traceback), 3 non-finite loss (the last
checkpoint is intact).
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from cipr.core.config import TRAIN_CONFIG_DIR
from cipr.core.errors import ConfigError

CONFIG_DIR = TRAIN_CONFIG_DIR


def relaunch_command(num_processes: int, port: int, accelerate_config: str | None,
                     argv: list[str]) -> list[str]:
    """The `accelerate launch` command running this CLI once per process on this node (`cipr.ops.launch`)."""
    from cipr.ops.launch import accelerate_command

    return accelerate_command(num_processes, port, accelerate_config, argv)


def _main(cfg: DictConfig) -> int:
    from cipr.ops.launch import run_entry
    from cipr.train.run import config_from_dict, run

    return run_entry(OmegaConf.to_container(cfg, resolve=True), config_from_dict, run, written)


def written(run_dir: Path) -> str:
    """What a finished run wrote, for its closing line: the metrics and summary, each stage's final weights,
    and the evaluation table or rollouts when there are any."""
    from cipr.core.io import read_json
    from cipr.core.run_folder import STAGES_JSON

    stages = read_json(run_dir / STAGES_JSON)["stages"] if (run_dir / STAGES_JSON).is_file() else []
    parts = [name for name in ("metrics.jsonl", "summary.json", "rollouts.jsonl", "eval/table.md")
             if (run_dir / name).is_file()]
    parts += [f"{stage}/final" for stage in stages if (run_dir / stage / "final").is_dir()]
    return ", ".join(parts) or "nothing new"


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")
def _hydra_entry(cfg: DictConfig) -> None:
    code = _main(cfg)
    if code:
        sys.exit(code)


def main() -> None:
    """Console entry point (`cipr-train`); `--debug` shows the traceback of an input error."""
    from cipr.core.errors import EXIT_INPUT, debug_enabled, pop_debug_flag, report
    from cipr.core.io import override_value
    from cipr.ops.launch import check_run_dir
    from cipr.runtime.hub import stay_offline

    pop_debug_flag()
    from cipr.cli.common import quiet_libraries

    quiet_libraries()
    if "dry_run=true" in sys.argv[1:]:  # cipr-plan with the same overrides (cipr/cli/plan.py)
        from cipr.cli.plan import main as plan_main

        sys.exit(plan_main([a for a in sys.argv[1:] if a != "dry_run=true"]))
    stay_offline()
    run_dir = override_value(sys.argv[1:], "trainer.run_dir")
    if run_dir is not None and not debug_enabled():  # Hydra creates it before the config is read
        try:
            check_run_dir(run_dir)
        except ConfigError as e:
            report("cipr-train", e)
            sys.exit(EXIT_INPUT)
    from cipr.cli.common import check_hydra_command, hydra_overrides
    from cipr.core.errors import cli_errors
    from cipr.perturb.config import MOVED
    from cipr.train.config import TERM_OPTION, config_from_dict, refuse_renamed, sweep_params, term_overrides

    probe, check = hydra_overrides(sys.argv[1:])
    with cli_errors("cipr-train", None):  # a term of the user's own is added (++), a known key overridden
        multirun = check and bool({"-m", "--multirun"} & set(sys.argv[1:]))
        refuse_renamed(sys.argv[1:], sweep_params(probe) if multirun else None)  # the weights' former keys
        sys.argv[1:] = (term_overrides(sys.argv[1:], probe) if check
                        else [f"++{a}" if TERM_OPTION.match(a) else a for a in sys.argv[1:]])
    from cipr.train.run import validate

    check_hydra_command("cipr-train", sys.argv[1:], CONFIG_DIR, "train", "1.3",
                        lambda data: validate(config_from_dict(data)), MOVED)
    _hydra_entry()


if __name__ == "__main__":
    main()
