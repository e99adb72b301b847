"""A run's own Ray instance listens on loopback only (issue 10): joining a cluster with `--ray-address` is
the one way a run listens beyond the machine."""

from __future__ import annotations

import ipaddress
import signal
import socket
import subprocess
import sys
import time

import psutil
from conftest import RAY_SERIAL


def _on_loopback(ip: str) -> bool:
    """127.0.0.0/8, ::1, or IPv4's loopback on an IPv6 socket (::ffff:127.0.0.1, how Ray's gRPC servers
    bind 127.0.0.1)."""
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _tree(pid: int) -> list[psutil.Process]:
    """The process and every live process below it (Ray's services are the driver's children, its agents
    and workers the raylet's)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _kind(proc: psutil.Process) -> str:
    """The process's name, "ray::Actor" for an actor worker whatever it is doing (its title is
    ray::Actor.collect while it collects)."""
    try:
        name = proc.name()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return "gone"
    return "ray::Actor" if name.startswith("ray::Actor") else name


def _listening(procs: list[psutil.Process]) -> dict[tuple[str, int, str], str]:
    """(ip, port, tcp|udp) -> process kind, for every TCP socket in LISTEN and every bound UDP socket
    (no remote end) of the processes."""
    found = {}
    for proc in procs:
        name = _kind(proc)
        try:
            for conn in proc.net_connections(kind="inet"):
                udp = conn.type == socket.SOCK_DGRAM
                if (udp and conn.laddr and not conn.raddr) or conn.status == psutil.CONN_LISTEN:
                    found[conn.laddr.ip, conn.laddr.port, "udp" if udp else "tcp"] = name
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


@RAY_SERIAL
def test_every_socket_a_run_s_own_ray_instance_listens_on_is_on_loopback(tmp_path):
    """A DQN run with two Ray actors (the CLI, in its own process, as users start runs): while its actors
    are sending fragments, every socket that the driver and every process below it (GCS, raylet, agents,
    monitors, actor workers) listens on is on loopback. The test must have seen those processes listen."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "sparqrl.cli", "train", "dqn", "--env", "gym:CartPole-v1", "--actors", "2",
           "--backend", "ray", "--steps", "200000", "--out", str(out), "--chunks", "500", "--eval-every", "0",
           "--eval-episodes", "1", "--checkpoint-every", "1000", "--no-progress", "--no-energy",
           "--set", "num_envs=2", "--set", "hidden=16,16", "--set", "batch_size=32", "--set", "learning_starts=100",
           "--fragment-steps", "5"]
    log = tmp_path / "stderr.txt"
    with open(log, "w") as stderr:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        metrics = out / "metrics.csv"
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None and not (
                metrics.exists() and metrics.read_text().count("\n") >= 3):
            time.sleep(0.2)
        assert proc.poll() is None, log.read_text()[-3000:]
        assert metrics.exists(), "the run did not log in 120 s"
        sockets, names = {}, set()
        for _ in range(6):  # the actors are running: sample a few times, Ray opens servers lazily
            procs = _tree(proc.pid)
            names |= {_kind(p) for p in procs}
            sockets.update(_listening(procs))
            time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the run checkpoints and ends every process it started
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    listeners = set(sockets.values())
    assert {"gcs_server", "raylet", "ray::Actor"} <= names, names  # not vacuous: Ray's processes were seen
    assert {"gcs_server", "raylet", "ray::Actor"} <= listeners, sockets  # ... and seen listening
    beyond = {key: name for key, name in sockets.items() if not _on_loopback(key[0])}
    assert not beyond, f"listening beyond loopback: {beyond}"


@RAY_SERIAL
def test_the_loopback_switch_is_only_on_while_the_local_instance_starts():
    """The Python API's `ray_session`: the local instance's node is 127.0.0.1, and Ray's local-only switch
    (an environment variable and Ray's constant) is back as it was once the instance has started, so the
    run's own later processes and a cluster joined later from this environment are not affected."""
    import os

    import ray
    import ray._private.ray_constants as ray_constants

    from sparqrl.runners.actors import ray_session

    before = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"), ray_constants.ENABLE_RAY_CLUSTER
    with ray_session(None, 1):
        assert [node["NodeManagerAddress"] for node in ray.nodes()] == ["127.0.0.1"]
        assert (os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"), ray_constants.ENABLE_RAY_CLUSTER) == before
    assert not ray.is_initialized()
