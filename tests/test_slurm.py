"""A real single-node Slurm (Debian's slurm-wlm and munge) started on this machine: slurm/train.sbatch runs a
short tiny-model training job (SFT warm start + CIPR), which is requeued mid-run with `scontrol requeue`
and must finish from its checkpoint with the same metrics and weights as an uninterrupted run.

The cluster is private to the test: its own munged (own key and socket), slurmctld and slurmd on free
ports, every file in a temporary folder; all three daemons are stopped at the end, also on failure.
When they cannot be started the test is skipped with the exact error. CI installs the packages
(`apt-get install -y slurm-wlm munge`, see .ci/run).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "scontrol", "sinfo", "squeue", "scancel")
pytestmark = pytest.mark.integration  # starts a private Slurm: the integration tier


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _wait(what: str, check: Callable[[], object], timeout: float, every: float = 0.25) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def _settle(seconds: float = 6.0) -> None:
    """Let slurmd forget the requeued job's previous incarnation before it may start again.

    Slurm delays a requeued job's eligibility (about two minutes) because slurmd keeps the old
    incarnation's credential revoked for a while; starting it again within a second ("StartTime=now"
    at once) makes slurmctld kill it as "non-startable: Job credential revoked".
    """
    time.sleep(seconds)


def _tail(path: Path, n: int = 15) -> str:
    return ("\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.is_file()
            else f"({path} missing)")


class Cluster:
    """A private one-node Slurm cluster in `home`; `env` is what its clients need (SLURM_CONF)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.host = socket.gethostname().split(".")[0]
        self.conf = home / "slurm.conf"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SALLOC_"))}
        self.env = {**env, "SLURM_CONF": str(self.conf)}
        self.pid_files = {"munged": home / "munged.pid", "slurmctld": home / "slurmctld.pid",
                          "slurmd": home / "slurmd.pid"}

    def _run(self, *cmd: str, check: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess:
        result = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60, cwd=cwd)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def start(self) -> None:
        """Start munged, slurmctld and slurmd; raise RuntimeError with the exact error when one fails."""
        home = self.home
        (home / "state").mkdir()
        (home / "spool").mkdir()
        key = home / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self.socket = home / "munge.sock"
        self._daemon("munged", ["munged", "--force", f"--socket={self.socket}", f"--key-file={key}",
                                f"--pid-file={self.pid_files['munged']}", f"--log-file={home / 'munged.log'}",
                                f"--seed-file={home / 'munged.seed'}"], home / "munged.log")
        self.conf.write_text("\n".join([
            "ClusterName=ciprtest", f"SlurmctldHost={self.host}", "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", f"AuthInfo=socket={self.socket}", "CredType=cred/munge",
            f"StateSaveLocation={home / 'state'}", f"SlurmdSpoolDir={home / 'spool'}",
            f"SlurmctldPidFile={self.pid_files['slurmctld']}", f"SlurmdPidFile={self.pid_files['slurmd']}",
            f"SlurmctldLogFile={home / 'slurmctld.log'}", f"SlurmdLogFile={home / 'slurmd.log'}",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core", "ReturnToService=2", "JobRequeue=1", "KillWait=60",
            "MinJobAge=600", "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "MailProg=/bin/true",
            f"NodeName={self.host} CPUs={os.cpu_count() or 1} RealMemory=1000 State=UNKNOWN",
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP", ""]))
        self._daemon("slurmctld", ["slurmctld", "-f", str(self.conf)], home / "slurmctld.log")
        self._daemon("slurmd", ["slurmd", "-f", str(self.conf)], home / "slurmd.log")

        def idle() -> bool:
            state = self._run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()
            return state.startswith(("idle", "mixed", "allocated"))

        try:
            _wait("the node to come up idle", idle, 30)
        except TimeoutError as e:
            state = self._run("sinfo", "-h", "-N", "-o", "%T %E", check=False)
            raise RuntimeError(f"{e}: sinfo says {state.stdout.strip() or state.stderr.strip()!r}; "
                               f"slurmctld.log: {_tail(home / 'slurmctld.log', 5)}; slurmd.log: "
                               f"{_tail(home / 'slurmd.log', 5)}") from e

    def _daemon(self, name: str, cmd: list[str], log: Path) -> None:
        result = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60)
        try:
            _wait(f"{name}'s pid file", self.pid_files[name].is_file, 15)
        except TimeoutError:
            raise RuntimeError(f"{' '.join(cmd)} exited {result.returncode}: {result.stderr.strip()} "
                               f"{_tail(log, 5)}") from None

    def stop(self) -> None:
        """Cancel the jobs and stop the daemons (slurmd, slurmctld, munged), SIGKILL after 15 s."""
        if self.pid_files["slurmctld"].is_file():
            self._run("scancel", "--user", str(os.getuid()), check=False)
            try:
                _wait("the jobs to end",
                      lambda: not self._run("squeue", "-h", check=False).stdout.strip(), 90, 1)
            except TimeoutError:
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            path = self.pid_files[name]
            if not path.is_file():
                continue
            pid = int(path.read_text().split()[0])
            try:
                os.kill(pid, signal.SIGTERM)
                _wait(f"{name} to stop", lambda pid=pid: not Path(f"/proc/{pid}").exists(), 15)
            except ProcessLookupError:
                pass
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)

    def sbatch(self, *args: str, cwd: Path) -> str:
        out = self._run("sbatch", "--parsable", *args, check=True, cwd=cwd)
        return out.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        text = self._run("scontrol", "show", "job", "-o", job_id, check=False).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    missing = [t for t in (*DAEMONS, *CLIENTS) if shutil.which(t) is None]
    if missing:
        pytest.skip(f"Slurm/munge not installed (missing {', '.join(missing)}): "
                    "apt-get install -y slurm-wlm munge")
    if os.geteuid() != 0:
        pytest.skip(f"slurmd must run as root to start jobs; this test runs as uid {os.geteuid()}")
    cluster = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        try:
            cluster.start()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            pytest.skip(f"could not start a single-node Slurm: {e}")
        yield cluster
    finally:
        cluster.stop()


def _overrides(tiny: Path, run_dir: Path) -> list[str]:
    """cipr-train overrides: the tiny model, 4 SFT warm-start steps, then 6 CIPR steps (saves every 4)."""
    return [f"model.name_or_path={tiny}", "model=tiny", "data.n=8", "data.tools_per_example=[1,2]",
            "data.eval_examples=0", "algo=cipr", "rollout.num_generations=2",
            "rollout.max_completion_length=24", "trainer=smoke", f"trainer.run_dir={run_dir}",
            "trainer.max_steps=6", "trainer.save_steps=4", "trainer.per_device_train_batch_size=4",
            "trainer.learning_rate=1e-3", "++trainer.torch_threads=1", "trainer.warm_start.steps=4",
            "trainer.warm_start.learning_rate=0.03", "trainer.warm_start.per_device_train_batch_size=2",
            "trainer.warm_start.eval_examples=0", "logging.progress_bar=false"]


def _steps(run_dir: Path, stage: str | None = None) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("kind") == "step" and (stage is None or r["stage"] == stage)]


VARYING = ("time", "speed/", "memory/", "train_runtime", "train_samples_per_second", "train_steps_per_second",
           "train_tokens_per_second", "step_time")


def _comparable(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(VARYING) and isinstance(v, (int, float, str))}


def test_requeued_job_resumes_from_its_checkpoint_with_the_same_final_metrics(slurm, tmp_path):
    from safetensors.torch import load_file
    from support.tiny_models import save_tiny

    tiny = save_tiny(tmp_path / "tiny")
    env_opts = [f"--export=ALL,CIPR_HOME={ROOT},CIPR_VENV={sys.prefix},HF_HUB_OFFLINE=1,WANDB_MODE=disabled,"
                f"TOKENIZERS_PARALLELISM=false,OMP_NUM_THREADS=1"]
    jobs = {}
    for name in ("reference", "requeued"):
        jobs[name] = slurm.sbatch(*env_opts, f"--output={tmp_path / name}.out", "--time=00:20:00",
                                  str(ROOT / "slurm/train.sbatch"),
                                  *_overrides(tiny, tmp_path / name), cwd=ROOT)
    job, run_dir, log = jobs["requeued"], tmp_path / "requeued", tmp_path / "requeued.out"

    def running_cipr_step() -> bool:
        state = slurm.job(job).get("JobState")
        assert state in ("PENDING", "RUNNING", "CONFIGURING"), \
            f"job {job} is {state} before the requeue:\n{_tail(log)}"
        return bool(_steps(run_dir, "grpo"))

    _wait("the first CIPR step", running_cipr_step, 300, 0.1)
    subprocess.run(["scontrol", "requeue", job], env=slurm.env, check=True, capture_output=True, text=True)
    _wait("the first run to exit", lambda: "cipr-train: SIGTERM received" in log.read_text(), 120)
    _wait("the job to be pending again", lambda: slurm.job(job).get("JobState") == "PENDING", 60)
    _settle()
    _wait("the start time to be moved to now", lambda: subprocess.run(
        ["scontrol", "update", f"jobid={job}", "StartTime=now"], env=slurm.env,
        capture_output=True).returncode == 0, 30)

    def finished(name: str) -> bool:
        state = slurm.job(jobs[name]).get("JobState")
        assert state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "COMPLETED"), \
            f"the {name} job ended {state}:\n{_tail(tmp_path / f'{name}.out', 30)}"
        return state == "COMPLETED"

    _wait("the requeued job to finish", lambda: finished("requeued"), 400, 1)
    _wait("the reference job to finish", lambda: finished("reference"), 300, 1)

    text = log.read_text()
    assert slurm.job(job).get("Restarts") == "1" and "restart 1 on" in text, _tail(log, 40)
    stopped = re.search(r"stop requested \(SIGTERM\): saving at step (\d+)", text)
    assert stopped, _tail(log, 40)
    step = int(stopped.group(1))
    assert 1 <= step < 6 and step != 4, \
        f"the requeue must interrupt the CIPR stage between saves (step {step})"
    assert re.search(rf"resuming grpo from \S+checkpoint-{step} \(step {step}\)", text), _tail(log, 40)
    assert "requeueing Slurm job" not in text  # after SIGTERM Slurm has requeued the job itself

    reference, resumed = _steps(tmp_path / "reference"), _steps(run_dir)
    assert [(r["stage"], r["step"]) for r in resumed] == [("warm_start", s) for s in range(1, 5)] + \
        [("grpo", s) for s in range(1, 7)]
    for a, b in zip(reference, resumed, strict=True):
        ca, cb = _comparable(a), _comparable(b)
        assert ca.keys() == cb.keys()
        for key in ca:
            expected = ca[key] if isinstance(ca[key], str) else pytest.approx(ca[key], rel=1e-6, abs=1e-12)
            assert cb[key] == expected, (a["stage"], a["step"], key)
    wa = load_file(tmp_path / "reference" / "grpo" / "final" / "model.safetensors")
    wb = load_file(run_dir / "grpo" / "final" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert json.loads((run_dir / "grpo" / "stage.json").read_text())["steps"] == 6


def test_time_limit_warning_saves_requeues_itself_and_resumes(slurm, tmp_path):
    """USR1 to the batch shell only (what `--signal=B:USR1@300` sends before the time limit): the run saves
    at the next step boundary, rank 0 requeues the job, and the requeued job resumes from that save."""
    from support.tiny_models import save_tiny

    tiny = save_tiny(tmp_path / "tiny")
    run_dir, log = tmp_path / "run", tmp_path / "job.out"
    overrides = [f"model.name_or_path={tiny}", "model=tiny", "data.n=8", "data.tools_per_example=[1,2]",
                 "data.eval_examples=0", "algo=sft",
                 "trainer=smoke", f"trainer.run_dir={run_dir}", "trainer.max_steps=8",
                 "trainer.save_steps=100", "trainer.per_device_train_batch_size=2",
                 "trainer.learning_rate=1e-3", "++trainer.torch_threads=1", "logging.progress_bar=false"]
    job = slurm.sbatch(f"--export=ALL,CIPR_HOME={ROOT},CIPR_VENV={sys.prefix},"
                       "HF_HUB_OFFLINE=1,OMP_NUM_THREADS=1",
                       f"--output={log}", "--time=00:20:00", str(ROOT / "slurm/train.sbatch"),
                       *overrides, cwd=ROOT)
    _wait("the first SFT step", lambda: bool(_steps(run_dir, "sft")), 300, 0.1)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], env=slurm.env, check=True,
                   capture_output=True)
    _wait("the run to requeue itself", lambda: "requeueing Slurm job" in log.read_text(), 120)
    _wait("the job to be pending again", lambda: slurm.job(job).get("JobState") == "PENDING", 60)
    _settle()
    _wait("the start time to be moved to now", lambda: subprocess.run(
        ["scontrol", "update", f"jobid={job}", "StartTime=now"], env=slurm.env,
        capture_output=True).returncode == 0, 30)
    _wait("the requeued job to finish",
          lambda: slurm.job(job).get("JobState") in ("COMPLETED", "FAILED"), 300, 1)

    text = log.read_text()
    assert slurm.job(job).get("JobState") == "COMPLETED" and slurm.job(job).get("Restarts") == "1", \
        _tail(log, 40)
    assert "cipr slurm: USR1 at" in text, _tail(log, 40)
    stopped = re.search(r"stop requested \((notice file|SIGUSR1)\): saving at step (\d+)", text)
    assert stopped, _tail(log, 40)
    step = int(stopped.group(2))
    assert 1 <= step < 8 and re.search(rf"resuming sft from \S+checkpoint-{step} \(step {step}\)", text), \
        _tail(log, 40)
    assert [r["step"] for r in _steps(run_dir, "sft")] == list(range(1, 9))
    assert json.loads((run_dir / "sft" / "stage.json").read_text())["steps"] == 8


def test_submitit_sweep_runs_each_point_as_a_job_and_a_usr2_point_resumes(slurm, tmp_path):
    """`cipr-train -m launcher=slurm +sweep=consistency` over two seeds: one array job per point, each in its
    own run folder. Point 0 gets submitit's time-limit signal (USR2) mid-run: it saves at the step boundary,
    hands the signal to submitit, which requeues it; it resumes and the sweep ends with both points done."""
    from support.tiny_models import save_tiny

    tiny = save_tiny(tmp_path / "tiny")
    env = {**slurm.env, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CIPR_SLURM_GPUS_PER_NODE": "null",
           "CIPR_SLURM_CPUS_PER_TASK": "1", "CIPR_SLURM_TIME_MIN": "20"}
    cmd = [sys.executable, "-m", "cipr.cli.train", "-m", "launcher=slurm", "+sweep=consistency", "model=tiny",
           f"model.name_or_path={tiny}", "data.n=4", "data.tools_per_example=[1,1]", "data.eval_examples=0",
           "rollout.num_generations=2", "rollout.max_completion_length=16", "trainer=smoke",
           "trainer.resume=auto", "trainer.max_steps=4", "trainer.save_steps=10",
           "trainer.per_device_train_batch_size=4", "trainer.warm_start.steps=0", "++trainer.torch_threads=1",
           "logging.progress_bar=false", "algo.terms.rescore.weight=0.1", "algo.terms.rollout.weight=0.1",
           "trainer.seed=0,1"]
    driver = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        root = tmp_path / "runs/sweeps/consistency/tiny"
        point = root / "rs0.1_ro0.1_s0"
        _wait("point 0's first CIPR step",
              lambda: driver.poll() is None and bool(_steps(point, "grpo")), 300, 0.1)
        # holds <array>_<task> folders and .submission_* files
        submitit_dir = root / ".hydra_multirun/.submitit"
        array = _wait("the array job's folder", lambda: next(
            (p.name.split("_")[0]
             for p in submitit_dir.iterdir() if p.is_dir() and p.name.split("_")[0].isdigit()),
            None), 60)
        job = f"{array}_0"
        subprocess.run(["scancel", "--signal=USR2", job], env=slurm.env, check=True, capture_output=True)
        _wait("point 0 to be requeued", lambda: slurm.job(job).get("JobState") == "PENDING", 120)
        _settle()
        _wait("the start time to be moved to now", lambda: subprocess.run(
            ["scontrol", "update", f"jobid={job}", "StartTime=now"], env=slurm.env,
            capture_output=True).returncode == 0, 30)
        out, _ = driver.communicate(timeout=400)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, out[-4000:]
    logs = "\n".join(p.read_text(errors="replace")
                     for p in (root / ".hydra_multirun/.submitit").rglob(f"{array}_0_*.*")
                     if p.suffix in (".out", ".err"))
    stopped = re.search(r"stop requested \(SIGUSR2\): saving at step (\d+)", logs)
    assert stopped and "handing SIGUSR2 to the handler installed before training" in logs, logs[-4000:]
    step = int(stopped.group(1))
    assert step < 4 and re.search(rf"resuming grpo from \S+checkpoint-{step} \(step {step}\)", logs), \
        logs[-4000:]
    assert slurm.job(job).get("Restarts") == "1"
    for seed in (0, 1):
        run_dir = root / f"rs0.1_ro0.1_s{seed}"
        assert json.loads((run_dir / "config.json").read_text())["trainer"]["seed"] == seed
        assert [r["step"] for r in _steps(run_dir, "grpo")] == [1, 2, 3, 4]
        assert json.loads((run_dir / "grpo" / "stage.json").read_text())["steps"] == 4
