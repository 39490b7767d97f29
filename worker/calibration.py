"""How fast this worker's device does a work unit, measured once per device type and torch
version (a short probe, cached on disk), and per input size: a GPU that idles on 32 px
batches does many more units a second on 224 px ones, a CPU about as many.

A work unit (engine/core/costs.py) is about one batch through a network part, counted at the models'
size against a resnet18 on 32x32 inputs (costs.size_factor). Its seconds were measured on the
reference device, 2 shared CPU cores (REFERENCE_SECONDS_PER_UNIT, bench/eta_accuracy.py), where
the default job limit was set too. The probe times a resnet18's forward and backward pass at
each probe size, in floating-point operations a second, and states the device's speed against
the reference's (REFERENCE_FLOP_RATE): a device k times as fast at an input size does a unit
in 1/k of the reference's seconds there, and takes k times the units of STITCHSIM_MAX_JOB_UNITS
in the same worker time. Between probe sizes the rate is interpolated in log-log, beyond them
it is held. A relative calibration keeps what a unit means (batches of small models count
one unit each, as on the reference) while the limit follows the device.

Torch-free at import: a worker's parent reads stand-in figures and announces them without
torch; the probe imports torch and the engine's device helpers only when it runs. The engine
sees a calibration only through its DeviceRate protocol (engine/core/resources.py).
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
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
    reference_seconds_per_unit: float = REFERENCE_SECONDS_PER_UNIT
    """The rate the operator's unit limit is stated at."""

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


log = logging.getLogger("stitchsim.calibration")

REFERENCE_FLOP_RATE = 10e9
"""Floating-point operations a second of a resnet18's forward and backward pass on the
reference device (2 CPU cores): the speed REFERENCE_SECONDS_PER_UNIT was measured at."""

PROBE_ARCH = "resnet18"
PROBE_FLOPS = 3 * 74e6
"""A resnet18 sample's forward and backward pass at 32 px (costs.REFERENCE_FLOPS forward, about
twice that backward); convolutions cost the area, so (size/32)^2 times this at other sizes."""
PROBE_SECONDS = 1.0
"""Measured time per probe size, after one warm-up step (the probe stops earlier at 10 steps)."""

CACHE_FILE = "calibration.json"


def device_name(device: Any) -> str:
    """The device type a calibration is good for: the GPU's name, or the CPU's architecture
    and the threads torch uses."""
    import torch

    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    return f"cpu: {platform.machine()} {platform.processor() or ''}".rstrip() + \
        f", {torch.get_num_threads()} threads"


def calibrate(cache_dir: Path, device: Any = None, *, sizes: tuple[int, ...] = PROBE_SIZES,
              refresh: bool = False) -> Calibration:
    """This device's calibration: from the cache when this device type and torch version
    were measured before, else probed now and cached."""
    import torch
    from stitchsim_worker.engine.core.device import pick_device

    device = device or pick_device("auto")
    key = f"{device_name(device)} | torch {torch.__version__} | " + \
        ",".join(str(s) for s in sizes)
    path = cache_dir / CACHE_FILE
    cached = _read_cache(path)
    if key in cached and not refresh:
        try:
            return Calibration.from_dict({**cached[key], "source": "cache"})
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("calibration cache entry unreadable (%s); probing again", exc)
    rates = probe(device, sizes)
    cal = Calibration(device_name(device), torch.__version__, rates, "probe")
    cached[key] = cal.as_dict()
    _write_cache(path, cached)
    return cal


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(path: Path, data: dict[str, Any]) -> None:
    # Written whole and renamed: two workers starting together must not leave half a file.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)


def probe(device: Any, sizes: tuple[int, ...] = PROBE_SIZES) -> dict[int, float]:
    """Seconds a work unit takes at each input side, timed on a resnet18 (random weights)."""
    import timm
    import torch

    torch.manual_seed(0)
    net = timm.create_model(PROBE_ARCH, pretrained=False, num_classes=10).to(device)
    rates = {}
    for size in sizes:
        # A CPU runs near its peak on a few samples (at 224 px one takes a fraction of a
        # second); a GPU needs full batches to show its speed.
        batch = 64 if device.type == "cuda" else (8 if size <= 64 else 1)
        x = torch.rand(batch, 3, size, size, device=device)

        def step(x: torch.Tensor = x) -> None:
            net.zero_grad(set_to_none=True)
            # fp32, as IRIs run by default (iri.precision).
            loss = net(x).float().logsumexp(dim=1).mean()
            loss.backward()
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        step()  # warm-up: allocations, kernel choice
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < 10 and (len(times) < 2 or time.perf_counter() - start < PROBE_SECONDS):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        # The fastest step: what the device does when nothing else takes it (other processes
        # on a busy host only ever slow a step down).
        flop_rate = PROBE_FLOPS * (size / 32) ** 2 * batch / min(times)
        rates[size] = REFERENCE_SECONDS_PER_UNIT * REFERENCE_FLOP_RATE / flop_rate
    return rates
