"""Restarts lose no job: a worker killed mid-job (SIGKILL, as an OOM kill does) and a gateway
restart, with one job running and one queued; both finish, finished reports stay."""

from __future__ import annotations

import signal
import time

from tests.service.conftest import job_report, submit, tiny_spec, upload


def _scenario(svc, ckpts, restart_gateway, restart_workers) -> None:  # type: ignore[no-untyped-def]
    with svc.client() as c:
        front = upload(c, ckpts.digits_resnet)
        back = upload(c, ckpts.digits_resnet_b)
    spec = tiny_spec({"checkpoint": front}, {"checkpoint": back})
    done = submit(svc, {**spec, "directions": "back_to_front"})
    svc.wait_job(done)
    before = job_report(svc, done)

    # Long enough (many epochs) to be killed while it runs.
    running = submit(svc, {**spec, "train": {**spec["train"], "epochs": 20,
                                              "max_train_samples": 400}})
    svc.wait_job(running, states=("running", "succeeded", "failed"), interval=0.02)
    queued = submit(svc, {**spec, "train": {**spec["train"], "seed": 4}})

    killed = svc.kill_workers("gpu")
    assert killed, "no gpu worker to kill"
    restart_workers()
    restart_gateway()

    final = svc.wait_job(running, timeout=240)[-1]
    assert final["state"] == "succeeded", final
    assert final["attempts"] >= 2, final  # the killed attempt counted
    assert svc.wait_job(queued, timeout=180)[-1]["state"] == "succeeded"
    assert job_report(svc, done) == before


def test_embedded_worker_kill_and_gateway_restart(service_factory, ckpts) -> None:  # type: ignore[no-untyped-def]
    svc = service_factory.embedded()

    def restart_gateway() -> None:
        # serve is gateway and workers in one: restarting it restarts both.
        svc.stop_process("serve", signal.SIGTERM)
        svc.start()
        svc.wait_ready()

    _scenario(svc, ckpts, restart_gateway, lambda: None)


def test_redis_worker_kill_and_gateway_restart(redis_service, ckpts) -> None:  # type: ignore[no-untyped-def]
    svc = redis_service

    def restart_gateway() -> None:
        svc.stop_process("gateway", signal.SIGTERM)
        time.sleep(0.5)
        svc.start_gateway()
        svc.wait_ready()

    _scenario(svc, ckpts, restart_gateway, svc.start_workers)
