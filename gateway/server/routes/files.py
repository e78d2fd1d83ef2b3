"""The files of a session over HTTP (docs/files.md): ``PUT /v1/session/{id}/files`` uploads,
``GET /v1/session/{id}/files/{transfer_id}`` downloads, with ranges and entity tags; the store on
disk is gateway/storage/files.py.

Binaries are exchanged over HTTP, never on the WebSocket. Every route here needs the token like
any other (auth_middleware); a file belongs to its session and is gone with it.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import BinaryIO, Final

from aiohttp import web

from gateway.api_error import ApiError
from gateway.server.keys import SESSIONS
from gateway.server.middleware import audit
from gateway.server.routes.sessions import (
    TerminatedSession,
    require_on,
    role_on,
    still_live,
    visible_session,
)
from gateway.storage.files import FileError, check_mime_type

log = logging.getLogger("rawp_gateway.server")

_UPLOAD_CHUNK: Final = 64 * 1024


_RANGE: Final = re.compile(r"bytes=(\d{0,19})-(\d{0,19})", re.IGNORECASE)


def byte_range(header: str | None, size: int) -> tuple[int, int] | bool:
    """The part of a file of ``size`` bytes that a ``Range`` header asks for (RFC 9110 §14):
    ``(start, end)``, end exclusive, for one satisfiable range; ``False`` when it cannot be
    satisfied (416: a start past the end, ``bytes=-0``, any range of an empty file); ``True``
    for the whole file: no header, or one the gateway ignores as RFC 9110 allows (several
    ranges, another unit, a malformed or backwards range)."""
    if header is None:
        return True
    match = _RANGE.fullmatch(header.strip())
    if match is None:
        return True
    first, last = match.groups()
    if first:
        start = int(first)
        if last and int(last) < start:
            return True
        if start >= size:
            return False
        return start, min(int(last) + 1, size) if last else size
    if not last:
        return True  # "bytes=-"
    suffix = int(last)
    if suffix == 0 or size == 0:
        return False
    return max(0, size - suffix), size


def strong_etag(checksum: str) -> str:
    """The ``ETag`` of a stored file: its SHA-256, a strong entity tag."""
    return f'"{checksum.removeprefix("sha256:")}"'


def upload_mime_type(header: str | None) -> str:
    """The MIME type of an upload from its ``Content-Type`` header: the type without parameters,
    ``application/octet-stream`` when there is none; ``FileError`` 400 when it is not
    ``type/subtype`` (aiohttp's own parsing would quietly turn a malformed one into
    ``application/octet-stream``)."""
    if header is None or not header.strip():
        return "application/octet-stream"
    return check_mime_type(header.partition(";")[0])


async def put_file(request: web.Request) -> web.Response:
    """``PUT /v1/session/{id}/files?name=<file name>``: the raw body becomes a file of the session,
    streamed to disk and refused (413) as soon as it passes ``max_upload_bytes``."""
    session = visible_session(request)
    require_on(request, session, "operator", "upload")
    session = still_live(session)
    store = session.files
    name = request.query.get("name")
    if name is None:
        raise ApiError(400, "INVALID_FILE_NAME", "name=<file name> is required")
    try:
        mime_type = upload_mime_type(request.headers.get("Content-Type"))
    except FileError:
        session.metrics.file("upload", "refused")
        raise
    declared = request.content_length
    if declared is not None and declared > store.max_upload_bytes:
        session.metrics.file("upload", "refused")
        raise ApiError(
            413, "FILE_TOO_LARGE", f"an upload may be at most {store.max_upload_bytes} bytes"
        )
    try:
        stored = await store.receive(
            request.content.iter_chunked(_UPLOAD_CHUNK),
            file_name=name,
            mime_type=mime_type,
        )
    except ConnectionError:
        # The master went away mid-upload; the store kept nothing of it.
        raise ApiError(400, "INVALID_REQUEST", "the upload was interrupted") from None
    audit(
        request,
        "upload",
        session.id,
        detail={"file_name": stored.file_name[:256], "size_bytes": stored.size_bytes},
    )
    log.info(
        "file uploaded",
        extra={
            "session": session.id,
            "transfer_id": stored.transfer_id,
            "bytes": stored.size_bytes,
        },
    )
    body = {
        "transfer_id": stored.transfer_id,
        "file_url": stored.file_url,
        "file_name": stored.file_name,
        "mime_type": stored.mime_type,
        "size_bytes": stored.size_bytes,
        "checksum": stored.checksum,
    }
    return web.json_response(body, status=201)


async def get_file(request: web.Request) -> web.StreamResponse:
    """``GET /v1/session/{id}/files/{transfer_id}``: the bytes, with their ``Content-Type``, an
    ``ETag`` that is their SHA-256, one ``Range`` honoured (206; 416 when unsatisfiable),
    ``If-None-Match`` (304) and ``If-Range`` against that ETag (docs/files.md says why this is not
    aiohttp's ``FileResponse``)."""
    sessions = request.app[SESSIONS]
    session = sessions.get(request.match_info["session_id"])
    transfer_id = request.match_info["transfer_id"]
    if session is None or role_on(request, session) is None:  # not there for this caller
        raise ApiError(404, "TRANSFER_NOT_FOUND", f"no file {transfer_id!r}: no such session")
    if isinstance(session, TerminatedSession):  # its files went with it
        raise ApiError(404, "TRANSFER_NOT_FOUND", f"no file {transfer_id!r}: the session has ended")
    stored, fd = session.files.open(transfer_id)
    with open(fd, "rb") as f:
        return await _send_file(request, f, stored.size_bytes, stored.mime_type, stored.checksum)


async def _send_file(
    request: web.Request, f: BinaryIO, size: int, mime_type: str, checksum: str
) -> web.StreamResponse:
    etag = strong_etag(checksum)
    headers = {
        "ETag": etag,
        "Accept-Ranges": "bytes",
        # A file is data for a master, never a page of the gateway's origin.
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox",
    }
    if_none_match = request.if_none_match
    if if_none_match is not None and any(t.value in ("*", etag[1:-1]) for t in if_none_match):
        return web.Response(status=304, headers=headers)
    if_range = request.headers.get("If-Range")
    wanted = byte_range(request.headers.get("Range"), size) if if_range in (None, etag) else True
    if wanted is False:
        refused = ApiError(416, "RANGE_NOT_SATISFIABLE", "the range is outside the file")
        answer = refused.response()
        answer.headers["Content-Range"] = f"bytes */{size}"
        return answer
    start, end = (0, size) if wanted is True else wanted
    response = web.StreamResponse(status=200 if wanted is True else 206, headers=headers)
    response.content_type = mime_type
    response.content_length = end - start
    if wanted is not True:
        response.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    await response.prepare(request)
    if request.method == "HEAD":  # the headers only: bytes after them would corrupt the connection
        await response.write_eof()
        return response
    loop = asyncio.get_running_loop()
    try:
        f.seek(start)
        left = end - start
        while left > 0:
            chunk = await loop.run_in_executor(None, f.read, min(_UPLOAD_CHUNK, left))
            if not chunk:
                break
            await response.write(chunk)
            left -= len(chunk)
        await response.write_eof()
    except ConnectionError:
        pass  # the master went away mid-download: nothing to answer
    return response
