"""What the run's telemetry costs around training (issue 33): codecarbon's start without py-cpuinfo's second
interpreter (the same CPU name, so the same power model), and TensorBoard's event records framed without
importing `tensorboard.summary` (the same bytes as its own RecordWriter)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sparqrl.telemetry import EnergyMeter
from sparqrl.telemetry.energy import BRAND_FIELDS, cpu_brand
from sparqrl.telemetry.logger import TensorBoardWriter, masked_crc32c, tf_record

CPUINFO_TEXTS = [
    "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC 7B13\n",
    "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n",
    "processor\t: 0\ncpu\t\t: POWER9 (raw), altivec supported\nclock\t\t: 2300.000000MHz\n",
    "model name\t:\nuarch\t\t: sifive,u74-mc\n",
    "",
]


@pytest.mark.parametrize("text", CPUINFO_TEXTS)
def test_the_cpu_name_is_read_from_proc_cpuinfo_as_py_cpuinfo_reads_it(text):
    cpuinfo = pytest.importorskip("cpuinfo")
    assert cpu_brand(text) == cpuinfo.cpuinfo._get_field(True, text, None, None, *BRAND_FIELDS)


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="Linux's /proc/cpuinfo")
def test_this_machine_s_cpu_name_is_py_cpuinfo_s():
    cpuinfo = pytest.importorskip("cpuinfo")
    assert cpu_brand(Path("/proc/cpuinfo").read_text()) == cpuinfo.get_cpu_info().get("brand_raw")


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="Linux's /proc/cpuinfo")
def test_the_meter_starts_without_asking_py_cpuinfo(tmp_path, monkeypatch):
    """codecarbon's CPU name comes from /proc/cpuinfo: py-cpuinfo's `get_cpu_info` (a second Python interpreter,
    1.1 s of CPU) is not called, and the meter measures as before."""
    cpuinfo = pytest.importorskip("cpuinfo")
    util = pytest.importorskip("codecarbon.core.util")
    brand = cpu_brand(Path("/proc/cpuinfo").read_text())
    if brand is None:
        pytest.skip("/proc/cpuinfo names no CPU here")
    util.detect_cpu_model.cache_clear()  # (an earlier test's tracker may have asked already)
    asked = []
    monkeypatch.setattr(cpuinfo, "get_cpu_info", lambda: asked.append(1) or {})
    meter = EnergyMeter(tmp_path, "USA").start()
    summary = meter.stop()
    assert asked == [] and util.detect_cpu_model() == brand
    assert summary["energy_kwh"] is not None and not summary["energy_method"].startswith("not measured")


def test_event_records_are_framed_as_tensorboard_frames_them():
    """The masked CRC-32C and the record layout equal the tensorboard package's own (RecordWriter)."""
    import io

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as theirs
    from tensorboard.summary.writer.record_writer import RecordWriter

    assert masked_crc32c(b"") == theirs(b"")
    for size in (1, 7, 8, 9, 100, 4096):
        data = os.urandom(size)
        assert masked_crc32c(data) == theirs(data)
        buffer = io.BytesIO()
        RecordWriter(buffer).write(data)
        assert tf_record(data) == buffer.getvalue()


def test_the_tensorboard_writer_does_not_import_tensorboard_summary(tmp_path):
    """Checked in a fresh interpreter: `tensorboard.summary` (0.19 s of CPU to import at the first chunk) is not
    imported by writing events."""
    import subprocess

    code = ("import sys; from pathlib import Path; from sparqrl.telemetry.logger import TensorBoardWriter; "
            f"w = TensorBoardWriter(Path({str(tmp_path / 'tb')!r})); w.scalars(3, {{'train/x': 1.5}}); w.close(); "
            "print(sorted(m for m in sys.modules if m.startswith('tensorboard.summary')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("train/x")] == [(3, 1.5)]


def test_a_resumed_writer_s_file_starts_a_session_at_its_purge_step(tmp_path):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    writer = TensorBoardWriter(tmp_path, purge_step=5)
    writer.scalars(5, {"train/x": 2.0})
    writer.close()
    (path,) = tmp_path.iterdir()
    events = list(EventFileLoader(str(path)).Load())
    assert [e.WhichOneof("what") for e in events] == ["file_version", "session_log", "summary"]
    assert [e.step for e in events] == [5, 5, 5]
