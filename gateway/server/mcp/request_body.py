"""Reading a request's body within a limit, never more of it."""

from __future__ import annotations

from starlette.requests import Request

from gateway.errors import PayloadTooLarge


async def body_within(request: Request, limit: int) -> bytes:
    """The request body, refused PAYLOAD_TOO_LARGE past ``limit`` bytes (never decoded).

    A ``Content-Length`` over the limit is refused before any of the body is read.
    """
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(
            f"the request body is {int(declared)} bytes; this peer's limit is {limit}"
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the request body exceeds this peer's limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
