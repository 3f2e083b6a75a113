"""cipr-plan's memory estimate of the supervised regime (`cipr.plan.plan.supervised_activations`): the formula
by hand, and the plan of the smoke experiment's supervised command (`experiment=smoke algo=cipr_sft`)."""

from __future__ import annotations

import pytest

from cipr.plan import PlanOptions, make_plan
from cipr.plan.plan import supervised_activations

SMALL = {"rows": 4, "read_rows": 2, "seq": 10, "target": 3, "trained_layers": 2, "hidden": 8,
         "intermediate": 16, "kv_dim": 4, "vocab": 100, "compute_bytes": 2}


def test_supervised_activations_by_hand():
    # one layer's activations A1(4) = 2·4·10·(12·8 + 3·4 + 4·16) = 80·172 = 13760 bytes
    a = supervised_activations(**SMALL, action_supervision=False, checkpointing=False)
    assert a.layers == 2 * 2 * (4 + 2) * 10 * 8 + 2 * 13760  # both forwards' layer inputs + one recomputed
    assert a.logits == 2 * 4 * (4 * 3) * 100  # TRL's head: one float32 tile of 12 positions, each way
    assert a.mask == 0 and a.total == 1920 + 27520 + 9600
    assert (a.batch, a.seq, a.scored) == (4, 10, 3)


def test_supervised_activations_head_tiles_action_supervision_and_packed_mask():
    wide = {**SMALL, "vocab": 40_000}
    trl_head = supervised_activations(**wide, action_supervision=False, checkpointing=False)
    assert trl_head.logits == 2 * 4 * 12 * 32_768  # a tile spans at most 32768 vocabulary columns
    long = supervised_activations(**{**wide, "rows": 2000}, action_supervision=False, checkpointing=False)
    assert long.logits == 2 * 4 * 4096 * 32_768  # and at most 4096 positions
    reader = supervised_activations(**wide, action_supervision=True, checkpointing=False)
    assert reader.logits == 2 * 4 * 4 * 3 * 40_000  # the reader's float32 logits and log-softmax
    assert supervised_activations(**wide, action_supervision=True, checkpointing=True).mask == 2 * 2 * 100
    alone = {**wide, "read_rows": 0}
    assert supervised_activations(**alone, action_supervision=True, checkpointing=True).mask == 2 * 4 * 100
    assert supervised_activations(**alone, action_supervision=False, checkpointing=True).mask == 0


@pytest.mark.parametrize(("extra", "read_rows", "action"), [
    ((), 8, False),                                           # cipr_sft: the rescoring term trains
    (("algo.action_weight=1.0",), 8, True),                   # with action supervision
    (("algo.terms.rescore.weight=0.0",), 0, False),           # read for the log only: no graph
])
def test_the_plan_of_smokes_supervised_command(extra, read_rows, action):
    plan = make_plan(["experiment=smoke", "algo=cipr_sft", *extra], PlanOptions(out="", rows=16))
    assert plan.ok, plan.findings.errors
    memory = plan.facts["memory"]
    got = memory["activations"]["supervised"]
    model = plan.facts["model"]
    assert got["batch"] == 16  # 8 examples and their copies
    want = supervised_activations(rows=16, read_rows=read_rows, seq=got["seq"], target=got["scored"],
                                  trained_layers=model["layers"] - 20, hidden=model["hidden"],
                                  intermediate=model["intermediate"], kv_dim=model["kv_dim"],
                                  vocab=model["vocab"], compute_bytes=2, action_supervision=action,
                                  checkpointing=False)
    assert got["total"] == round(want.total / 2**30, 2)
    pre = plan.preflight.lengths
    assert got["seq"] == pre["prompt_target"].max and got["scored"] == pre["target"].max
    assert memory["activations"]["warm_start"]["batch"] == 4  # smoke's warm start: action supervision
