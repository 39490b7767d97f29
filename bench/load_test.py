"""Load on the gateway: N submissions from K keys at once with P concurrent status pollers,
under a per-key job quota; prints what was accepted, throttled (429 + Retry-After) or went
wrong, and submit and poll latencies (p50, p99).

    python bench/load_test.py [--keys 4] [--per-key 50] [--pollers 50] [--quota 40]
                              [--modes embedded,redis]

The gateway runs alone (no workers: accepted jobs stay queued, then are cancelled), so the
figures are the gateway's and the job table's. Loopback only; every loop is bounded. The
same load, with assertions, is tests/service/test_quotas.py.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from service_bench import TempDirs, make_small  # noqa: E402

from tests.fixtures_service import ServiceFactory, ServiceHandle  # noqa: E402
from tests.service.conftest import tiny_spec, upload  # noqa: E402
from tests.service.loadgen import LoadFigures, run_load  # noqa: E402


def run_mode(mode: str, factory: ServiceFactory, args: argparse.Namespace,
             checkpoints: list[Path]) -> LoadFigures:
    env = {"STITCHSIM_MAX_ACTIVE_JOBS_PER_KEY": str(args.quota),
           "STITCHSIM_CHECK_TIMEOUT_S": "0", "STITCHSIM_REQUIRE_API_KEY": "true"}
    svc: ServiceHandle = (factory.embedded(extra_env=env, workers=False) if mode == "embedded"
                          else factory.redis(keys=False, extra_env=env, workers=False))
    keys = {f"key{i}": svc.create_key(f"key{i}") for i in range(args.keys)}
    specs = {}
    for name, key in keys.items():
        with svc.client(key) as c:
            ids = [upload(c, p) for p in checkpoints]
        specs[name] = tiny_spec({"checkpoint": ids[0]}, {"checkpoint": ids[1]})
    figures = run_load(svc.url, keys, specs, per_key=args.per_key, pollers=args.pollers,
                       settle_s=args.settle_s)
    for name, jobs in figures.accepted.items():
        with svc.client(keys[name]) as c:
            for job in jobs:
                c.delete(f"/jobs/{job}")
    return figures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", type=int, default=4)
    ap.add_argument("--per-key", type=int, default=50)
    ap.add_argument("--pollers", type=int, default=50)
    ap.add_argument("--quota", type=int, default=40, help="jobs in flight per key")
    ap.add_argument("--settle-s", type=float, default=5.0,
                    help="pollers alone after the submissions")
    ap.add_argument("--modes", default="embedded,redis")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="stitchsim-load-") as tmp:
        work = Path(tmp)
        checkpoints = [make_small(work, i) for i in range(2)]
        for mode in args.modes.split(","):
            factory = ServiceFactory(TempDirs(work))  # type: ignore[arg-type]
            try:
                figures = run_mode(mode, factory, args, checkpoints)
            finally:
                factory.close()
            expected = args.keys * min(args.quota, args.per_key)
            print(f"\n== {mode}: {args.keys} keys x {args.per_key} submissions, quota "
                  f"{args.quota}/key (expect {expected} accepted), {args.pollers} pollers")
            print("\n".join(figures.lines()))
            ok = (figures.n_accepted == expected and not figures.other
                  and not figures.poll_errors and figures.throttled_without_retry_after == 0)
            print("result: " + ("as promised" if ok else "NOT as promised"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
