"""Paths of the client that only a real service shows: job listings across pages (the
service's next_cursor, the SDK's iter_jobs, the CLI's "more" hint) and the SDK's dataset calls
(upload, list, use in a job, delete). Against the gateway alone: jobs stay queued, nothing
trains, so the module takes seconds."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from stitchsim import Client, file_sha256
from stitchsim.cli import main
from stitchsim.errors import Conflict, InvalidFile
from stitchsim.models import JobList

from tests.fixtures_service import ServiceHandle
from tests.service.helpers import dataset_bytes, safetensors_bytes

CHEAP = {"layers": [{"front": "layer1", "back": "layer1"}], "objectives": ["dm"],
         "protocols": ["standard"]}


@pytest.fixture
def key(gateway_service: ServiceHandle, request: pytest.FixtureRequest) -> str:
    """A key of this test alone: its listings hold only this test's jobs."""
    return gateway_service.create_key(request.node.name[:40])


def _submit_jobs(client: Client, untrained: Any, n: int) -> list[str]:
    front = client.upload_checkpoint(untrained.front).id
    back = client.upload_checkpoint(untrained.back).id
    return [client.submit({**CHEAP, "front": {"checkpoint": front},
                           "back": {"checkpoint": back}, "train": {"seed": i}}).id
            for i in range(n)]


def test_job_pages_follow_the_cursor(gateway_service: ServiceHandle, untrained: Any,
                                     key: str, capsys: pytest.CaptureFixture[str]) -> None:
    svc = gateway_service
    with Client(svc.url, key) as client:
        newest_first = _submit_jobs(client, untrained, 5)[::-1]

        # The service: pages of two, newest first, each cursor taking up where the last ended.
        pages: list[JobList] = []
        cursor = None
        while not pages or cursor:
            pages.append(client.jobs(limit=2, cursor=cursor))
            cursor = pages[-1].next_cursor
        assert [[j.id for j in p.items] for p in pages] == [
            newest_first[0:2], newest_first[2:4], newest_first[4:5]]
        assert [p.next_cursor is not None for p in pages] == [True, True, False]
        # A page that ends exactly at the last job says there is no more.
        assert client.jobs(limit=5).next_cursor is None

        # The SDK walks every page.
        asked: list[str | None] = []
        page_of = client.jobs

        def counted(*, limit: int = 20, cursor: str | None = None) -> JobList:
            asked.append(cursor)
            return page_of(limit=limit, cursor=cursor)

        client.jobs = counted  # type: ignore[method-assign]
        assert [j.id for j in client.iter_jobs(page_size=2)] == newest_first
        assert asked == [None, pages[0].next_cursor, pages[1].next_cursor]

    # The CLI shows one page and says how to see more.
    url = ["--url", svc.url, "--api-key", key]
    capsys.readouterr()
    assert main(["jobs", "--limit", "2", *url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:3]] == newest_first[:2]
    assert lines[3:] == ["(more: --limit 4)"]
    assert main(["jobs", "--limit", "4", *url]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "(more: --limit 8)"
    assert main(["jobs", "--limit", "5", *url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == newest_first  # all, and no hint


def test_sdk_dataset_calls(gateway_service: ServiceHandle, untrained: Any, key: str,
                           tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    svc = gateway_service
    path = tmp_path / "mine.safetensors"
    path.write_bytes(dataset_bytes(n_train=40, n_test=20, c=3, hw=8))
    with Client(svc.url, key) as client:
        builtins = client.datasets()
        assert builtins and all(d.builtin for d in builtins)
        assert "digits" in {d.id for d in builtins}

        info = client.upload_dataset(path)
        assert info.id == file_sha256(path) and not info.builtin
        assert (info.size, info.n_train, info.n_test, info.image_shape, info.n_classes) == (
            path.stat().st_size, 40, 20, [3, 8, 8], 10)
        listed = client.datasets()
        assert [d for d in listed if not d.builtin] == [info]
        assert [d for d in listed if d.builtin] == builtins

    # Another client (a new CI run) finds it by hash and sends nothing.
    caplog.set_level(logging.INFO, logger="stitchsim")
    with Client(svc.url, key) as client:
        assert client.upload_dataset(path) == info
        assert "already on the service" in caplog.text

        # A dataset given by path in a job is uploaded (or found) and named by its id.
        job = client.compare(untrained.front, untrained.back, dataset=path, **CHEAP)
        status = client.http.request("GET", f"/jobs/{job.id}").json()
        assert status["spec"]["dataset"] == info.id

        # In use by a queued job, it cannot go; once the job is cancelled it can.
        with pytest.raises(Conflict) as refused:
            client.delete_dataset(info.id)
        assert refused.value.code == "in_use" and job.id in str(refused.value)
        job.cancel()
        client.delete_dataset(info.id)
        assert [d for d in client.datasets() if not d.builtin] == []

        # A file that is no dataset is refused before upload; the service refuses it alike.
        bad = tmp_path / "labels-missing.safetensors"
        data = safetensors_bytes({"train_images": np.zeros((4, 3, 8, 8), np.uint8)})
        bad.write_bytes(data)
        with pytest.raises(InvalidFile) as local:
            client.upload_dataset(bad)
    assert local.value.code == "invalid_dataset"
    with svc.client(key) as http:
        r = http.post("/datasets", files={"file": (bad.name, data)})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_dataset", r.text
