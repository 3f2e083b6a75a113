"""TEST-ONLY shim: let accelerate 1.15 build FSDP2 and DeepSpeed on CPU processes (gloo), which it refuses.

Why it exists. accelerate's `AcceleratorState.__init__` (accelerate/state.py) sets `DistributedType.FSDP` only
for the MULTI_GPU-like process types and `DistributedType.DEEPSPEED` only `and not cpu`. On a CPU machine an
FSDP run therefore stays MULTI_CPU (plain DDP) without a word, and the package's own check
(`cipr.train.strategy.check_strategy`) stops it. (The Trainer passes no `cpu=True` to its Accelerator, so
DeepSpeed is built there without the shim; an `Accelerator(cpu=True)`, as the reader test builds, needs it.)
No GPU is lent to this project, yet both strategies run on CPU: torch's `fully_shard` and DeepSpeed's engine
(with `DS_ACCELERATOR=cpu`) work over gloo. So the `distributed` test tier installs this shim in its worker
processes, and from there on every line that runs is accelerate's, TRL's, transformers' and DeepSpeed's own
FSDP2/ZeRO code: the shim only finishes what `AcceleratorState.__init__` skipped, exactly as its GPU branch
does (set the type, keep the plugin, select the DeepSpeed plugin), after the original ran. It never lives in
the package.
"""

from __future__ import annotations

import os
from typing import Any


def install() -> None:
    """Patch `AcceleratorState.__init__` in this process (idempotent); set DeepSpeed's accelerator to CPU."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from accelerate import state as accelerate_state
    from accelerate.utils import DistributedType

    cls = accelerate_state.AcceleratorState
    if getattr(cls.__init__, "_cipr_cpu_sharding", False):
        return
    original = cls.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        fresh = not accelerate_state.AcceleratorState._shared_state
        original(self, *args, **kwargs)
        if not fresh or self.distributed_type != DistributedType.MULTI_CPU:
            return
        fsdp_plugin = kwargs.get("fsdp_plugin")
        deepspeed_plugin = kwargs.get("deepspeed_plugin")
        if fsdp_plugin is not None:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin
        elif (deepspeed_plugin is not None
              and os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"):
            self.distributed_type = DistributedType.DEEPSPEED
            self._mixed_precision = "no"
            deepspeed_plugin.set_mixed_precision("no")
            deepspeed_plugin.select(_from_accelerator_state=True)
            self.deepspeed_plugins = deepspeed_plugin
        else:
            return
        accelerate_state.PartialState._shared_state["distributed_type"] = self.distributed_type

    init._cipr_cpu_sharding = True  # type: ignore[attr-defined]
    cls.__init__ = init
