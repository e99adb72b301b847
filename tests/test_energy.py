"""Energy and CO2 per run (codecarbon's offline tracker): the meter, its failure modes, and the runner."""

import csv
import json
import math
import socket
import sys
import threading
import time

import pytest

from sparqrl.algos import ppo
from sparqrl.config import ConfigError
from sparqrl.runners import RunConfig, RunInterrupted, resume, train
from sparqrl.telemetry import ENERGY_META_KEYS, EnergyMeter, carbon_intensity, known_countries, validate_country


def busy(seconds: float) -> int:
    end, x = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        x += 1
    return x


def timers() -> list[threading.Thread]:
    """codecarbon's sampling threads (threading.Timer) still alive a moment after a stop (a cancelled
    timer's thread takes a moment to end)."""
    alive = [t for t in threading.enumerate() if isinstance(t, threading.Timer)]
    for t in alive:
        t.join(timeout=2.0)
    return [t for t in alive if t.is_alive()]


def rows(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture
def no_network(monkeypatch):
    """Any connection attempt is recorded and refused."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("network access in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return attempts


def test_meter_measures_a_busy_loop_offline(tmp_path, no_network):
    meter = EnergyMeter(tmp_path, "USA").start()
    assert meter.measuring, meter.method
    busy(0.5)
    running = meter.totals()
    assert set(running) == set(ENERGY_META_KEYS)
    assert running["energy_kwh"] > 0 and running["energy_sessions"] == running["energy_sessions_measured"] == 1
    json.dumps(running)  # goes into checkpoint meta as JSON
    result = meter.stop()
    assert no_network == []
    assert not timers()
    for key in ("energy_kwh", "co2_kg"):
        assert math.isfinite(result[key]) and result[key] > 0
    assert result["energy_kwh"] >= running["energy_kwh"]
    assert result["energy_country"] == "USA"
    assert result["co2_intensity_g_per_kwh"] == carbon_intensity("USA") > 0
    # CO2 is the energy times the country's grid intensity (g/kWh in codecarbon's offline data)
    assert result["co2_kg"] == pytest.approx(result["energy_kwh"] * carbon_intensity("USA") / 1000, rel=1e-9)
    assert result["energy_method"].startswith("cpu: ") and "not measured" not in result["energy_method"]
    written = rows(tmp_path / "emissions.csv")  # codecarbon's row for the session
    assert len(written) == 1 and written[0]["country_iso_code"] == "USA"
    assert float(written[0]["energy_consumed"]) == pytest.approx(result["energy_kwh"])
    assert meter.stop() == result  # idempotent


def test_co2_scales_with_the_country(tmp_path):
    ratios = {}
    for country in ("USA", "FRA"):
        with EnergyMeter(tmp_path, country) as meter:
            busy(0.2)
        result = meter.stop()
        ratios[country] = result["co2_kg"] / result["energy_kwh"] * 1000  # g/kWh
        assert ratios[country] == pytest.approx(carbon_intensity(country), rel=1e-9)
    assert ratios["USA"] > 2 * ratios["FRA"]  # coal and gas vs nuclear
    assert len(rows(tmp_path / "emissions.csv")) == 2  # the second session appended, nothing clobbered


def test_countries_come_from_codecarbon_data():
    countries = known_countries()
    assert len(countries) > 150 and countries["USA"] == "United States" and countries["FRA"] == "France"
    validate_country("DEU")
    with pytest.raises(ConfigError, match=r"country='usa'.*did you mean USA"):
        validate_country("usa")
    with pytest.raises(ConfigError, match=r"country='Germany'.*did you mean DEU"):
        validate_country("Germany")
    with pytest.raises(ConfigError, match=r"country='XYZ'.*3-letter .*ISO country code"):
        EnergyMeter(".", "XYZ")


def test_disabled_meter_measures_and_writes_nothing(tmp_path):
    meter = EnergyMeter(tmp_path, "USA", enabled=False).start()
    result = meter.stop()
    assert result["energy_kwh"] is None and result["co2_kg"] is None
    assert result["energy_method"].startswith("not measured: disabled")
    assert not (tmp_path / "emissions.csv").exists()
    assert meter.totals()["energy_sessions_measured"] == 0


def test_a_failing_codecarbon_never_stops_the_run(tmp_path, monkeypatch):
    # codecarbon catches its own exceptions in start(); the meter finds out and says why
    from codecarbon.core import resource_tracker

    def broken(self):
        raise RuntimeError("no hardware to read")

    monkeypatch.setattr(resource_tracker.ResourceTracker, "set_CPU_GPU_ram_tracking", broken)
    meter = EnergyMeter(tmp_path, "USA").start()
    assert not meter.measuring
    result = meter.stop()
    assert result["energy_kwh"] is None and result["co2_kg"] is None
    assert result["energy_method"].startswith("not measured: codecarbon failed to start")
    assert "no hardware to read" in result["energy_method"]
    assert not timers()
    monkeypatch.undo()

    # codecarbon missing altogether (no `energy` extra): not measured, and the summary says how to add it
    monkeypatch.setitem(sys.modules, "codecarbon", None)
    result = EnergyMeter(tmp_path, "USA").start().stop()
    assert result["energy_kwh"] is None
    assert result["energy_method"] == "not measured: codecarbon is not installed (pip install 'sparqrl[energy]')"


def test_a_failing_stop_keeps_the_last_reading(tmp_path):
    meter = EnergyMeter(tmp_path, "USA").start()
    busy(0.1)
    reading = meter.totals()["energy_kwh"]

    def broken():
        raise OSError("disk full")

    meter._tracker.stop = broken  # a failure codecarbon itself would not catch
    result = meter.stop()
    assert result["energy_kwh"] == reading > 0
    assert "failed to stop (OSError: disk full)" in result["energy_method"]
    assert meter.stop() == result
    assert not timers()  # its sampling was cancelled all the same


def test_exceptions_stop_the_meter(tmp_path):
    with pytest.raises(ZeroDivisionError):
        with EnergyMeter(tmp_path, "USA") as meter:
            1 / 0
    assert not meter.measuring and not timers()
    assert meter.stop()["energy_kwh"] > 0


def test_earlier_sessions_are_added(tmp_path):
    prior = {"energy_kwh": 2.0, "co2_kg": 1.0, "energy_sessions": 1, "energy_sessions_measured": 1, "other": 3}
    with EnergyMeter(tmp_path, "USA", prior=prior) as meter:
        busy(0.05)
    result = meter.stop()
    session = float(rows(tmp_path / "emissions.csv")[-1]["energy_consumed"])
    assert result["energy_kwh"] == pytest.approx(2.0 + session)
    assert meter.totals()["energy_sessions"] == 2
    # a checkpoint from before energy tracking (no keys): one earlier session, not measured
    old = EnergyMeter(tmp_path, "USA", enabled=False, prior={"wall_time_s": 5.0}).totals()
    assert old["energy_kwh"] == 0.0 and old["energy_sessions"] == 2 and old["energy_sessions_measured"] == 0
    # an unmeasured earlier session makes the totals partial, and the summary says so
    partial = EnergyMeter(tmp_path, "USA", prior={**prior, "energy_sessions": 2}).start().stop()
    assert "partial: 2 of 3 sessions" in partial["energy_method"]


def test_bad_country_fails_before_anything_is_written(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"country='ZZZ'"):
        train("ppo", ppo.Config(total_timesteps=512), RunConfig(out=str(out), country="ZZZ", progress=False))
    assert not out.exists()


def test_run_summary_has_the_energy_of_all_its_sessions(tmp_path):
    out = tmp_path / "run"
    run = RunConfig(out=str(out), seeds=1, chunks=4, checkpoint_every=1, eval_every=0, eval_episodes=2,
                    progress=False, country="FRA")

    def interrupt(done, metrics):
        if done == 2:
            raise KeyboardInterrupt

    with pytest.raises(RunInterrupted):
        train("ppo", ppo.Config(total_timesteps=4 * 512), run, on_chunk=interrupt)
    assert not timers()  # the interrupted session's meter was stopped
    first = rows(out / "emissions.csv")
    assert len(first) == 1
    from sparqrl.runners.checkpoint import Checkpointer

    checkpointer = Checkpointer(out / "checkpoint")
    try:  # the meta of the checkpoint the run resumes from (the state itself is not needed here)
        meta = checkpointer._manager.restore(checkpointer.steps()[0], args=_meta_only())["meta"]
    finally:
        checkpointer.close()
    assert 0 < meta["energy_kwh"] <= float(first[0]["energy_consumed"]) and meta["energy_sessions"] == 1

    summary = resume(out)
    saved = json.loads((out / "summary.json").read_text())
    assert saved == json.loads(json.dumps(summary))
    both = rows(out / "emissions.csv")
    assert len(both) == 2 and both[0] == first[0]  # appended, the first session's row kept
    assert saved["energy_kwh"] == pytest.approx(meta["energy_kwh"] + float(both[1]["energy_consumed"]))
    assert saved["energy_kwh"] >= meta["energy_kwh"] and saved["co2_kg"] > 0
    assert saved["co2_kg"] == pytest.approx(saved["energy_kwh"] * carbon_intensity("FRA") / 1000, rel=1e-6)
    assert saved["energy_country"] == "FRA" and "not measured" not in saved["energy_method"]
    assert "partial" not in saved["energy_method"]


def _meta_only():
    import orbax.checkpoint as ocp

    return ocp.args.Composite(meta=ocp.args.JsonRestore())
