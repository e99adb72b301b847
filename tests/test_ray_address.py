"""`--ray-address` that reaches nothing is one line, exit 2, within seconds, before any run folder is written
(issue 34, item 5). No Ray cluster is started: the checks connect to a port or find none."""

import socket
import time

import pytest

from conftest import run_cli
from sparqrl.config import ConfigError

services = pytest.importorskip("ray._private.services")

from sparqrl.runners.actors import check_ray_address  # noqa: E402  (after the ray extra's check)


def train_with(capsys, tmp_path, address):
    """`sparqrl train dqn --env gym:CartPole-v1 --backend ray --ray-address ADDRESS`: (exit code, stderr, seconds)."""
    start = time.perf_counter()
    code, _, err = run_cli(capsys, "train", "dqn", "--env", "gym:CartPole-v1", "--backend", "ray", "--ray-address",
                           address, "--steps", "1000", "--out", str(tmp_path / "run"))
    return code, err, time.perf_counter() - start


def one_line(code, err):
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("sparqrl: error: ray_address="), err
    return lines[0]


def test_auto_with_no_cluster_running(capsys, tmp_path, monkeypatch):
    # Ray's own view of this machine, made empty: other tests' local instances may be running beside this one
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: frozenset())
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: None)
    code, err, seconds = train_with(capsys, tmp_path, "auto")
    assert "no Ray cluster is running" in one_line(code, err) and "ray start --head" in err
    assert not (tmp_path / "run").exists() and seconds < 30, seconds  # (parsing included, on a shared machine)


def test_an_address_where_nothing_listens(capsys, tmp_path):
    code, err, seconds = train_with(capsys, tmp_path, "127.0.0.1:1")
    assert "nothing answers at" in one_line(code, err) and ":1 within 5 s" in err
    assert not (tmp_path / "run").exists() and seconds < 30, seconds  # (ray.init waited over 2 minutes)


def test_a_grpc_server_passes_and_a_port_that_speaks_no_grpc_is_refused_in_seconds(capsys, tmp_path):
    """A gRPC server (as a Ray GCS is) passes; a socket that accepts and says nothing is no Ray cluster: refused
    within the bound, through the command, before the run folder is written."""
    from concurrent import futures

    import grpc

    host = services.resolve_ip_for_localhost("127.0.0.1")  # where Ray connects for 127.0.0.1
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port(f"{host}:0")
    server.start()
    try:
        check_ray_address(f"127.0.0.1:{port}", timeout_s=5)
    finally:
        server.stop(None)
    with socket.socket() as silent:
        silent.bind((host, 0))
        silent.listen(8)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        code, err, seconds = train_with(capsys, tmp_path, address)
        assert "answers but not as gRPC within 5 s" in one_line(code, err)
        assert not (tmp_path / "run").exists() and seconds < 30, seconds


def test_the_connect_is_bounded():
    host = services.resolve_ip_for_localhost("127.0.0.1")  # where Ray connects for 127.0.0.1
    with socket.socket() as server:
        server.bind((host, 0))
        server.listen(0)
        address = f"127.0.0.1:{server.getsockname()[1]}"
        socket.create_connection(server.getsockname(), timeout=2).close()
        server.accept()[0].close()  # (that connection leaves the backlog)
        # one unaccepted connection fills the backlog of 0: a further connect is never answered
        with socket.create_connection(server.getsockname(), timeout=2):
            start = time.perf_counter()
            with pytest.raises(ConfigError, match="within 0.5 s"):
                check_ray_address(address, timeout_s=0.5)
            assert time.perf_counter() - start < 5
    with pytest.raises(ConfigError, match="HOST:PORT"):
        check_ray_address("nonsense")


def test_a_port_that_answers_but_is_no_cluster_is_one_line_too(monkeypatch):
    """What `check_ray_address` lets through (a port that speaks gRPC) and ray.init then refuses: no traceback."""
    import ray

    import sparqrl.runners.actors as actors

    def refuse(**_):
        raise ConnectionError("Failed to connect to Ray cluster at 192.0.2.2:5")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(actors, "_local_instance_ran", False)
    with pytest.raises(ConfigError, match="ray_address='127.0.0.1:5': Failed to connect .*not a Ray cluster's GCS"):
        with actors.ray_session("127.0.0.1:5", 1):
            pass
