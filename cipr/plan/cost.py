"""Time and cost of a run: tokens per step, and a wall-time range from stated throughputs. An estimate.

Card figures (`CARDS`) are the vendors' datasheet numbers: dense BF16 tensor throughput (half the figure
quoted "with sparsity") and memory bandwidth. NVIDIA H100 Tensor Core GPU datasheet (H100 SXM: 989 TFLOPS
BF16, 3.35 TB/s, 80 GB); NVIDIA H200 Tensor Core GPU datasheet (989 TFLOPS, 4.8 TB/s, 141 GB); NVIDIA A100
Tensor Core GPU datasheet (A100 80GB SXM: 312 TFLOPS, 2,039 GB/s). The efficiencies are assumptions, given
as ranges: training at 15-40 % of peak (model FLOPs utilization; PaLM, Chowdhery et al. 2022, Table 3,
reached 46 % on a large, tuned run: a small model in an RL loop gets less), prefill at 30-60 %, decoding at
30-70 % of the memory bandwidth.

Per generation round, on each of the W processes (n = completions_per_step / W sequences, prompt p and
completion c tokens on average, Ψ parameters, kv bytes per token, `concurrent` sequences in vLLM's cache):

    prefill   = 2·Ψ·n·p / (peak · e_prefill)
    decode    = waves · c · max((B + m·(p + c/2)·kv) / (bandwidth · e_decode), 2·Ψ·m / (peak · e_train))
                (m = min(n, concurrent) sequences per wave, B the weights' bytes: each decoding step reads
                the weights once and each sequence's cache, or is bound by its FLOPs, whichever is slower)
    train     = k · Ψ · n · (p + c) / (peak · e_train)
                k = 6 (forward + backward) + 2 (recomputed forward, gradient checkpointing) + 2 (the
                old log-probabilities' forward, when TRL computes them: several updates per generation or
                vLLM's importance-sampling correction) + 2 (algo=cipr's separate action read when
                trainer.entropy_coeff > 0)

The completion length c is bounded below by the reference targets' mean (a policy that answers like the
data) and above by rollout.max_completion_length (every rollout runs to the limit); the wall time of a
round is prefill + decode + train at the slow end of each range and the fast end, and the run's is that
times the rounds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Card:
    """A GPU's datasheet figures (module docstring)."""

    name: str
    bf16_tflops: float
    bandwidth_tb_s: float
    memory_gb: float
    source: str


CARDS = {
    "h100": Card("NVIDIA H100 SXM 80GB", 989.0, 3.35, 80.0, "NVIDIA H100 Tensor Core GPU datasheet"),
    "h200": Card("NVIDIA H200 SXM 141GB", 989.0, 4.8, 141.0, "NVIDIA H200 Tensor Core GPU datasheet"),
    "a100": Card("NVIDIA A100 SXM 80GB", 312.0, 2.039, 80.0, "NVIDIA A100 Tensor Core GPU datasheet"),
}
TRAIN_EFFICIENCY = (0.15, 0.40)
PREFILL_EFFICIENCY = (0.30, 0.60)
DECODE_EFFICIENCY = (0.30, 0.70)


@dataclass(frozen=True)
class StepTime:
    """Seconds of one generation round per process, slow and fast ends (module docstring)."""

    prompt_tokens: float
    completion_tokens: tuple[float, float]
    generated_tokens: tuple[float, float]
    trained_tokens: tuple[float, float]
    flops_per_token: int
    prefill_s: tuple[float, float]
    decode_s: tuple[float, float]
    train_s: tuple[float, float]

    @property
    def total_s(self) -> tuple[float, float]:
        return (self.prefill_s[0] + self.decode_s[0] + self.train_s[0],
                self.prefill_s[1] + self.decode_s[1] + self.train_s[1])

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_s": self.total_s}


def train_flops_factor(*, checkpointing: bool, old_logps: bool, second_read: bool) -> int:
    """k of `train` in the module docstring: FLOPs per parameter per trained token."""
    return 6 + 2 * checkpointing + 2 * old_logps + 2 * second_read


def step_time(card: Card, *, params: int, weight_bytes: float, seqs: int, prompt: float,
              completion: tuple[float, float], kv_bytes_per_token: int, concurrent: int, k: int) -> StepTime:
    """One round's prefill, decode and training seconds on one process (module docstring), for the short
    and the long completion length; the result's tuples are (fast end, slow end)."""
    peak, bandwidth = card.bf16_tflops * 1e12, card.bandwidth_tb_s * 1e12
    m = max(1, min(seqs, concurrent or seqs))
    waves = -(-seqs // m)
    prefill = tuple(2 * params * seqs * prompt / (peak * e) for e in reversed(PREFILL_EFFICIENCY))
    decode, train = [], []
    for c, (e_dec, e_tr) in zip(completion, zip(reversed(DECODE_EFFICIENCY), reversed(TRAIN_EFFICIENCY),
                                                strict=True), strict=True):
        read = weight_bytes + m * (prompt + c / 2) * kv_bytes_per_token
        per_token = max(read / (bandwidth * e_dec), 2 * params * m / (peak * e_tr))
        decode.append(waves * c * per_token)
        train.append(k * params * seqs * (prompt + c) / (peak * e_tr))
    generated = tuple(seqs * c for c in completion)
    trained = tuple(seqs * (prompt + c) for c in completion)
    return StepTime(seqs * prompt, completion, generated, trained, k, prefill,  # type: ignore[arg-type]
                    (decode[0], decode[1]), (train[0], train[1]))


def hours(seconds: float) -> float:
    return round(seconds / 3600, 2)
