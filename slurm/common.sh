# Sourced by the batch scripts: prerequisite checks with clear messages, the environment, run_step.
# Nothing cluster-specific is hard-coded: partition, account, time and node counts come from the
# sbatch command line (or SBATCH_* environment variables); paths come from these variables:
#   CIPR_HOME         the checkout (default: the directory sbatch was called from)
#   CIPR_VENV         its virtual environment (default: $CIPR_HOME/.venv)
#   CIPR_PREEMPT_DIR  node-local folder for the preemption notice file (default: $TMPDIR or /tmp)
#   CIPR_DATA_ROOT, HF_HOME, HF_HUB_OFFLINE, WANDB_MODE  passed through as they are
set -euo pipefail

CIPR_HOME="${CIPR_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}"
CIPR_VENV="${CIPR_VENV:-$CIPR_HOME/.venv}"

die() { echo "cipr slurm: $*" >&2; exit 2; }
# has_arg PREFIX ARGS...: whether one of ARGS starts with PREFIX (e.g. an override `trainer.run_dir=`)
has_arg() { local prefix=$1 a; shift; for a in "$@"; do [[ $a == "$prefix"* ]] && return 0; done; return 1; }

[ -d "$CIPR_HOME/cipr" ] || die "CIPR_HOME=$CIPR_HOME is not a CIPR checkout (no cipr/ folder); submit from the checkout or export CIPR_HOME"
[ -x "$CIPR_VENV/bin/python" ] || die "no virtual environment at $CIPR_VENV: run the README set-up command there, or export CIPR_VENV"
command -v scontrol >/dev/null || die "scontrol not found: these scripts must run inside a Slurm allocation"
[ -n "${SLURM_JOB_ID:-}" ] || die "SLURM_JOB_ID is not set: submit with sbatch, do not run this script directly"
"$CIPR_VENV/bin/python" -c "import cipr" 2>/dev/null || die "$CIPR_VENV/bin/python cannot import cipr: run the README set-up command (pip install -e .)"

export PATH="$CIPR_VENV/bin:$PATH"
export PYTHONUNBUFFERED=1
cd "$CIPR_HOME"
echo "cipr slurm: job ${SLURM_JOB_ID} restart ${SLURM_RESTART_COUNT:-0} on $(hostname) at $(date -Is)"

# Run a command as the job's main process and turn the time-limit warning into a stop request.
# `--signal=B:USR1@<seconds>` signals this shell only; it creates the notice file $CIPR_PREEMPT_FILE,
# which every training process checks at each step end: they save at that step boundary, stop, and
# rank 0 requeues the job (cipr/ops/preemption.py). No process is signalled from here, because under
# `accelerate launch` the child is a launcher that USR1 would kill. SIGTERM (scancel, scontrol
# requeue, preemption) reaches every process of the job from Slurm itself; it is passed on to the
# child as well in case only this shell received it. It stops without requeueing: Slurm has decided.
run_step() {
  export CIPR_PREEMPT_FILE="${CIPR_PREEMPT_DIR:-${TMPDIR:-/tmp}}/cipr-preempt-${SLURM_JOB_ID}-${SLURM_RESTART_COUNT:-0}"
  rm -f "$CIPR_PREEMPT_FILE"
  "$@" &
  local pid=$! rc=0
  trap 'echo "cipr slurm: USR1 at $(date -Is): the run saves at its next step boundary and requeues"; touch "$CIPR_PREEMPT_FILE"' USR1
  trap 'echo "cipr slurm: TERM at $(date -Is)"; kill -TERM "$pid" 2>/dev/null || true' TERM
  while :; do
    if wait "$pid"; then rc=0; else rc=$?; fi
    # above 128: a trapped signal interrupted `wait` (or the child died of a signal); an exited but
    # unreaped child still answers kill -0, so waiting again returns its own status
    if [ "$rc" -gt 128 ] && kill -0 "$pid" 2>/dev/null; then continue; fi
    break
  done
  trap - USR1 TERM
  rm -f "$CIPR_PREEMPT_FILE"
  return "$rc"
}
