"""A job worker's device figures: seconds a work unit takes by input side, as measured by the
engine's probe (stitchsim_worker.engine.calibration) or given as stand-in figures
(STITCHSIM_CALIBRATION), and the job limit they imply. Torch-free: a worker's parent reads
stand-ins and announces figures without importing the engine."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

REFERENCE_SECONDS_PER_UNIT = 0.04
"""The rate the operator's unit limit (STITCHSIM_MAX_JOB_UNITS) is stated at: 2 shared CPU
cores on test_resnet jobs (bench/eta_accuracy.py), where the default limit was set."""

PROBE_SIZES = (32, 224)
"""The input sides the probe measures (and a single stand-in figure stands for)."""


@dataclass(frozen=True)
class Calibration:
    device: str
    """The device type measured: "cuda: NVIDIA H200", "cpu: x86_64, 2 threads"."""
    torch: str
    rates: dict[int, float]
    """Seconds a work unit takes, by square input side."""
    source: str = "probe"
    """probe (measured now), cache (measured before, same device and torch), stand-in (set
    by STITCHSIM_CALIBRATION) or slowest (the slowest of several workers)."""
    measured_at: float = field(default_factory=time.time)

    def seconds_per_unit(self, size: int) -> float:
        """The rate at this input side: log-log interpolation between probe sizes."""
        sizes = sorted(self.rates)
        if size <= sizes[0]:
            return self.rates[sizes[0]]
        if size >= sizes[-1]:
            return self.rates[sizes[-1]]
        hi = next(s for s in sizes if s >= size)
        lo = max(s for s in sizes if s < size)
        t = (math.log(size) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return math.exp((1 - t) * math.log(self.rates[lo]) + t * math.log(self.rates[hi]))

    def job_limit(self, reference_units: int, size: int) -> int:
        """The per-job unit limit at this input side: reference_units at the reference rate,
        in the same worker time at this device's rate."""
        return max(1, round(reference_units * REFERENCE_SECONDS_PER_UNIT
                            / self.seconds_per_unit(size)))

    def as_dict(self) -> dict[str, Any]:
        return {"device": self.device, "torch": self.torch, "source": self.source,
                "measured_at": self.measured_at,
                "seconds_per_unit": {str(k): v for k, v in sorted(self.rates.items())}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Calibration:
        rates = {int(k): float(v) for k, v in d["seconds_per_unit"].items()}
        if not rates or min(rates.values()) <= 0:
            raise ValueError("a calibration needs positive seconds per unit")
        return cls(str(d["device"]), str(d["torch"]), rates, str(d.get("source", "cache")),
                   float(d.get("measured_at", 0.0)))

    def text(self) -> str:
        figures = ", ".join(f"{s} px: {r:.3g} s/unit (job limit "
                            f"x{REFERENCE_SECONDS_PER_UNIT / r:.3g})"
                            for s, r in sorted(self.rates.items()))
        return f"{self.device} (torch {self.torch}, {self.source}): {figures}"


def slowest(calibrations: Iterable[Calibration]) -> Calibration | None:
    """One calibration for workers any of which may take a job: at each probe size the
    slowest rate, so a job accepted can finish in its budget wherever it lands."""
    cals = list(calibrations)
    if not cals:
        return None
    if len(cals) == 1:
        return cals[0]
    sizes = sorted({s for c in cals for s in c.rates})
    rates = {s: max(c.seconds_per_unit(s) for c in cals) for s in sizes}
    devices = " / ".join(sorted({c.device for c in cals}))
    return Calibration(devices, cals[0].torch, rates, "slowest",
                       min(c.measured_at for c in cals))


def parse_stand_in(text: str, device: str = "stand-in") -> Calibration:
    """STITCHSIM_CALIBRATION given as figures: "0.0002" (one rate at every size) or
    "32:0.002,224:0.0002" (a rate per input side)."""
    rates: dict[int, float] = {}
    try:
        for item in text.split(","):
            size, sep, rate = item.strip().rpartition(":")
            rates[int(size) if sep else PROBE_SIZES[0]] = float(rate)
        if not sep and len(rates) == 1:
            rates = {s: rates[PROBE_SIZES[0]] for s in PROBE_SIZES}
    except ValueError:
        rates = {}
    if not rates or min(rates.values()) <= 0 or min(rates) < 1:
        raise ValueError(f"STITCHSIM_CALIBRATION={text!r}: expected probe, off, seconds per "
                         "unit (0.0002) or SIZE:SECONDS pairs (32:0.002,224:0.0002)")
    return Calibration(device, _torch_version(), rates, "stand-in")


def _torch_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "unknown"
