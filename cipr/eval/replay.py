"""Replay: a backend that answers with calls taken from the item itself, for tests and sanity checks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from cipr.formats.base import CallFormat
from cipr.runtime.backends import Generation, GenRequest

ReplayMode = Literal["reference", "familiar"]


class ReplayBackend:
    """Answers with calls taken from the item itself, rendered in the call format (so parsing runs):

    - `reference`: the reference calls of the example as shown (the perturbation's rewritten
      reference, under canonical ids when the adapter is on): should score 100% wherever the scorer
      accepts the reference;
    - `familiar`: the unperturbed example's reference calls, i.e. the familiar tool name, which
      the cost and latency perturbations point at the costlier equivalent: should score 0% there.
    """

    name = "replay"
    supports_forced_tool_choice = False

    def __init__(self, fmt: CallFormat, mode: ReplayMode = "reference"):
        if mode not in ("reference", "familiar"):
            raise ValueError(f"replay mode must be 'reference' or 'familiar', got {mode!r}")
        self.fmt, self.mode = fmt, mode

    def generate(self, requests: Sequence[GenRequest]) -> list[Generation]:
        out = []
        for r in requests:
            calls = r.example.reference if self.mode == "reference" else r.familiar
            response = r.example.response if not calls else None
            out.append(Generation(self.fmt.render_target(calls, response=response)))
        return out
