"""A small scripted stand-in for the stitchsim HTTP API, served over real sockets.

It speaks the service's HTTP API (docs/service.md, Endpoints) closely enough to drive the SDK
and CLI through uploads, submission, polling, failures and retries, in milliseconds and
without torch. The real service is
exercised by test_e2e.py and test_real_faults.py; this one lets the client's own logic be
tested in isolation.

It is kept honest: every answer it gives is checked against the real service's OpenAPI
document (openapi_check.py), and the `fake` fixture fails a test that met an answer the
service could not have given; test_fake_contract.py asks the fake and a real gateway the same
questions and compares the status codes and error codes.
"""

from __future__ import annotations

import email.parser
import email.policy
import hashlib
import io
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from stitchsim import codes
from stitchsim.files.errors import SafetensorsError
from stitchsim.files.header import read_header
from stitchsim.models import Spec

from tests.client.openapi_check import openapi, problems
from tests.client.reports import make_report

Response = tuple[int, dict[str, str], bytes]
TERMINAL = ("succeeded", "failed", "cancelled")


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Injected:
    method: str
    path: str
    response: Response
    times: int
    proxy: bool


@dataclass
class FakeJob:
    id: str
    spec: dict[str, Any]
    polls: int = 0
    cancelled: bool = False


@dataclass
class FakeService:
    # States a job passes through, one per GET /jobs/{id}; the last one repeats.
    states: list[dict[str, Any]] = field(
        default_factory=lambda: [
            {"state": "queued"},
            {"state": "running", "progress": {"stage": "train", "done": 1, "total": 2}},
            {"state": "succeeded", "progress": {"stage": "done", "done": 2, "total": 2}},
        ]
    )
    agreement: dict[tuple[str, str], float] = field(default_factory=dict)
    # What the engine would add to a report (verdict_reason, verdict_caveats, a model at
    # chance ...), as keyword arguments of make_report.
    report_extra: dict[str, Any] = field(default_factory=dict)
    spec_check: Callable[[dict[str, Any]], Response | None] | None = None
    # Long-polls as the service answers them: an ETag per status, 304 to an If-None-Match of
    # the status now (after hold_s, as a long-poll that saw no change). Off: an older service,
    # which ignores both.
    etags: bool = False
    hold_s: float = 0.0
    api_key: str | None = None
    requests: list[Recorded] = field(default_factory=list)
    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    jobs: dict[str, FakeJob] = field(default_factory=dict)
    injected: list[Injected] = field(default_factory=list)
    # Answers the real service could not have given (openapi_check.problems), one line each.
    violations: list[str] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ------------------------------------------------------------ control

    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def inject(
        self,
        method: str,
        path: str,
        status: int,
        *,
        headers: dict[str, str] | None = None,
        body: Any = None,
        times: int = 1,
        proxy: bool = False,
    ) -> None:
        """Answer the next `times` requests to METHOD PATH (prefix) with this instead. It is
        checked like every answer: one the service documents for that operation, unless
        `proxy` (what a proxy in front of the service answers: 429, 502, 503, 504)."""
        payload = json.dumps(body).encode() if body is not None else b""
        self.injected.append(Injected(method, path, (status, headers or {}, payload), times,
                                      proxy))

    def calls(self, method: str, prefix: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and r.path.startswith(prefix)]

    def __enter__(self) -> FakeService:
        service = self
        openapi()  # generated from the real app once, before any answer is timed

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # else each response waits on a delayed ACK

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, headers, payload = service.handle(
                    self.command, self.path, dict(self.headers.items()), body
                )
                self.send_response(status)
                headers.setdefault("Content-Type", "application/json")
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_DELETE = _serve

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    # ------------------------------------------------------------ the API

    def handle(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Response:
        with self._lock:
            self.requests.append(Recorded(method, path, headers, body))
            injected = next((inj for inj in self.injected if inj.times > 0
                             and inj.method == method and path.startswith(inj.path)), None)
            if injected is not None:
                injected.times -= 1
        if injected is not None:
            response, proxy = injected.response, injected.proxy
        else:
            response, proxy = self._answer(method, path, headers, body), False
        status, out_headers, payload = response
        found = problems(method, path, status, {"Content-Type": "application/json",
                                                **out_headers}, payload, proxy=proxy)
        with self._lock:
            self.violations.extend(found)
        return response

    def _answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Response:
        if self.api_key is not None and headers.get("Authorization") != f"Bearer {self.api_key}":
            return _error(401, "unauthorized", "this API key is not valid (unknown or revoked)",
                          {"WWW-Authenticate": "Bearer"})
        route = path.split("?")[0].rstrip("/").split("/")[1:]
        if method == "GET" and route == ["healthz"]:
            return _json(200, {"status": "ok"})
        if route[:1] == ["checkpoints"]:
            return self._checkpoints(method, route, headers, body)
        if method == "POST" and route == ["similarity"]:
            return self._submit(headers, body)
        if route[:1] == ["jobs"]:
            return self._jobs(method, route, path, headers)
        return _error(404, "not_found", f"no such endpoint: {method} {path}")

    def _checkpoints(
        self, method: str, route: list[str], headers: dict[str, str], body: bytes
    ) -> Response:
        if method == "GET" and len(route) == 2:
            obj = self.checkpoints.get(route[1])
            if obj is None:
                return _error(404, "not_found", f"checkpoint {route[1]} not found")
            return _json(200, obj)
        if method == "POST" and len(route) == 1:
            data = _multipart_file(headers.get("Content-Type", ""), body)
            if data is None:
                return _error(400, "bad_request",
                              "no file given: send it in the multipart field 'file'")
            if not data:
                return _error(422, "invalid_safetensors", "checkpoint is empty")
            try:
                # The service's own header checks, and its answer for a refused file.
                header = read_header(io.BytesIO(data))
            except SafetensorsError as exc:
                return _error(codes.status_of(exc.code), exc.code, f"checkpoint: {exc.message}")
            digest = "sha256:" + hashlib.sha256(data).hexdigest()
            existed = digest in self.checkpoints
            self.checkpoints[digest] = {"id": digest, "size": len(data),
                                        "n_tensors": header.n_tensors, "arch": header.arch,
                                        "metadata": header.metadata}
            return _json(200 if existed else 201, self.checkpoints[digest])
        return _error(405, "method_not_allowed", "method not allowed")

    def _submit(self, headers: dict[str, str], body: bytes) -> Response:
        spec = json.loads(body)
        if self.spec_check is not None:
            refused = self.spec_check(spec)
            if refused is not None:
                return refused
        for side in ("front", "back"):
            ref = spec[side]["checkpoint"]
            if ref not in self.checkpoints:
                return _error(404, "not_found", f"{side} checkpoint {ref} not found; upload it "
                                                "with POST /checkpoints")
        key = headers.get("Idempotency-Key")
        job = next((j for j in self.jobs.values()
                    if key and j.spec.get("_idempotency_key") == key), None)
        if job is not None and {k: v for k, v in job.spec.items() if k[0] != "_"} != spec:
            return _error(409, "idempotency_conflict", "this Idempotency-Key was used with a "
                          "different request; use a new key for a new request")
        if job is None:
            job = FakeJob(id=uuid.uuid4().hex, spec={**spec, "_idempotency_key": key})
            self.jobs[job.id] = job
        # A replayed Idempotency-Key gets the same answer as the first request, as from the
        # service.
        return _json(
            202,
            {"job_id": job.id, "status_url": f"/jobs/{job.id}"},
            {"Location": f"/jobs/{job.id}", "Retry-After": "1"},
        )

    def _jobs(self, method: str, route: list[str], path: str,
              headers: dict[str, str]) -> Response:
        if len(route) == 1 and method == "GET":
            limit = parse_qs(urlsplit(path).query).get("limit", ["20"])[0]
            if not limit.isdigit() or not 1 <= int(limit) <= 100:
                return _error(422, "invalid_request", "invalid request",
                              [{"loc": ["query", "limit"], "msg": "must lie in [1, 100]"}])
            items = [self._status(j, advance=False) for j in reversed(self.jobs.values())]
            return _json(200, {"items": items, "next_cursor": None})
        job = self.jobs.get(route[1])
        if job is None:
            return _error(404, "not_found", f"job {route[1]} not found")
        if len(route) == 2 and method == "GET":
            status = self._status(job, advance=True)
            if not self.etags:
                return _json(200, status)
            shown = {k: v for k, v in status.items() if k != "created_at"}
            etag = '"' + hashlib.sha256(json.dumps(shown).encode()).hexdigest()[:16] + '"'
            sent = {k.lower(): v for k, v in headers.items()}.get("if-none-match")
            if sent == etag:
                time.sleep(self.hold_s)
                return 304, {"ETag": etag}, b""
            return _json(200, status, {"ETag": etag})
        if len(route) == 2 and method == "DELETE":
            return self._cancel(job)
        if len(route) == 3 and method == "GET":
            state = self._status(job, advance=False)["state"]
            if state != "succeeded" and route[2] == "report":
                code = "job_not_finished" if state not in TERMINAL else f"job_{state}"
                return _error(409, code, f"job {job.id} is {state}; a report exists only "
                                         "once it succeeded")
            if state != "succeeded":  # the page shows the progress instead
                page = f"<html><body>job {job.id}: {state}</body></html>"
                return 200, {"Content-Type": "text/html"}, page.encode()
            spec = {k: v for k, v in job.spec.items() if not k.startswith("_")}
            report = make_report(Spec.model_validate(spec), self.agreement, job_id=job.id,
                                 **self.report_extra)
            if route[2] == "report":
                return _json(200, json.loads(report.model_dump_json()))
            if route[2] == "report.html":
                page = f"<html><body>job {job.id}: {report.verdict}</body></html>"
                return 200, {"Content-Type": "text/html"}, page.encode()
        return _error(404, "not_found", "no such endpoint")

    def _cancel(self, job: FakeJob) -> Response:
        """As the service: a queued job is cancelled at once (200), a running one is flagged
        and stops soon (202, still running), a finished one cannot be (409 job_finished)."""
        state = self._status(job, advance=False)["state"]
        if state in TERMINAL:
            return _error(409, "job_finished", f"job {job.id} already {state}")
        if state == "queued":
            job.cancelled = True
            return _json(200, self._status(job, advance=False))
        status = self._status(job, advance=False)
        job.cancelled = True  # the next poll sees it stopped
        return _json(202, status)

    def _status(self, job: FakeJob, *, advance: bool) -> dict[str, Any]:
        index = min(job.polls, len(self.states) - 1)
        if advance:
            job.polls += 1
        state = {"state": "cancelled"} if job.cancelled else self.states[index]
        now = datetime.now(timezone.utc).isoformat()
        return {"id": job.id, "created_at": now, "progress": {}, **state}


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return status, dict(headers or {}), json.dumps(body).encode()


def _error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    return _json(status, {"error": {"code": code, "message": message, "details": None}}, headers)


def _multipart_file(content_type: str, body: bytes) -> bytes | None:
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body
    )
    for part in msg.iter_parts():
        if part.get_param("name", header="content-disposition") == "file":
            return part.get_payload(decode=True)
    return None
