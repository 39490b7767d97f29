"""Warming a long-lived worker process: the imports a first spec check or job would otherwise
make on its own time (a model source's library, the built-in data's). The spec check answers
within seconds (STITCHSIM_CHECK_TIMEOUT_S); a cold transformers import alone takes several on
a busy host. Nothing here knows of Celery: the worker calls it when its process starts."""

from __future__ import annotations

import time

from stitchsim_worker.engine.models import sources


def warm_up() -> dict[str, float]:
    """Seconds each part took: every model source's first-use imports, then the built-in
    datasets' library."""
    took = {}
    for name in sources.SOURCES:
        entry = sources.SOURCES[name]
        if entry.preload is None:
            continue
        start = time.perf_counter()
        entry.preload()
        took[name] = time.perf_counter() - start
    start = time.perf_counter()
    import sklearn.datasets  # noqa: F401 - the built-in digits' loader (bundled data)

    took["builtin data"] = time.perf_counter() - start
    return took
