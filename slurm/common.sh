# Sourced by the batch scripts: prerequisite checks with clear messages, and the environment.
# Nothing cluster-specific is hard-coded: partition, account, time and node counts come from the
# sbatch command line (or SBATCH_* environment variables); paths come from these variables:
#   CIPR_HOME   the checkout (default: the directory sbatch was called from)
#   CIPR_VENV   its virtual environment (default: $CIPR_HOME/.venv)
#   CIPR_DATA_ROOT, HF_HOME, WANDB_MODE  passed through as they are
set -euo pipefail

CIPR_HOME="${CIPR_HOME:-${SLURM_SUBMIT_DIR:-$PWD}}"
CIPR_VENV="${CIPR_VENV:-$CIPR_HOME/.venv}"

die() { echo "cipr slurm: $*" >&2; exit 2; }

[ -d "$CIPR_HOME/cipr" ] || die "CIPR_HOME=$CIPR_HOME is not a CIPR checkout (no cipr/ folder); submit from the checkout or export CIPR_HOME"
[ -x "$CIPR_VENV/bin/python" ] || die "no virtual environment at $CIPR_VENV: run the README set-up command there, or export CIPR_VENV"
command -v scontrol >/dev/null || die "scontrol not found: these scripts must run inside a Slurm allocation"
[ -n "${SLURM_JOB_ID:-}" ] || die "SLURM_JOB_ID is not set: submit with sbatch, do not run this script directly"

export PATH="$CIPR_VENV/bin:$PATH"
export PYTHONUNBUFFERED=1
cd "$CIPR_HOME"
echo "cipr slurm: job ${SLURM_JOB_ID} restart ${SLURM_RESTART_COUNT:-0} on $(hostname) at $(date -Is)"

# Run a command as the job step and forward preemption signals to it: the Python side only sets a
# flag, saves at the next step boundary and requeues (cipr/ops/preemption.py).
run_step() {
  "$@" &
  local pid=$!
  trap 'kill -USR1 "$pid" 2>/dev/null || true' USR1
  trap 'kill -TERM "$pid" 2>/dev/null || true' TERM
  local rc=0
  wait "$pid" || rc=$?
  while kill -0 "$pid" 2>/dev/null; do wait "$pid" || rc=$?; done
  return "$rc"
}
