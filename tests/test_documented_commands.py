"""Every `sparqrl` command that README.md and docs/ show runs here, at a tiny budget, under a timeout (issue 30
item 9), so a documented command can neither crash nor hang unseen.

How commands are found and shrunk is in tests/doc_commands.py. A command that cannot run in CI is marked in the
docs with `not in CI: WHY`, either in its trailing shell comment

    sparqrl train td3 --env gym:Hopper-v5 --ray-address auto --out runs/i   # not in CI: needs a running cluster

or in an HTML comment on the line directly above its code block (every command of the block):

    <!-- not in CI: a synopsis (placeholders), not a command -->

and listed in NOT_IN_CI below with its reason. A command marked but not listed, listed but not marked, or
neither marked nor run fails `test_every_documented_command_runs_or_is_listed`.

Each chain of commands (one document's commands linked by the run folders they write and read) runs in a fresh
folder, in document order, as `sparqrl` subprocesses sharing one XDG_CACHE_HOME (the program cache helps within
this test and never touches the user's). A command passes when it exits 0 without a traceback within TIMEOUT_S.
Your own package (README's `my_package`) is tests/own_envs.py's environments, on PYTHONPATH as a user installs it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import doc_commands
from conftest import RAY_SERIAL

TIMEOUT_S = 300  # one command, compilation included, on a loaded 2-core machine
# XLA without its expensive optimization passes: compiles in about half the time; these commands must run, not
# run fast (sparqrl adds its CPU device count to these flags).
CHEAP_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

# A regular expression found in a command -> why it cannot run in CI. The docs mark the same commands.
NOT_IN_CI = {
    r"--ray-address auto": "needs a running Ray cluster",
    r"--workers \d": "starts Ray (tests/test_workers.py runs this path)",
    r"\b(ALGO|DIR|FILE)\b|\[": "a synopsis (placeholders), not a command",
    r"compare runs/ppo-cartpole": "reads runs on two environments that no command of its page trains "
                                  "(tests/test_compare_rliable.py runs this path)",
}

# A regular expression found in a step of a chain -> why that chain is marked slow (each 30-120 s on 2 cores).
SLOW = {
    r"--env brax:": "a Brax environment compiles for a minute",
    r"--env gym:(HalfCheetah|Hopper)": "MuJoCo stepped on the host, 1000-step episodes",
    r"^meta (lpo|hparams|mfos|act)\b": "a meta run compiles its population's inner trainings (value-loss stays fast: "
                                         "it covers the learned rules)",
}

MY_PACKAGE = {
    "__init__.py": '"""README\'s own package: registers MyEnv-v0 on import."""\nimport gymnasium as gym\n\n'
                   'gym.register(id="MyEnv-v0", entry_point="my_package.my_module:MyEnv", max_episode_steps=12)\n',
    "my_module.py": '"""README\'s own environments: tests/own_envs.py\'s corridor, as a gymnasium.Env and a gymnax '
                    'Environment."""\nfrom own_envs import GoRight as MyEnv, GymnaxChain as MyJaxEnv  # noqa: F401\n',
}


def listed(command: doc_commands.Command) -> list[str]:
    return [reason for pattern, reason in NOT_IN_CI.items() if re.search(pattern, command.text)]


def test_every_documented_command_runs_or_is_listed():
    """The docs' `not in CI` marks and NOT_IN_CI agree and every entry of NOT_IN_CI still matches a command. Every
    other command runs in a chain, or an equal one does (`doc_commands.plan`, which also refuses a command that
    reads a folder only a command not in CI writes)."""
    commands = doc_commands.all_commands()
    assert len(commands) > 40, "the extractor found too few commands: has the docs' layout changed?"
    errors = []
    for command in commands:
        reasons = listed(command)
        if command.not_in_ci and not reasons:
            errors.append(f"{command.where}: `{command.text}` is marked 'not in CI: {command.not_in_ci}' in the docs "
                          f"but not listed in NOT_IN_CI")
        if reasons and not command.not_in_ci:
            errors.append(f"{command.where}: `{command.text}` is listed in NOT_IN_CI ({reasons[0]}) but not marked "
                          f"in the docs: add `# not in CI: {reasons[0]}`")
    for pattern in NOT_IN_CI:
        if not any(re.search(pattern, command.text) for command in commands):
            errors.append(f"NOT_IN_CI entry {pattern!r} matches no documented command: remove it")
    assert not errors, "\n".join(errors)


def _chain_param(chain: list[doc_commands.Step]):
    marks = []
    if any(_uses_ray(step.argv) for step in chain):
        marks.append(RAY_SERIAL)
    if any(re.search(pattern, shlex.join(step.argv)) for pattern in SLOW for step in chain):
        marks.append(pytest.mark.slow)
    return pytest.param(chain, id=chain[0].command.where, marks=marks)


def _uses_ray(argv: tuple[str, ...]) -> bool:
    _, actors = doc_commands._drop(list(argv), "--actors")
    _, backend = doc_commands._drop(list(argv), "--backend")
    return (actors is not None and int(actors) > 1 and backend != "inline") or backend == "ray"


CHAINS = doc_commands.plan(doc_commands.all_commands())


@pytest.fixture(scope="session")
def cache_home(tmp_path_factory) -> Path:
    """One XDG_CACHE_HOME for this test's commands in every xdist worker of the session (their temporary
    folders share a parent)."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "documented-commands-cache"


def sparqrl_executable() -> str:
    beside = Path(sys.executable).with_name("sparqrl")
    found = str(beside) if beside.exists() else shutil.which("sparqrl")
    assert found, "no sparqrl executable beside the interpreter or on PATH"
    return found


def run_step(step: doc_commands.Step, cwd: Path, env: dict[str, str]) -> None:
    """Run one step; fail naming the documented command if it hangs, fails or prints a traceback."""
    shown = f"{step.command.where}: `{step.command.text}` (ran as `sparqrl {shlex.join(step.argv)}`)"
    process = subprocess.Popen([sparqrl_executable(), *step.argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the command and anything it started (Ray workers, actors)
        process.communicate()
        pytest.fail(f"{shown} hung: no exit within {TIMEOUT_S} s")
    tail = "\n".join(err.strip().splitlines()[-15:])
    assert process.returncode == 0 and "Traceback" not in err, f"{shown} exited {process.returncode}:\n{tail}"


@pytest.mark.parametrize("chain", [_chain_param(chain) for chain in CHAINS])
def test_documented_commands_run(chain, tmp_path, cache_home):
    packages = tmp_path / "site"
    (packages / "my_package").mkdir(parents=True)
    for name, text in MY_PACKAGE.items():
        (packages / "my_package" / name).write_text(text)
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home), "XLA_FLAGS": CHEAP_COMPILE,
           "PYTHONPATH": os.pathsep.join([str(packages), str(Path(__file__).parent)])}
    work = tmp_path / "work"
    work.mkdir()
    for step in chain:
        run_step(step, work, env)


PAGE = """\
Prose with `sparqrl train ppo` inline: not a command.

```bash
bash setup.sh && .venv/bin/sparqrl train ppo --steps 500000 --seeds 8 --out runs/a   # the quick start
sparqrl train dqn --env CartPole-v1 \\
    --set lr=5e-4 --out runs/b
sparqrl eval runs/a --episodes 20 | tail -1
sparqrl train td3 --ray-address auto --out runs/c   # on a cluster; not in CI: needs one running
```

<!-- --8<-- [start:x] -->
<!-- not in CI: a synopsis -->
```bash
sparqrl eval DIR [--episodes N]
```

```python
agent = sparqrl.load("runs/a")  # sparqrl train is not called here
```

```bash
sparqrl train ppo --steps 100 --seeds 4 --out runs/d   # the same program as runs/a: left out
sparqrl train ppo --seeds 2 --out runs/e
sparqrl eval runs/e
```
"""


def test_extractor_finds_commands_marks_and_chains(tmp_path):
    """Continuations, `&&` and pipes, a path to sparqrl, both marks; runs/d duplicates runs/a and is left out, while
    runs/e, the same program at another seed count, runs with the eval that reads it."""
    page = tmp_path / "page.md"
    page.write_text(PAGE)
    found = doc_commands.commands(page)
    assert [(c.line, c.argv[:2], c.not_in_ci) for c in found] == [
        (4, ("train", "ppo"), None), (5, ("train", "dqn"), None), (7, ("eval", "runs/a"), None),
        (8, ("train", "td3"), "needs one running"), (14, ("eval", "DIR"), "a synopsis"),
        (22, ("train", "ppo"), None), (23, ("train", "ppo"), None), (24, ("eval", "runs/e"), None)]
    assert found[1].argv == ("train", "dqn", "--env", "CartPole-v1", "--set", "lr=5e-4", "--out", "runs/b")
    chains = [[step.command.line for step in chain] for chain in doc_commands.plan(found)]
    assert chains == [[4, 7], [5], [23, 24]]
    first = doc_commands.plan(found)[0][0].argv
    assert first[first.index("--steps") + 1] == "2048" and first[first.index("--seeds") + 1] == "4"
