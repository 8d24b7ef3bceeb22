"""The OpenAI error object (``{"error": {"message", "type", "param", "code"}}``)
and the HTTP status each refusal is sent with. A refused request changes nothing:
every check that can refuse runs before the first write."""

from __future__ import annotations


class ApiError(Exception):
    """A request refused with ``status``; the message names the bad input."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_
        self.headers = headers or {}

    def to_json(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def not_found(message: str, param: str | None = None) -> ApiError:
    return ApiError(404, message, param=param, code="not_found")


def unauthorized(message: str) -> ApiError:
    return ApiError(401, message, code="invalid_api_key")


def busy(message: str, retry_after_s: int = 1) -> ApiError:
    """A conversation another request holds: 409 with Retry-After (the openai
    client retries 409 by itself, honouring the header)."""
    return ApiError(409, message, code="conversation_busy", headers={"Retry-After": str(retry_after_s)})


def server_error(message: str = "the server failed to complete the request; the conversation is as its last commit left it") -> ApiError:
    return ApiError(500, message, type_="server_error", code="server_error")
