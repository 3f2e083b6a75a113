"""One process of the two-process CIPR test (tests/test_distributed.py), started by `accelerate launch`.

    python -m accelerate.commands.launch --config_file configs/accelerate/ddp.yaml --num_processes 2 \
        tests/distributed_worker.py CONFIG_JSON OUT_DIR

Runs `cipr.train.run.run` on the training config in CONFIG_JSON and records, per process (rank):
the (pair id, side) of every row of every CIPR micro-batch the loss saw (`batches_rank<R>.json`), and
the policy's weights after each stage (`weights_<stage>_rank<R>.pt`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from cipr.train import grpo, sft
from cipr.train.run import config_from_dict, run


def main() -> None:
    config, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    rank = int(os.environ.get("RANK", "0"))
    seen: list[dict] = []
    compute_loss = grpo.CIPRGRPOTrainer.compute_loss

    def recording_loss(self, model, inputs, *args, **kwargs):
        seen.append({"step": self.state.global_step,
                     "rows": [[row.record.pair_id, row.record.side] for row in inputs["cipr_rows"]]})
        return compute_loss(self, model, inputs, *args, **kwargs)

    def saving_train(original, stage):
        def train(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            state = self.accelerator.unwrap_model(self.model).state_dict()
            torch.save({k: v.detach().cpu().clone() for k, v in state.items()},
                       out / f"weights_{stage}_rank{rank}.pt")
            return result
        return train

    grpo.CIPRGRPOTrainer.compute_loss = recording_loss
    grpo.CIPRGRPOTrainer.train = saving_train(grpo.CIPRGRPOTrainer.train, "grpo")
    sft.WarmStartTrainer.train = saving_train(sft.WarmStartTrainer.train, "warm_start")
    run(config_from_dict(config))
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    (out / f"batches_rank{rank}.json").write_text(json.dumps({"world_size": world, "batches": seen}))


if __name__ == "__main__":
    main()
