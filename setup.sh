#!/usr/bin/env bash
# Set up sparqrl from nothing: a virtual environment in .venv with the pinned working set, editable.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[all]"
echo "sparqrl is set up in .venv ($(.venv/bin/python -c 'import jax; print("jax", jax.__version__, jax.devices())' 2>/dev/null))"
