"""Preemption flag and callback (signals, notice file, agreement across ranks, requeue policy) and the
launcher wrapper that turns time-limit signals into the notice file."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest
import torch.multiprocessing as mp
from transformers import TrainerControl

from cipr.ops.launch import DEFAULT_ACCELERATE_CONFIG, accelerate_command, run_launcher
from cipr.ops.preemption import (
    NONE,
    NOTICE,
    STOP,
    STOP_AND_REQUEUE,
    PreemptionCallback,
    PreemptionConfig,
    PreemptionFlag,
    agree,
    severity,
)


@pytest.fixture
def fake_scontrol(tmp_path, monkeypatch):
    """An `scontrol` on PATH that records its arguments; SLURM_JOB_ID=42."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    return calls


def _step(cb: PreemptionCallback, step: int = 3) -> TrainerControl:
    args, state = SimpleNamespace(device="cpu"), SimpleNamespace(global_step=step, is_world_process_zero=True)
    return cb.on_step_end(args, state, TrainerControl())


def _end(cb: PreemptionCallback) -> None:
    cb.on_train_end(SimpleNamespace(device="cpu"), SimpleNamespace(global_step=3, is_world_process_zero=True),
                    TrainerControl())


def test_severity_of_each_reason():
    assert [severity(r) for r in (None, "SIGTERM", "SIGUSR1", "SIGUSR2", NOTICE)] == \
        [NONE, STOP, STOP_AND_REQUEUE, STOP_AND_REQUEUE, STOP_AND_REQUEUE]


def test_signal_only_sets_the_flag_and_restore_puts_the_old_handler_back():
    before = signal.getsignal(signal.SIGUSR1)
    flag = PreemptionFlag(("SIGUSR1",), notice_file="")
    assert not flag.poll()
    os.kill(os.getpid(), signal.SIGUSR1)
    assert flag.set and flag.received == "SIGUSR1"
    os.kill(os.getpid(), signal.SIGUSR1)  # a second signal keeps the first reason
    assert flag.received == "SIGUSR1"
    flag.restore()
    assert signal.getsignal(signal.SIGUSR1) is before


def test_notice_file_stops_at_the_step_end_and_rank0_requeues_after_training(tmp_path, fake_scontrol):
    notice = tmp_path / "preempt"
    cb = PreemptionCallback(PreemptionConfig(notice_file=str(notice)))
    control = _step(cb)
    assert not (control.should_save or control.should_training_stop)
    notice.touch()
    control = _step(cb)
    assert control.should_save and control.should_training_stop and cb.flag.received == NOTICE
    assert not fake_scontrol.exists()  # not before the save: only when training has ended
    _end(cb)
    assert fake_scontrol.read_text().split() == ["requeue", "42"]


def test_sigterm_saves_and_stops_without_requeue(tmp_path, fake_scontrol):
    cb = PreemptionCallback(PreemptionConfig(notice_file=""))
    os.kill(os.getpid(), signal.SIGTERM)
    control = _step(cb)
    assert control.should_save and control.should_training_stop and cb.flag.received == "SIGTERM"
    _end(cb)
    assert not fake_scontrol.exists()  # scancel/requeue/preemption: Slurm has decided


def test_notice_env_is_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("CIPR_PREEMPT_FILE", str(tmp_path / "n"))
    cb = PreemptionCallback(PreemptionConfig(requeue=False))
    assert cb.flag.notice_file == str(tmp_path / "n")
    cb.flag.restore()


def _agree_worker(rank: int, port: int, values: list[int], out) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=len(values))
    out.put((rank, agree(values[rank])))
    dist.destroy_process_group()


def test_ranks_agree_on_the_strongest_request():
    assert agree(STOP) == STOP  # one process: no collective
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")  # the children inherit the imports; gloo on CPU is fork-safe
    out = ctx.Queue()
    procs = [ctx.Process(target=_agree_worker, args=(r, port, [NONE, STOP_AND_REQUEUE], out)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
    assert results == {0: STOP_AND_REQUEUE, 1: STOP_AND_REQUEUE}


def test_accelerate_command_defaults_to_the_ddp_config():
    cmd = accelerate_command(2, 29511, None, ["trainer.max_steps=2"])
    assert cmd[cmd.index("--config_file") + 1] == str(DEFAULT_ACCELERATE_CONFIG)
    assert cmd[-3:] == ["-m", "cipr.cli.train", "trainer.max_steps=2"]
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        accelerate_command(2, 29511, "nope.yaml", [])


def test_run_launcher_turns_usr1_into_the_workers_notice_file(tmp_path):
    """A stand-in launcher whose 'worker' child waits for the notice file (and would die on USR1 itself)."""
    ready = tmp_path / "ready"
    worker = textwrap.dedent(f"""
        import os, pathlib, sys, time
        pathlib.Path({str(ready)!r}).touch()
        notice = os.environ["CIPR_PREEMPT_FILE"]
        for _ in range(600):
            if os.path.exists(notice):
                sys.exit(7)
            time.sleep(0.05)
        sys.exit(1)
    """)
    launcher = f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', {worker!r}]))"
    driver = textwrap.dedent(f"""
        import sys
        from cipr.ops.launch import run_launcher
        sys.exit(run_launcher([sys.executable, '-c', {launcher!r}]))
    """)
    env = {k: v for k, v in os.environ.items() if k != "CIPR_PREEMPT_FILE"}
    proc = subprocess.Popen([sys.executable, "-c", driver], env=env)
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=60) == 7  # the worker saw the notice; nobody died of USR1
    assert run_launcher([sys.executable, "-c", "import sys; sys.exit(3)"]) == 3


def test_a_handler_installed_before_training_gets_the_signal_after_the_save(fake_scontrol):
    """submitit's USR2 handler requeues through its own bookkeeping: it is called (once the run has saved)
    instead of scontrol."""
    called = []
    before = signal.signal(signal.SIGUSR2, lambda signum, frame: called.append(signum))
    try:
        cb = PreemptionCallback(PreemptionConfig(notice_file=""))
        os.kill(os.getpid(), signal.SIGUSR2)
        assert not called and _step(cb).should_save
        _end(cb)
        assert called == [signal.SIGUSR2] and not fake_scontrol.exists()
    finally:
        signal.signal(signal.SIGUSR2, before)


def test_resume_drops_the_end_line_a_preempted_stage_wrote_and_a_torn_line(tmp_path):
    import json

    from cipr.train.metrics import MetricsWriter

    writer = MetricsWriter(tmp_path)
    for record in ({"stage": "sft", "kind": "step", "step": 1}, {"stage": "sft", "kind": "step", "step": 2},
                   # SIGTERM: the Trainer still ends the stage
                   {"stage": "sft", "kind": "stage_end", "step": 2}):
        writer.write(record)
    with writer.path.open("a") as f:
        f.write('{"stage": "sft", "ki')  # a kill in the middle of a line
    assert writer.truncate_after("sft", 2) == 2
    assert [json.loads(x)["kind"] for x in writer.path.read_text().splitlines()] == ["step", "step"]
