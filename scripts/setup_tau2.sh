#!/usr/bin/env bash
# Create the τ²-bench environment: a Python 3.12 venv at .venv-tau2 (or $1) holding the vendored
# tau2 wheel and its dependencies (litellm and friends) from the package index.
#
#   scripts/setup_tau2.sh                 # -> .venv-tau2 next to this checkout's pyproject.toml
#   scripts/setup_tau2.sh /path/to/venv   # elsewhere
#
# Environment: TAU2_WHEEL (default ../shared/vendor/tau2-1.0.1-py3-none-any.whl from the repository
# root), PYTHON312 (default python3.12; PYENV_VERSION=3.12.1 is set for pyenv shims).
# Idempotent: rerunning reuses the venv and skips what is installed. cipr-tau2 installs nothing at
# run time; it only runs this venv's python.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$root/.venv-tau2}"
wheel="${TAU2_WHEEL:-$root/../shared/vendor/tau2-1.0.1-py3-none-any.whl}"
python="${PYTHON312:-python3.12}"
export PYENV_VERSION="${PYENV_VERSION:-3.12.1}"

if [ ! -f "$wheel" ]; then
  echo "setup_tau2: no tau2 wheel at $wheel (set TAU2_WHEEL)" >&2
  exit 2
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
printf '*\n' > "$venv/.gitignore"
"$venv/bin/python" -m pip install --quiet "$wheel" 2> >(grep -v "is ignored: it is neither" >&2)
"$venv/bin/python" -c "import litellm; from tau2.runner import build_text_orchestrator, run_simulation"
echo "setup_tau2: $("$venv/bin/python" -c 'import sys, tau2; print(sys.version.split()[0], tau2.__file__)')"
