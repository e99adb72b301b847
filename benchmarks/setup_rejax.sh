#!/usr/bin/env bash
# Creates the rejax peer's environment for benchmarks/vs_rejax.py: rejax 0.1.3 on CPU JAX in its own
# venv (.bench-rejax-venv at the repo root, git-ignored), so its pins never clash with sparqrl's.
#
#   bash benchmarks/setup_rejax.sh           # idempotent: a second run only checks the versions
#
# Why a venv of its own: rejax 0.1.3 unpacks gymnax's step as the 5-tuple of gymnax < 1.0
# (obs, state, reward, done, info); gymnax 1.x returns 6 (terminated and truncated apart), which
# sparqrl needs. rejax's own metadata only asks for jax>=0.4.34, flax>=0.9, optax>=0.2.3,
# distrax>=0.1.5, gymnax>=0.0.9, pyyaml, so gymnax is pinned here to 0.0.9 (the last before 1.0) and
# everything else to the SAME versions as sparqrl's pyproject.toml (jax/jaxlib 0.10.2, flax 0.12.8,
# ...): both sides then run on the same XLA, and the benchmark compares the libraries, not compilers.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BENCH_REJAX_VENV:-$ROOT/.bench-rejax-venv}"

REJAX_VERSION="0.1.3"
GYMNAX_VERSION="0.0.9"
# sparqrl's pins (pyproject.toml): same JAX stack on both sides
PINS=(
    "jax==0.10.2" "jaxlib==0.10.2" "flax==0.12.8" "optax==0.2.8" "chex==0.1.92" "distrax==0.1.9"
    "tfp-nightly==0.26.0.dev20261027" "numpy==2.4.6" "gymnasium==1.3.0" "matplotlib==3.11.2"
)

source "$ROOT/benchmarks/peer_venv.sh"
make_venv "$VENV"

if ! have rejax "$REJAX_VERSION" || ! have gymnax "$GYMNAX_VERSION" || ! have jax 0.10.2 || ! have jaxlib 0.10.2; then
    "$PY" -m pip install --quiet --disable-pip-version-check \
        "rejax==${REJAX_VERSION}" "gymnax==${GYMNAX_VERSION}" "${PINS[@]}"
fi

"$PY" - <<'EOF'
import warnings
warnings.filterwarnings("ignore")
import flax, gymnax, jax, optax, rejax
from importlib.metadata import version
print(f"rejax venv ok: rejax {version('rejax')}, gymnax {version('gymnax')}, jax {jax.__version__} "
      f"({jax.default_backend()}), flax {flax.__version__}, optax {optax.__version__}")
EOF
