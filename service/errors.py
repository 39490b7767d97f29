"""One error shape for every failure: {"error": {"code", "message", "details"}}.

Bad input is always a 4xx with a message that says what to fix; a 500 means a bug of ours and
never carries a traceback.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from stitchsim.safetensors_format import SafetensorsError, UnsupportedFormat
from stitchsim_service.store import StoreError

log = logging.getLogger("stitchsim.service")

_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media_type",
    422: "invalid",
    429: "too_many_requests",
    503: "unavailable",
}


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: Any = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers


def not_found(what: str, ident: str) -> ApiError:
    # Same answer whether the thing does not exist or belongs to another key. The id comes
    # from the URL: cut short, so a hostile one is not echoed back whole.
    shown = ident if len(ident) <= 80 else ident[:77] + "..."
    return ApiError(404, "not_found", f"{what} {shown} not found", {"id": shown})


def body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details}}


def _loc(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or "request"


def validation_details(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for e in errors:
        out.append({"field": _loc(e.get("loc", ())), "message": e.get("msg", ""),
                    "type": e.get("type", "")})
    return out


def validation_message(prefix: str, errors: list[dict[str, Any]]) -> str:
    details = validation_details(errors)
    shown = "; ".join(f"{d['field']}: {d['message']}" for d in details[:5])
    more = f" (and {len(details) - 5} more)" if len(details) > 5 else ""
    return f"{prefix}: {shown}{more}"


def safetensors_error(exc: SafetensorsError, what: str) -> ApiError:
    if isinstance(exc, UnsupportedFormat):
        return ApiError(415, exc.code, f"{what}: {exc.message}", exc.details)
    return ApiError(422, exc.code, f"{what}: {exc.message}", exc.details)


def install_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(
            body(exc.code, exc.message, exc.details), status_code=exc.status, headers=exc.headers
        )

    def _invalid(code: str, what: str, exc: RequestValidationError | ValidationError
                 ) -> JSONResponse:
        errors = list(exc.errors())
        return JSONResponse(body(code, validation_message(what, errors),
                                 validation_details(errors)), status_code=422)

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _invalid("invalid_request", "invalid request", exc)

    @app.exception_handler(ValidationError)
    async def _pydantic_validation(request: Request, exc: ValidationError) -> JSONResponse:
        return _invalid("invalid_spec", "invalid spec", exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, "error")
        message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
        if exc.status_code == 404 and message == "Not Found":
            message = f"no such endpoint: {request.method} {request.url.path}"
        return JSONResponse(
            body(code, message), status_code=exc.status_code, headers=getattr(exc, "headers", None)
        )

    @app.exception_handler(StoreError)
    async def _store(request: Request, exc: StoreError) -> JSONResponse:
        log.error("store error: %s", exc)
        return JSONResponse(
            body("store_unavailable", f"{exc}; retry later"),
            status_code=503,
            headers={"Retry-After": "30"},
        )

    @app.exception_handler(OperationalError)
    async def _db(request: Request, exc: OperationalError) -> JSONResponse:
        log.error("job table error: %s", exc)
        return JSONResponse(
            body("database_unavailable", "the job table is unavailable; retry later"),
            status_code=503,
            headers={"Retry-After": "10"},
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse(
            body("internal", "internal error; it has been logged"), status_code=500
        )
