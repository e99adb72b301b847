"""Energy (kWh) and CO2 (kg CO2eq) of a run session, with codecarbon's offline tracker.

One `EnergyMeter` measures one session of a run (a fresh run, or one `--resume`): codecarbon 3.x
accumulates from a tracker's first start, so every session gets a new `OfflineEmissionsTracker`.
The earlier sessions' totals travel in the checkpoint's meta dict (`totals()`, `ENERGY_META_KEYS`)
so that the final summary covers the whole run.

Method (codecarbon): energy = CPU + GPU + RAM energy, where the CPU is read from RAPL counters where
the kernel exposes them (else estimated from CPU load x TDP), NVIDIA GPUs from NVML, and RAM
estimated from its size; CO2 = energy x the grid carbon intensity of `country` (3-letter ISO code,
from codecarbon's packaged `global_energy_mix.json`). The summary says which of these applied
(`energy_method`). Nothing here ever touches the network: the tracker is offline, writes only
`emissions.csv` (one row per session, appended) and has every online option pinned off, whatever
`~/.codecarbon.config` or `CODECARBON_*` variables say.

Measuring must never cost a run: if codecarbon cannot be imported or fails to start, the run goes on
and the summary says energy was not measured, and why. codecarbon's own log is kept quiet (its
errors only).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import math
import threading
import warnings
from collections import deque
from pathlib import Path
from typing import Any, Mapping

from sparqrl import config as cfg

EMISSIONS_FILE = "emissions.csv"
"""What codecarbon writes into the run directory: one row per session (appended, never replaced)."""

MEASURE_POWER_SECS = 15.0
"""codecarbon's sampling interval (its default); a reading (`totals`, `stop`) also samples at once."""

ENERGY_META_KEYS = ("energy_kwh", "co2_kg", "energy_sessions", "energy_sessions_measured")
"""Running totals a runner saves in its checkpoint meta (from `EnergyMeter.totals()`) and hands back
to the next session's meter (`EnergyMeter(..., prior=meta)`)."""

_LOGGER = "codecarbon"


# ---------------------------------------------------------------------------------------------
# Countries, from codecarbon's packaged data (read as a file: no codecarbon import, no network)


@functools.cache
def _energy_mix() -> dict[str, dict[str, Any]]:
    spec = importlib.util.find_spec("codecarbon")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "private_infra" / "global_energy_mix.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def known_countries() -> dict[str, str]:
    """3-letter ISO code -> country name, for every country codecarbon has offline grid data for."""
    return {code: row.get("country_name", code) for code, row in sorted(_energy_mix().items())}


def carbon_intensity(country: str) -> float | None:
    """Grid carbon intensity of `country` in g CO2eq/kWh, as codecarbon's offline data gives it."""
    value = _energy_mix().get(country, {}).get("carbon_intensity")
    return None if value is None else float(value)


NOT_INSTALLED = "not measured: codecarbon is not installed (pip install 'sparqrl[energy]')"
"""energy_method of a run without the `energy` extra: energy is on by default, so its absence is not an error."""


def installed() -> bool:
    from sparqrl.extras import available

    return available("codecarbon")


def validate_country(country: str, field: str = "country") -> None:
    """ConfigError naming `field`, the value and what is allowed unless codecarbon knows `country` (not
    checked without codecarbon, which alone uses it)."""
    countries = known_countries()
    if country in countries or not installed():
        return
    if not countries:
        cfg.fail(field, country, "cannot be checked: codecarbon's country data (global_energy_mix.json) was not found")
    by_name = {name.lower(): code for code, name in countries.items()}
    hint = ""
    if str(country).upper() in countries:
        hint = f"; did you mean {str(country).upper()}?"
    elif str(country).lower() in by_name:
        hint = f"; did you mean {by_name[str(country).lower()]} ({countries[by_name[str(country).lower()]]})?"
    else:
        hint = cfg.close_matches(str(country), countries)
    cfg.fail(
        field, country,
        f"must be a 3-letter upper-case ISO country code with grid data in codecarbon "
        f"({len(countries)} known, e.g. USA, CAN, FRA, DEU, GBR, CHN, IND, JPN){hint}",
    )


# ---------------------------------------------------------------------------------------------
# The CPU's name, as py-cpuinfo would give it to codecarbon, without its second interpreter

BRAND_FIELDS = ("model name", "cpu", "processor", "uarch")
"""The /proc/cpuinfo fields py-cpuinfo 9 reads the CPU's name from (`brand_raw`), in its order of preference."""


def cpu_brand(text: str) -> str | None:
    """The CPU's name in /proc/cpuinfo's `text` as py-cpuinfo 9 reads it on Linux (its first source there): the
    value of the first line whose field is one of `BRAND_FIELDS`, not empty and not a number; None without one."""
    for line in text.splitlines():
        if ":" in line:
            field, value = (part.strip() for part in line.split(":", 1))
            if field.lower() in BRAND_FIELDS and value and not value.isdigit():
                return value
    return None


def _known_cpu_model() -> None:
    """Give codecarbon's `detect_cpu_model` (cached for the process) the CPU's name from /proc/cpuinfo, where it
    names one: codecarbon asks py-cpuinfo, which runs a second Python interpreter to find it (1.1 s of CPU on the
    2-core machine, beside the run's training: issue 33). The same name, so the same power model and figures;
    elsewhere (no /proc/cpuinfo, no name in it) py-cpuinfo is asked as before."""
    try:
        brand = cpu_brand(Path("/proc/cpuinfo").read_text())
        import cpuinfo
        from codecarbon.core.util import detect_cpu_model
    except (OSError, ImportError):
        return
    if brand is None or detect_cpu_model.cache_info().currsize:
        return
    asked = cpuinfo.get_cpu_info
    cpuinfo.get_cpu_info = lambda: {"brand_raw": brand}  # for this one call, which codecarbon caches
    try:
        detect_cpu_model()
    finally:
        cpuinfo.get_cpu_info = asked


# ---------------------------------------------------------------------------------------------
# codecarbon's log: quiet, but remembered (the reason of a failure is only in its log)


class _QuietLog(logging.Filter):
    """On the `codecarbon` logger during a session: lets only errors through to its handlers and keeps
    the last records, so that a failure swallowed by codecarbon (its start/stop catch every exception
    and log it as a warning) can be reported with its cause."""

    def __init__(self) -> None:
        super().__init__()
        self.records: deque[logging.LogRecord] = deque(maxlen=50)

    def filter(self, record: logging.LogRecord) -> bool:
        self.records.append(record)
        return record.levelno >= logging.ERROR

    def reason(self) -> str:
        """The last exception codecarbon logged, else its last warning or error, else ''."""
        for record in reversed(self.records):
            if record.exc_info and record.exc_info[1] is not None:
                return f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
        for record in reversed(self.records):
            if record.levelno >= logging.WARNING:
                return record.getMessage()
        return ""


def _attach(quiet: _QuietLog) -> None:
    logger = logging.getLogger(_LOGGER)
    logger.addFilter(quiet)
    # warnings must reach the filter (which drops them) to be remembered; the tracker sets this
    # same level from its log_level argument
    logger.setLevel(logging.WARNING)


def _detach(quiet: _QuietLog) -> None:
    logger = logging.getLogger(_LOGGER)
    logger.removeFilter(quiet)
    if not any(isinstance(f, _QuietLog) for f in logger.filters):
        logger.setLevel(logging.ERROR)


# ---------------------------------------------------------------------------------------------
# The meter


def _method(tracker: Any) -> str:
    """How codecarbon obtains each part's power on this machine, e.g.
    'cpu: RAPL; gpu: NVML (1 x NVIDIA H100); ram: codecarbon estimate (20 W for 24 GB)'."""
    parts: list[str] = []
    conf = getattr(tracker, "_conf", {}) or {}
    for hw in getattr(tracker, "_hardware", []) or []:
        kind = type(hw).__name__
        if kind == "CPU":
            mode = getattr(hw, "_mode", "?")
            tdp, model = getattr(hw, "_tdp", None), getattr(hw, "_model", None) or "unknown model"
            generic = " generic" if getattr(hw, "_is_generic_tdp", False) else ""
            if mode == "intel_rapl":
                parts.append("cpu: RAPL")
            elif mode == "windows_emi":
                parts.append("cpu: Windows Energy Meter Interface")
            elif mode == "intel_power_gadget":
                parts.append("cpu: Intel Power Gadget")
            elif mode == "cpu_load":
                parts.append(
                    f"cpu: codecarbon fallback (CPU load x TDP estimate, {tdp}{generic} W for '{model}', "
                    f"no power counter readable)"
                )
            elif mode == "constant":
                parts.append(f"cpu: codecarbon fallback (constant half of a{generic} {tdp} W TDP for '{model}')")
            else:
                parts.append(f"cpu: {mode}")
        elif kind == "GPU":
            parts.append(f"gpu: NVML/AMD SMI ({conf.get('gpu_model') or 'GPU'})")
        elif kind == "RAM":
            force = getattr(hw, "_force_ram_power", None)
            if force is not None:
                parts.append(f"ram: user-given {force} W")
            else:
                try:
                    watts = f"{hw.total_power().W:.0f} W for "
                except Exception:  # noqa: BLE001 - a description only
                    watts = ""
                parts.append(f"ram: codecarbon estimate from size ({watts}{conf.get('ram_total_size') or 0:.0f} GB)")
        elif kind == "AppleSiliconChip":
            parts.append(f"{getattr(hw, 'chip_part', '?').lower()}: powermetrics")
        elif kind == "Raspberry":
            parts.append(f"{getattr(hw, 'chip_part', '?').lower()}: Raspberry Pi PMIC")
        else:
            parts.append(repr(hw))
    if not any(p.startswith("gpu") for p in parts):
        parts.append("gpu: none tracked")
    order = {"cpu": 0, "gpu": 1, "ram": 2}
    return "; ".join(sorted(parts, key=lambda p: order.get(p.split(":")[0], 3)))


class EnergyMeter:
    """Energy and CO2 of one run session, from `start()` to `stop()`, plus the earlier sessions' totals.

    ```
    meter = EnergyMeter(out_dir, "USA", prior=checkpoint_meta)   # prior: None for a fresh run
    meter.start()
    ...   meta.update(meter.totals())                              # at every checkpoint
    summary.update(meter.stop())                                  # at the end (idempotent, never raises)
    ```
    Also a context manager (`with EnergyMeter(...) as meter:`; stops on exit).

    `out_dir`: where codecarbon appends its row to `emissions.csv` (must exist). `country`: 3-letter ISO
    code for the grid carbon intensity (the CO2 figure scales with it). `enabled=False` measures nothing
    (the summary says so). `prior`: a checkpoint meta dict holding `ENERGY_META_KEYS` (missing keys
    count as zero: checkpoints from before energy tracking).
    """

    def __init__(
        self,
        out_dir: str | Path,
        country: str = "USA",
        enabled: bool = True,
        *,
        prior: Mapping[str, Any] | None = None,
        measure_power_secs: float = MEASURE_POWER_SECS,
    ) -> None:
        validate_country(country)
        self.out_dir = Path(out_dir)
        self.country = country
        self.enabled = enabled
        self.measure_power_secs = measure_power_secs
        self.method = "not measured: disabled (energy=False)" if not enabled else "not measured: not started"
        if enabled and not installed():
            self.enabled, self.method = False, NOT_INSTALLED
        self.error: str | None = None
        self._tracker: Any = None
        self._starting: threading.Thread | None = None
        self._quiet: _QuietLog | None = None
        self._reading = (0.0, 0.0)  # (kWh, kg CO2eq) of this session at the last reading
        self._result: dict[str, Any] | None = None
        self._prior = {"energy_kwh": 0.0, "co2_kg": 0.0, "energy_sessions": 0, "energy_sessions_measured": 0}
        if prior is not None:
            self.include_prior(prior)

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def measuring(self) -> bool:
        return self._tracker is not None

    def include_prior(self, meta: Mapping[str, Any]) -> None:
        """Count the run's earlier sessions: their totals from a checkpoint meta dict. A checkpoint from
        before energy tracking (no keys) counts as one earlier session, not measured."""
        for key, default in (("energy_kwh", 0.0), ("co2_kg", 0.0), ("energy_sessions", 1),
                             ("energy_sessions_measured", 0)):
            try:
                value = type(default)(meta.get(key, default))
            except (TypeError, ValueError):
                value = default
            self._prior[key] = value if math.isfinite(value) and value >= 0 else default

    def start_in_background(self) -> "EnergyMeter":
        """`start()` on a thread of its own, so that codecarbon's start-up (~1.5 s of probing the hardware)
        overlaps the work that follows instead of delaying it. `totals()` and `stop()` wait for it."""
        if self._starting is None:
            self._starting = threading.Thread(target=self.start, name="sparqrl-energy-start", daemon=True)
            self._starting.start()
        return self

    def _started(self) -> None:
        if self._starting is not None and self._starting is not threading.current_thread():
            self._starting.join()

    def start(self) -> "EnergyMeter":
        """Start measuring (no-op when disabled or already started). Never raises: a failure leaves the
        meter not measuring, with the reason in `error` and in the summary."""
        if not self.enabled or self._tracker is not None or self._result is not None:
            return self
        quiet = _QuietLog()
        _attach(quiet)
        tracker = None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from codecarbon import OfflineEmissionsTracker
                from codecarbon.output_methods.base_output import OutputMethod

                _known_cpu_model()

                tracker = OfflineEmissionsTracker(
                    country_iso_code=self.country,
                    # the country alone decides the carbon intensity: no region / cloud / forced value
                    region=None, cloud_provider=None, cloud_region=None, country_2letter_iso_code=None,
                    force_carbon_intensity_g_co2e_kwh=None,
                    # offline: a CSV file only, no API / HTTP endpoint / Prometheus / Logfire, and an
                    # empty Electricity Maps token ("" rather than None, which would let a deprecated
                    # co2_signal_api_token from a config file through)
                    output_methods=[OutputMethod.CSV], output_handlers=[], emissions_endpoint=None,
                    electricitymaps_api_token="", api_call_interval=-1,
                    output_dir=str(self.out_dir), output_file=EMISSIONS_FILE, on_csv_write="append",
                    measure_power_secs=self.measure_power_secs, project_name="sparqrl",
                    allow_multiple_runs=True,  # no lock file: runs side by side must not stop each other
                    log_level="warning",  # reaches the _QuietLog filter, which lets only errors through
                )
                tracker.start()
            # codecarbon swallows every exception in __init__ and start(); a started tracker has a start time
            if getattr(tracker, "_start_time", None) is None:
                raise _Failed(quiet.reason() or "the tracker did not start")
            self.method = _method(tracker)
            self._tracker, self._quiet = tracker, quiet
        except Exception as error:  # noqa: BLE001 - measuring must never stop a run
            self._fail(f"not measured: codecarbon failed to start ({_short(error)})", tracker)
            _detach(quiet)
        except BaseException:  # Ctrl-C while codecarbon starts: leave nothing running, then go on with it
            self._fail("not measured: interrupted while starting", tracker)
            _detach(quiet)
            raise
        return self

    def totals(self) -> dict[str, Any]:
        """Running totals of the whole run so far (earlier sessions + this one), for checkpoint meta:
        the `ENERGY_META_KEYS`, JSON-ready. Never raises."""
        self._started()
        if self._tracker is not None:
            self._read()
        kwh, co2 = self._reading
        return {
            "energy_kwh": self._prior["energy_kwh"] + kwh,
            "co2_kg": self._prior["co2_kg"] + co2,
            "energy_sessions": self._prior["energy_sessions"] + 1,
            "energy_sessions_measured": self._prior["energy_sessions_measured"] + int(self._counts()),
        }

    def stop(self) -> dict[str, Any]:
        """Stop measuring; returns the summary fields of the whole run (earlier sessions included):
        energy_kwh, co2_kg (None where nothing was measured), energy_country,
        co2_intensity_g_per_kwh, energy_method. Idempotent; never raises (a failed stop reports the
        last reading, or not measured)."""
        self._started()
        if self._result is not None:
            return dict(self._result)
        tracker, self._tracker = self._tracker, None
        if tracker is not None:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    tracker.stop()
                data = getattr(tracker, "final_emissions_data", None)
                if data is None:
                    raise _Failed((self._quiet.reason() if self._quiet else "") or "no final emissions data")
                self._reading = (_finite(data.energy_consumed), _finite(data.emissions))
                self._measured = True
            except Exception as error:  # noqa: BLE001
                _cancel_sampling(tracker)
                # keep the last reading, if any: the session was measured up to it
                self._measured = self._reading[0] > 0
                self.error = f"codecarbon failed to stop ({_short(error)})"
                if not self._measured:
                    self.method = f"not measured: {self.error}"
                else:
                    self.method += f"; {self.error}, totals end at the last reading"
            finally:
                if self._quiet is not None:
                    _detach(self._quiet)
                    self._quiet = None
        totals = self.totals()
        sessions, measured = totals["energy_sessions"], totals["energy_sessions_measured"]
        method = self.method
        if measured and measured < sessions:
            method = (f"{method}; partial: {measured} of {sessions} sessions of this run measured"
                      if self._counts() else
                      f"{method} (last session); totals cover the {measured} of {sessions} sessions measured")
        self._result = {
            "energy_kwh": totals["energy_kwh"] if measured else None,
            "co2_kg": totals["co2_kg"] if measured else None,
            "energy_country": self.country,
            "co2_intensity_g_per_kwh": carbon_intensity(self.country),
            "energy_method": method,
        }
        return dict(self._result)

    def __enter__(self) -> "EnergyMeter":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- internals ------------------------------------------------------------------------------

    _measured = False

    def _counts(self) -> bool:
        """Whether this session counts as measured (so far)."""
        return self._tracker is not None or self._measured

    def _read(self) -> None:
        """This session's energy and CO2 so far, without stopping or writing. codecarbon has no public
        call for it (`flush()` writes a CSV row and returns CO2 only), so this does what `flush()`
        does minus the write, through two internals of codecarbon 3.3; if they fail, the last reading
        stays."""
        tracker = self._tracker
        try:
            tracker._measure_power_and_energy_if_stale()
            data = tracker._prepare_emissions_data()
            self._reading = (_finite(data.energy_consumed), _finite(data.emissions))
        except Exception:  # noqa: BLE001
            pass

    def _fail(self, method: str, tracker: Any) -> None:
        self.method = method
        self.error = method.removeprefix("not measured: ")
        if tracker is not None and getattr(tracker, "_start_time", None) is not None:
            try:
                tracker.stop()
            except Exception:  # noqa: BLE001
                pass
        _cancel_sampling(tracker)


def _cancel_sampling(tracker: Any) -> None:
    """Cancel a tracker's sampling timers (codecarbon 3.3 internals), where its stop() could not."""
    for name in ("_scheduler", "_scheduler_monitor_power"):
        try:
            scheduler = getattr(tracker, name, None)
            if scheduler is not None:
                scheduler.stop()
        except Exception:  # noqa: BLE001
            pass


class _Failed(Exception):
    """A codecarbon failure whose cause was found in its log (the message is the cause)."""


def _finite(value: Any) -> float:
    value = float(value)
    return value if math.isfinite(value) and value >= 0 else 0.0


def _short(error: BaseException) -> str:
    """One line naming the error, for the summary."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if isinstance(error, _Failed):
        return text[:300]
    return f"{type(error).__name__}: {text}"[:300] if text else type(error).__name__
