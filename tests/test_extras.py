"""The core install works without any extra, and a missing extra is a one-line error naming its pip install.

The core is simulated in a subprocess that cannot import the extras' modules (an import hook refuses them), so
the test runs in the full set-up CI has."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from sparqrl import extras
from sparqrl.config import ConfigError

EXTRA_MODULES = sorted(extras.EXTRAS) + ["pygame", "mujoco_mjx"]

# Run the `sparqrl` command with every extra's module unimportable; argv from the test.
CORE_ONLY = textwrap.dedent(f"""
    import importlib.abc, sys
    BLOCKED = {EXTRA_MODULES!r}

    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    import importlib.util
    _find_spec = importlib.util.find_spec
    importlib.util.find_spec = lambda name, *a: None if name.split(".")[0] in BLOCKED else _find_spec(name, *a)
    sys.argv = ["sparqrl"] + sys.argv[1:]
    from sparqrl.entry import main
    main()
""")


def core_only(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": os.environ.get("XDG_CACHE_HOME", "/tmp/sparqrl-test-cache")}
    return subprocess.run([sys.executable, "-c", CORE_ONLY, *argv], capture_output=True, text=True, timeout=300,
                          env=env)


def test_the_core_trains_on_device_and_on_the_host_without_any_extra(tmp_path):
    device = core_only("train", "ppo", "--steps", "2048", "--chunks", "2", "--eval-episodes", "2",
                       "--out", str(tmp_path / "ppo"), "--no-progress")
    assert device.returncode == 0, device.stderr[-2000:]
    summary = json.loads((tmp_path / "ppo" / "summary.json").read_text())
    assert summary["energy_kwh"] is None and "pip install 'sparqrl[energy]'" in summary["energy_method"]
    host = core_only("train", "dqn", "--env", "gym:CartPole-v1", "--steps", "600", "--chunks", "2",
                     "--eval-episodes", "1", "--set", "learning_starts=100", "--out", str(tmp_path / "dqn"),
                     "--no-progress", "--no-energy")
    assert host.returncode == 0, host.stderr[-2000:]  # float actors run on JAX without ONNX Runtime
    assert json.loads((tmp_path / "dqn" / "summary.json").read_text())["steps"] == 600


@pytest.mark.parametrize("argv, extra", [
    (["train", "ppo", "--env", "brax:ant"], "brax"),
    (["train", "dqn", "--env", "gym:CartPole-v1", "--actor-precision", "int8"], "export"),
    (["train", "dqn", "--env", "gym:CartPole-v1", "--actors", "2"], "ray"),
    (["meta", "lpo"], "meta"),
])
def test_a_missing_extra_is_one_line_naming_its_install(tmp_path, argv, extra):
    out = tmp_path / "run"
    result = core_only(*argv, "--out", str(out))
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"pip install 'sparqrl[{extra}]'" in lines[0], result.stderr
    assert not out.exists()


def test_need_imports_or_names_the_extra(monkeypatch):
    assert extras.need("json", "x") is json  # (any importable module comes back)
    monkeypatch.setitem(sys.modules, "onnx", None)  # `import onnx` now fails as if not installed
    with pytest.raises(ConfigError, match=r"sparqrl export needs onnx, which is not installed: "
                                          r"pip install 'sparqrl\[export\]'"):
        extras.need("onnx", "sparqrl export")
    assert extras.available("numpy") and not extras.available("no_such_module_anywhere")
