"""Start-up imports only what it needs (issue 33, items 3 and 4): `sparqrl --help`, `sparqrl train ppo --help` and
a train command's set-up before compilation import none of the heavy libraries below, and nothing imports
distrax or TensorFlow Probability at all. Each check runs in a fresh interpreter (this one has imported
whatever other tests needed), with stand-in `torch` and `tensorflow` packages first on the path: each notes an
import that reaches it, then fails as a missing package would (neither is installed here; on a user's machine they
often are)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "tensorflow", "tensorflow_probability", "tensorboardX", "orbax", "ray", "matplotlib", "distrax")

LOADED = f"""
def loaded():
    import builtins
    names = {{m.split(".")[0] for m, module in sys.modules.items() if module is not None}}
    names |= getattr(builtins, "STAND_INS_RAN", set())
    return sorted(names & {set(HEAVY)!r})
"""
STAND_IN = """import builtins
builtins.STAND_INS_RAN = getattr(builtins, "STAND_INS_RAN", set()) | {__name__}  # an import reached it
raise ImportError(f"the tests' stand-in {__name__}")
"""
STOOD_IN = ("torch", "tensorflow")

STARTING = """
import contextlib, io, json, sys
from sparqrl.entry import main
out, seen = sys.argv[1], {}
for argv in (["--help"], ["train", "ppo", "--help"]):
    sys.argv = ["sparqrl", *argv]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main()
    seen[" ".join(argv)] = loaded()

from sparqrl import cli
from sparqrl.runners import anakin
from sparqrl.telemetry import RunLogger

def stop(rundir, *args, **kwargs):  # where the run would build (compile) its programs
    RunLogger(rundir.path)  # and its logger, before the first chunk's scalars
    seen["set-up"] = loaded()
    raise SystemExit(0)

anakin.run_session = stop
with contextlib.suppress(SystemExit):
    cli.main(["train", "ppo", "--env", "CartPole-v1", "--out", out, "--no-progress", "--no-energy"])
print(json.dumps(seen))
"""

WRITER = """
import json, sys
from pathlib import Path
from sparqrl.telemetry.logger import TensorBoardWriter

writer = TensorBoardWriter(Path(sys.argv[1]))
writer.scalars(7, {"train/loss": 0.5})
writer.close()
heavy = loaded()
try:
    import torch  # the user's own code still reaches torch: nothing of the hiding is left
except ImportError:
    pass
events = len(list(Path(sys.argv[1]).iterdir()))
print(json.dumps({"heavy": heavy, "torch_later": loaded() == ["torch"], "events": events}))
"""


def run_python(code: str, tmp_path: Path, *args: str):
    """The JSON the last line of `code` prints, run in a fresh interpreter with the stand-ins first on the path."""
    stand_in = tmp_path / "stand_in"
    for name in STOOD_IN:
        (stand_in / name).mkdir(parents=True, exist_ok=True)
        (stand_in / name / "__init__.py").write_text(STAND_IN)
    path = [str(stand_in), *filter(None, [os.environ.get("PYTHONPATH")])]  # the sparqrl under test first after it
    env = {"PYTHONPATH": os.pathsep.join(path), "JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", "import sys\n" + LOADED + code, *args], capture_output=True,
                         text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_help_and_a_train_commands_set_up_import_nothing_heavy(tmp_path):
    """The two help texts, then a train command up to where it compiles: parsing, config checks, the
    environment, the driver (its programs traced for their shapes), the run folder and the run's logger."""
    seen = run_python(STARTING, tmp_path, str(tmp_path / "run"))
    assert seen == {"--help": [], "train ppo --help": [], "set-up": []}


HELPING = """
import contextlib, io, json, sys
from sparqrl.algos import ALGORITHMS
from sparqrl.entry import main
seen = {}
for argv in (["--help"], *(["train", name, "--help"] for name in ALGORITHMS)):
    sys.argv = ["sparqrl", *argv]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        main()
    seen[" ".join(argv)] = sorted({m.split(".")[0] for m in sys.modules} & {"jax", "flax", "optax", "gymnax", "gymnasium"})
print(json.dumps(seen))
"""


def test_help_texts_load_no_jax(tmp_path):
    """`sparqrl --help` and every algorithm's `train ALGO --help` read the configs without loading JAX or an
    environment library (JAX's import alone is ~0.85 s of the 1 s goal on the 2-core CPU)."""
    seen = run_python(HELPING, tmp_path)
    assert len(seen) > 6 and all(loaded == [] for loaded in seen.values()), seen


def test_the_tensorboard_writer_imports_neither_torch_nor_tensorflow(tmp_path):
    """The writer is TensorBoard's record writer and protos: no tensorboardX (which imports torch where it can),
    no TensorFlow (which TensorBoard's own EventFileWriter imports where it can); the user's code still reaches
    torch afterwards."""
    got = run_python(WRITER, tmp_path, str(tmp_path / "tb"))
    assert got == {"heavy": [], "torch_later": True, "events": 1}
