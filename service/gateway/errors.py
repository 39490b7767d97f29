"""The one place where errors become HTTP answers: a Failure (stitchsim.failure), raised by
the core, the gateway or the engine's spec check, is answered as
{"error": {"code", "message", "details"}} with the status the error-code registry
(stitchsim.codes) gives its code.

Bad input is always a 4xx with a message that says what to fix; a 500 means a bug of ours and
never carries a traceback.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path
from stitchsim import codes
from stitchsim.failure import Failure
from stitchsim.files.errors import SafetensorsError
from stitchsim.validation import validation_failure
from stitchsim_service.core.store import StoreError

log = logging.getLogger("stitchsim.service")


def status_of(exc: Failure) -> int:
    """The registry's status for the code; 500 for a code outside the registry or one that is
    never an HTTP answer (a bug of ours: answer() logs it)."""
    entry = exc.entry
    return entry.status if entry is not None and entry.status is not None else 500


def body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details}}


def answer(exc: Failure) -> JSONResponse:
    status = status_of(exc)
    if status == 500 and exc.code != "internal":
        log.error("a failure with no HTTP status reached the gateway: %r", exc)
        exc = Failure("internal", "internal error; it has been logged")
    headers = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(int(exc.retry_after))
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    message = exc.message
    if isinstance(exc, StoreError):
        log.error("store error: %s", exc)
        message += "; retry later"
    return JSONResponse(body(exc.code, message, exc.details), status_code=status,
                        headers=headers or None)


def file_error(exc: SafetensorsError, what: str) -> Failure:
    """A refused file as the Failure answered: its code says 415 (another format) or 422."""
    return Failure(exc.code, f"{what}: {exc.message}", exc.details)


def _document_error_bodies(app: FastAPI) -> None:
    """Every error goes out as the error body above, with application/json: the 422 of a bad
    query or path parameter and the errors of the HTML report page too. FastAPI documents its
    own HTTPValidationError for the 422 and the route's media type for the page's errors; the
    document is corrected to say what is sent."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            for ops in schema.get("paths", {}).values():
                for op in ops.values():
                    for status, documented in op.get("responses", {}).items():
                        if status[:1] in ("4", "5"):
                            documented["content"] = {"application/json": {
                                "schema": {"$ref": "#/components/schemas/ErrorBody"}}}
            models = schema.get("components", {}).get("schemas", {})
            text = json.dumps(schema)
            for name in ("HTTPValidationError", "ValidationError"):
                if f'"#/components/schemas/{name}"' not in text:
                    models.pop(name, None)
                    text = json.dumps(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def allowed_methods(request: Request) -> str | None:
    """Every method the OpenAPI document gives the request's path, for a 405's Allow (RFC 9110
    15.5.6); None for a path it does not hold. Starlette answers with the methods of the first
    route whose path matched, and a path such as /checkpoints is one route per method."""
    methods = {m.upper() for template, ops in request.app.openapi()["paths"].items()
               if _template(template).match(request.url.path) for m in ops}
    return ", ".join(sorted(methods)) or None


@functools.cache
def _template(path: str) -> re.Pattern[str]:
    return compile_path(path)[0]


def install_handlers(app: FastAPI) -> None:
    _document_error_bodies(app)

    @app.exception_handler(Failure)
    async def _failure(request: Request, exc: Failure) -> JSONResponse:
        return answer(exc)

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return answer(validation_failure("invalid_request", "invalid request", exc.errors()))

    @app.exception_handler(ValidationError)
    async def _pydantic_validation(request: Request, exc: ValidationError) -> JSONResponse:
        return answer(validation_failure("invalid_spec", "invalid spec", exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = codes.GENERIC.get(exc.status_code, "error")
        message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such endpoint: {request.method} {request.url.path}"
        allowed = allowed_methods(request) if exc.status_code == 405 else None
        if allowed is not None:
            headers["Allow"] = allowed
            message = f"{request.url.path} takes {allowed}, not {request.method}"
        return JSONResponse(body(code, message), status_code=exc.status_code,
                            headers=headers or None)

    @app.exception_handler(OperationalError)
    async def _db(request: Request, exc: OperationalError) -> JSONResponse:
        log.error("job table error: %s", exc)
        return answer(Failure("database_unavailable",
                              "the job table is unavailable; retry later", retry_after=10))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return answer(Failure("internal", "internal error; it has been logged"))
