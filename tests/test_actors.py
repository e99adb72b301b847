"""Actors and their pools (inline and Ray): fragments, versions, replacement of dead actors, shutdown."""

from __future__ import annotations

import json
import os
import signal
import time

import jax
import numpy as np
import pytest
from conftest import RAY_SERIAL, alive

from sparqrl.algos import td3
from sparqrl.envs import host_spec
from sparqrl.runners.actors import ActorSpec, InlinePool, RayPool, network_paths, quantized_copy, ray_session

ENV = "gym:Pendulum-v1"
SMALL = dict(total_timesteps=600, learning_starts=20, batch_size=32, hidden=(32, 32), num_envs=2)


def make_spec(actors: int, seeds: int = 1, fragment_steps: int = 3) -> ActorSpec:
    config = td3.Config(**SMALL).validate(host_spec(ENV))
    return ActorSpec("td3", config, ENV, seeds, actors, fragment_steps, seed=0)


def copies(spec: ActorSpec, precision: str = "int8"):
    """version -> PolicyCopy of freshly initialised learners (one per version, different weights)."""
    al = td3.make_actor_learner(spec.config, host_spec(ENV))
    init = jax.jit(jax.vmap(al.init))

    def copy(version: int):
        learner = init(jax.random.split(jax.random.PRNGKey(version), spec.seeds))
        policy = jax.device_get(jax.vmap(al.policy)(learner))
        paths = network_paths(al.acting, policy, host_spec(ENV).observation_shape)
        return quantized_copy(version, policy, al.acting, paths, precision, "channel", env_steps=100 * version)

    return copy


def test_inline_fragments_have_the_promised_shapes_and_versions():
    spec = make_spec(actors=2, seeds=2, fragment_steps=3)
    pool, copy = InlinePool(spec), copies(spec)
    try:
        for version in range(3):
            c = pool.publish(copy(version))
            pool.submit(0, c)
            pool.submit(1, c)
            for actor_id in (0, 1):
                frag = pool.next()
                assert (frag.actor_id, frag.version, frag.incarnation) == (actor_id, version, 0)
                assert frag.steps.obs.shape == (3, 2, 2, 3) and frag.steps.action.shape == (3, 2, 2, 1)
                assert frag.steps.extra.shape == (3, 2, 2, 1) and frag.steps.priority.shape == (3, 2, 2)
                assert frag.episode_done.shape == (3, 2, 2) and frag.busy_s > 0
                assert np.all(np.abs(frag.steps.action) <= 1.0)
    finally:
        pool.close()


def test_inline_actor_that_raises_is_replaced_and_the_run_goes_on():
    spec = make_spec(actors=2)
    pool, copy = InlinePool(spec), copies(spec)
    try:
        c = copy(0)
        broken = pool.actors[0]

        def crash(actions):
            raise RuntimeError("simulator crashed")

        broken.envs.step = crash
        pool.submit(0, c)
        with pytest.warns(UserWarning, match="actor 0 .*replaced"):
            frag = pool.next()
        assert (frag.actor_id, frag.incarnation) == (0, 1) and pool.restarts == 1
        assert pool.failures[0].error == "RuntimeError('simulator crashed')"
    finally:
        pool.close()


@RAY_SERIAL
def test_ray_killed_actor_is_replaced_versions_are_monotone_and_every_process_ends():
    """SIGKILL one actor process mid-run: the pool starts a new one in its place, loses at most the
    fragments that actor had not finished (those it finished are still delivered), and every actor's
    fragments carry non-decreasing versions. Leaving the run's Ray session ends every process it started."""
    spec = make_spec(actors=2, fragment_steps=2)
    with ray_session(None, spec.actors):
        pids = _check_replacement_and_versions(RayPool(spec), copies(spec))
    deadline = time.time() + 30  # leaving the session ended the local instance: every process it started
    while time.time() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.2)
    assert not [pid for pid in pids if alive(pid)]


def _check_replacement_and_versions(pool: RayPool, copy) -> list[int]:
    try:
        in_flight, seen = 2, {}
        ref = pool.publish(copy(0))
        for actor_id in (0, 1):
            for _ in range(in_flight):
                pool.submit(actor_id, ref)
        victim = pool.pids()[0]
        version, deadline = 0, time.time() + 180  # a replacement starts a process, imports JAX, compiles
        while (0, 1) not in seen or len(seen[0, 1]) < 3:  # until the replacement has delivered data
            version += 1
            assert time.time() < deadline, ({k: v[-5:] for k, v in seen.items()}, pool.failures, len(pool.pending))
            if version == 4:
                os.kill(victim, signal.SIGKILL)
            frag = pool.next()
            seen.setdefault((frag.actor_id, frag.incarnation), []).append((frag.sequence, frag.version))
            ref = pool.publish(copy(version))  # a new version after every update, put once
            pool.submit(frag.actor_id, ref)
        while pool.pending:  # drain: fragments may arrive in any order, none of those made may be lost
            frag = pool.next()
            seen[frag.actor_id, frag.incarnation].append((frag.sequence, frag.version))
        assert pool.restarts == 1 and pool.failures[0].actor_id == 0
        for made in seen.values():  # in the order each actor made its fragments
            versions = [version for _, version in sorted(made)]
            assert versions == sorted(versions), made
            assert [sequence for sequence, _ in sorted(made)] == list(range(len(made)))  # none lost but the victim's
        pids = pool.pids()
        assert victim not in pids
    finally:
        pool.close()
    return pids


@RAY_SERIAL
def test_a_run_joins_an_existing_cluster_and_leaves_it_running(tmp_path):
    """`--ray-address`: a run (the CLI, in its own process, as users join clusters) connects to a cluster
    it did not start, runs its actors there, and on exit ends only its own actors: the cluster stays up."""
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    bin_dir = os.path.dirname(sys.executable)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    head = subprocess.Popen([os.path.join(bin_dir, "ray"), "start", "--head", "--block", f"--port={port}",
                             "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        out = tmp_path / "run"
        cmd = [os.path.join(bin_dir, "sparqrl"), "train", "td3", "--env", ENV, "--steps", "600", "--out", str(out),
               "--set", "learning_starts=20", "--set", "batch_size=32", "--set", "hidden=32,32", "--set",
               "num_envs=2", "--chunks", "2", "--eval-episodes", "1", "--no-progress", "--no-energy",
               "--actors", "1", "--backend", "ray", "--ray-address", f"127.0.0.1:{port}", "--actor-precision", "int8"]
        deadline = time.time() + 180
        while True:  # the head takes a few seconds to come up; until then the run cannot connect
            done = subprocess.run(cmd + ["--overwrite"], capture_output=True, text=True, env=env)
            if done.returncode == 0 or time.time() > deadline or head.poll() is not None:
                break
            time.sleep(2.0)
        assert done.returncode == 0, done.stderr[-3000:]
        summary = json.loads((out / "summary.json").read_text())
        assert summary["backend"] == "ray" and summary["actor_restarts"] == 0 and summary["steps"] == 600
        assert head.poll() is None  # the cluster we joined is still running
    finally:
        head.terminate()
        head.wait(timeout=60)


@RAY_SERIAL
def test_joining_a_cluster_after_a_local_instance_in_the_same_process_is_a_clear_error():
    """Ray 2.60 cannot create actors on a cluster joined after a local instance ran in the same process
    (each dies before it starts): say so up front instead of failing actor after actor."""
    with ray_session(None, 1):
        pass
    with pytest.raises(RuntimeError, match="ray_address='127.0.0.1:1'.*new process"):
        with ray_session("127.0.0.1:1", 1):
            pass


def test_an_actor_place_that_keeps_failing_stops_the_run_with_the_reason(monkeypatch):
    """Replacement is for bad luck: a place whose every new actor fails too ends the run, saying why."""
    import sparqrl.runners.actors as actors_module

    class Broken(actors_module.Actor):
        def collect(self, copy):
            raise RuntimeError("no simulator license")

    monkeypatch.setattr(actors_module, "Actor", Broken)
    spec = make_spec(actors=1)
    pool = InlinePool(spec)
    try:
        pool.submit(0, copies(spec)(0))
        with pytest.warns(UserWarning), pytest.raises(RuntimeError, match="failed 6 times in a row.*no simulator"):
            pool.next()
        assert pool.restarts == 5
    finally:
        pool.close()
