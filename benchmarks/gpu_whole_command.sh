#!/usr/bin/env bash
# sparqrl's GPU checks on a GPU machine without network access, each in one go, on that machine's own JAX (its
# CUDA build; not the `cuda` extra), the rest from local wheels:
#
#   bash benchmarks/gpu_whole_command.sh download        # here, with network: wheels for Python 3.12 into .whl/
#   bash benchmarks/gpu_whole_command.sh [SEEDS] [ROUNDS] # there: benchmarks/whole_command.py, sparqrl's whole
#       `sparqrl train ppo --env CartPole-v1` command against the rejax script (issue 33, items 1 and 2; default
#       1,1024,4096 seeds and 1 round); JSON to $OUT
#   bash benchmarks/gpu_whole_command.sh kernels [SEEDS]  # there: the compiled update on both sides instead
#       (benchmarks/kernel_counts.py: kernels per update in the GPU's optimized program, and the whole program's and
#       the runner's env steps/s against rejax's, one round per seed count; default "1 1024"; JSON to $OUT)
#   bash benchmarks/gpu_whole_command.sh repro NAMES      # there: the reproduction suite's GPU entries NAMES
#       (comma-separated, `benchmarks/repro.py --suite gpu --list`; issue 37) into $OUT/results (gpu.csv and the
#       curves, to merge into benchmarks/results here; REPRO_COMMIT=<this tree's commit> names the code, as the copy
#       sent there has no git); the run folders stay there
#
# With the device tool: `echo /.whl/ >> .git/info/exclude` once, the download here, then a run that carries
# `.whl` and calls this script (about 6 minutes for one round: 1, 1024 and 4096 seeds, both sides).
# .whl/sparqrl: what sparqrl's core needs beyond the machine's image (its jax, numpy, matplotlib, tensorstore,
# rich, torch... stay): sparqrl's pins of flax, optax, chex, orbax-checkpoint, gymnax, gymnasium, tensorboard,
# tyro and their small dependencies. .whl/rejax: rejax 0.1.3 with gymnax 0.0.9 (the 5-tuple step it unpacks),
# distrax and TensorFlow Probability, installed apart and put first on the rejax side's path. Each side runs
# in its own fresh processes with an empty cache folder, as on the CPU (whole_command.py's docstring). The
# machine's python3 holds torch: the sparqrl side runs where torch is installed, as many GPU users' do.
# .whl/envs (repro only): the brax and atari extras' pins (brax, MuJoCo and MJX, ALE) and what they import that
# the image lacks; not mujoco-studio (MuJoCo's viewer, 13 MB, never imported), so the whole .whl stays under the
# device tool's 64 MiB (about 41 MB); OpenCV, SciPy and Pillow are the image's.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WHEELS="$ROOT/.whl"

SPARQRL_WHEELS=(
    "flax==0.12.8" "optax==0.2.8" "chex==0.1.92" "orbax-checkpoint==0.12.8" "gymnax==1.0.1" "gymnasium==1.3.0"
    "tensorboard==2.21.0" "tyro==1.0.17" "six==1.17.0" "farama-notifications==0.0.4" "docstring-parser==0.17.0"
    "shtab==1.7.2" "typeguard==4.4.4" "nest-asyncio==1.6.0" "lazy-loader==0.6"
)
ENV_WHEELS=(
    "brax==0.14.2" "mujoco==4.0.0" "mujoco-core==4.0.0" "mujoco-mjx==3.17.0" "trimesh==5.2.0" "ml-collections==1.1.0"
    "jaxopt==0.8.5" "glfw==2.11.0" "pyopengl==3.1.10" "ale-py==0.12.1"
)
REJAX_WHEELS=(
    "rejax==0.1.3" "gymnax==0.0.9" "distrax==0.1.9" "tfp-nightly==0.26.0.dev20261027" "decorator==5.2.1"
    "gast==0.6.0" "dm-tree==0.1.9"
)

if [[ "${1:-}" == "download" ]]; then
    download() {  # folder, specs...: binary wheels for CPython 3.12 on x86-64 Linux, no dependencies
        local into="$1"; shift
        python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d "$into" "$@"
    }
    mkdir -p "$WHEELS/sparqrl" "$WHEELS/rejax" "$WHEELS/envs"
    download "$WHEELS/sparqrl" "${SPARQRL_WHEELS[@]}"
    download "$WHEELS/rejax" "${REJAX_WHEELS[@]}"
    download "$WHEELS/envs" "${ENV_WHEELS[@]}"
    du -sh "$WHEELS"
    exit 0
fi

OUT="${OUT:-$ROOT/out}"
mkdir -p "$OUT"
for side in sparqrl rejax; do
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "/tmp/site-$side" \
        "$WHEELS/$side"/*.whl
done
nvidia-smi -L || true
python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
export MUJOCO_GL=disable  # (no EGL library there; nothing here renders)
if [[ "${1:-}" == "repro" ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-sparqrl \
        "$WHEELS/envs"/*.whl
    PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site-sparqrl:$ROOT" python3 "$ROOT/benchmarks/repro.py" --suite gpu \
        --only "${2:?the entries to run, comma-separated}" --out "$OUT/results" --runs /tmp/repro-runs 2>&1 \
        | tee "$OUT/repro.log"
    exit 0
fi
if [[ "${1:-}" == "kernels" ]]; then
    for seeds in ${2:-1 1024}; do
        PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site-sparqrl:$ROOT" python3 "$ROOT/benchmarks/kernel_counts.py" \
            --time 1 --runner --seeds "$seeds" --peer-python "$(command -v python3)" \
            --peer-pythonpath "/tmp/site-rejax:/tmp/site-sparqrl" --sparqrl-pythonpath "/tmp/site-sparqrl:$ROOT" \
            --json "$OUT/kernels_$seeds.json" 2>&1 | tee "$OUT/kernels_$seeds.log"
    done
    exit 0
fi
SEEDS="${1:-1,1024,4096}"
ROUNDS="${2:-1}"
PYTHONUNBUFFERED=1 python3 "$ROOT/benchmarks/whole_command.py" --seeds "$SEEDS" --rounds "$ROUNDS" \
    --sparqrl-python "$(command -v python3)" --sparqrl-pythonpath "/tmp/site-sparqrl:$ROOT" \
    --peer-python "$(command -v python3)" --peer-pythonpath "/tmp/site-rejax:/tmp/site-sparqrl" \
    --timeout 400 --json "$OUT/whole_command_gpu.json" 2>&1 | tee "$OUT/whole_command_gpu.log"
