#!/usr/bin/env bash
# Creates the peers' environment for the benchmarks: Stable-Baselines3 on CPU PyTorch, and sbx-rl
# (Stable-Baselines-Jax) with its own jax/flax/optax, plus MuJoCo for Gymnasium's locomotion envs, in
# their own venv (.bench-venv, gitignored) so their pins never clash with sparqrl's.
#
#   bash benchmarks/setup_peer.sh            # idempotent: a second run only checks the versions
#
# torch is installed FIRST and pinned, from the CPU wheel: a plain `pip install torch` (or letting
# SB3 pull it) would fetch the multi-GB CUDA build.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BENCH_VENV:-$ROOT/.bench-venv}"

TORCH_VERSION="2.13.0"
SB3_VERSION="2.9.2"
SBX_VERSION="0.28.0"

source "$ROOT/benchmarks/peer_venv.sh"
make_venv "$VENV"

if ! have torch "$TORCH_VERSION"; then
    # The CPU wheel is `torch-2.13.0+cpu`; the PyTorch CPU index serves it too where reachable.
    "$PY" -m pip install --quiet "torch==${TORCH_VERSION}+cpu" \
        || "$PY" -m pip install --quiet "torch==${TORCH_VERSION}" \
              --index-url https://download.pytorch.org/whl/cpu
fi

if ! have stable-baselines3 "$SB3_VERSION" || ! "$PY" -c "import gymnasium" 2>/dev/null; then
    # Keep the torch already there: SB3 accepts it, and re-resolving could swap in a CUDA build.
    "$PY" -m pip install --quiet "stable-baselines3==${SB3_VERSION}" gymnasium "torch==${TORCH_VERSION}+cpu"
fi

if ! have sbx-rl "$SBX_VERSION" || ! "$PY" -c "import gymnasium.envs.mujoco" 2>/dev/null; then
    # sbx pulls jax/flax/optax (let pip pick them); torch stays pinned to the CPU wheel in the same
    # command so the resolver cannot swap it. gymnasium[mujoco] = mujoco, imageio and packaging: what
    # gymnasium's MuJoCo envs (HalfCheetah-v5, ...) import.
    "$PY" -m pip install --quiet "sbx-rl==${SBX_VERSION}" "stable-baselines3==${SB3_VERSION}" \
        "torch==${TORCH_VERSION}+cpu" "gymnasium[mujoco]"
fi

"$PY" - <<'EOF'
import gymnasium, gymnasium.envs.mujoco, jax, mujoco, sbx, stable_baselines3, torch
print(f"peer venv ok: stable-baselines3 {stable_baselines3.__version__}, torch {torch.__version__} "
      f"(cuda build: {torch.version.cuda is not None}), gymnasium {gymnasium.__version__}, "
      f"sbx {sbx.__version__}, jax {jax.__version__} ({jax.default_backend()}), mujoco {mujoco.__version__}")
EOF
