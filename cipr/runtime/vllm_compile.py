"""Whether a vLLM engine compiles its model (torch.compile, CUDA graphs) or runs it eagerly.

vLLM compiles by default. On a GPU that pays (CUDA graphs above all). vLLM's CPU build compiles with
inductor at every engine start, and on 2 cores that start took 114 s, and 86 s with the compile cache
already written, against 3.9 s with `enforce_eager=True`. Decoding 8 x 64 tokens of the embedded
SmolLM2-135M afterwards took 3.7-4.1 s compiled and 4.1-4.6 s eager (two generations per engine, one
engine each, float32, vLLM 0.31.0 CPU): the compile saves well under a second per such batch and costs
~100 s up front. So `None` (the default of every `enforce_eager` option) means eager on CPU and vLLM's
own default elsewhere; set True or False to decide yourself (e.g. False for a long CPU run).
"""

from __future__ import annotations


def enforce_eager(choice: bool | None) -> bool:
    """`choice` if given, else whether vLLM runs on CPU (imports vLLM's platform module)."""
    if choice is not None:
        return choice
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())
