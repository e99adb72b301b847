#!/usr/bin/env bash
# Set up sparqrl from nothing: a virtual environment in .venv with the pinned working set, editable.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}

# Headless rendering for `sparqrl eval --video` on MuJoCo envs (MuJoCo gym: ids, brax:NAME): Mesa's EGL, which
# renders on the CPU without a display or GPU (MUJOCO_GL=egl, sparqrl's default), and OSMesa as a fallback
# (MUJOCO_GL=osmesa). Only where apt-get exists and we are root (Debian/Ubuntu, CI); otherwise docs/cli.md, "sparqrl eval".
GL_PACKAGES="libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0 libosmesa6"
if command -v apt-get >/dev/null 2>&1 && command -v dpkg-query >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  missing=$(for p in $GL_PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || echo "$p"
  done)
  if [ -n "$missing" ]; then
    # shellcheck disable=SC2086  # one word per package
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing \
        >/dev/null; } || echo "setup.sh: could not install $(echo $missing); MuJoCo videos need them" >&2
  fi
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[all]"
echo "sparqrl is set up in .venv ($(.venv/bin/python -c 'import jax; print("jax", jax.__version__, jax.devices())' 2>/dev/null))"
