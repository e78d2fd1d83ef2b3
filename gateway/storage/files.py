"""Files of a session (DPS §4.5, docs/files.md): a bounded store on disk, per session.

Theory of operation
-------------------
Binary content never rides the WebSocket. What a tool returned as bytes (Claude Code's ``Read`` of
an image) and what a master uploads (``PUT /v1/session/{id}/files``) are kept here, one
``FileStore`` per session, and exchanged as HTTP URLs.

* **On disk, not in memory.** The store's directory is a temporary directory of its own, made on
  the first file and removed with the session (``close``). A file is kept under its
  ``transfer_id`` (a UUID v4), never under a name a master or an agent chose. With a state
  directory (``gateway/storage/state_dir.py``) the store lives in the session's directory instead, with
  an ``index.json`` beside the files, so a session restored after a restart still serves them.
* **Bounded.** All files of a session together at most ``max_session_bytes`` (507
  ``SESSION_STORAGE_FULL``); one upload at most ``max_upload_bytes`` (413 ``FILE_TOO_LARGE``),
  counted while it streams in, so an over-size body is refused without being kept. Uploads in
  progress reserve what they wrote, so concurrent ones cannot together pass the bound.
* **No link is followed.** The agent can write the store's directory (it runs as the gateway's
  user), so it is reached through descriptors (``gateway/storage/nofollow.py``): files are created
  ``O_EXCL | O_NOFOLLOW``, read only as the regular file of their recorded size, and removed by
  walking descriptors. A file placed in the workspace (``copy_to``) is a new file renamed over
  the name, so a link planted there is replaced, never written through. An upload still streaming
  when the session ends is refused (404 ``SESSION_NOT_FOUND``) and gives back what it reserved.
* **The index is plain data.** ``files`` maps ``transfer_id`` to ``StoredFile`` (URL, name, MIME
  type, size, ``sha256:`` checksum): the session machine reads it to check a prompt's
  ``context_files`` without any I/O.

``store_tool_files`` is the step between the parser and the session machine: a ``ToolResult``
whose parser found base64 content is stored here and handed on with ``StoredFile`` references in
place of the bytes; the mapper then sends ``agent.file.transfer`` and a ``binary_ref`` result. A
file that cannot be stored (the session's storage is full, bad base64) is named in the result's
text instead, and logged; the bytes are dropped either way.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import logging
import mimetypes
import os
import re
import shutil
import stat
import tempfile
import uuid
from collections.abc import AsyncIterable, Callable
from pathlib import Path, PurePosixPath
from typing import Final, Protocol

import msgspec

from gateway.api_error import ApiError
from gateway.protocol.prompts import IMAGE_MIME_TYPES, MAX_FILE_NAME_BYTES, valid_file_name
from gateway.storage import nofollow
from parsers import events as ev

__all__ = [
    "IMAGE_TYPES",
    "FileError",
    "FileStore",
    "byte_range",
    "check_file_name",
    "check_mime_type",
    "files_path",
    "store_tool_files",
    "strong_etag",
    "upload_mime_type",
]

log = logging.getLogger("rawp_gateway.files")

_INDEX: Final = "index.json"
_FILES: Final = "files"  # the store's directory in a session's state directory
MAX_INDEX_BYTES: Final = 8 * 1024 * 1024  # a saved index.json: ~400 bytes a file

OCTET_STREAM: Final = "application/octet-stream"
_MIME: Final = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,63}/[a-z0-9][a-z0-9!#$&^_.+-]{0,63}")
_CHUNK: Final = 64 * 1024
_index_decoder = msgspec.json.Decoder(list[ev.StoredFile])


def _webp(head: bytes) -> bool:
    return head[:4] == b"RIFF" and head[8:12] == b"WEBP"


# The image types an agent may be given as images (docs/files.md), with how each begins: a body
# labelled with one of them must be one, or the model API would refuse the whole conversation.
IMAGE_TYPES: Final[dict[str, Callable[[bytes], bool]]] = {
    "image/png": lambda head: head.startswith(b"\x89PNG\r\n\x1a\n"),
    "image/jpeg": lambda head: head.startswith(b"\xff\xd8\xff"),
    "image/gif": lambda head: head.startswith((b"GIF87a", b"GIF89a")),
    "image/webp": _webp,
}
assert IMAGE_TYPES.keys() == IMAGE_MIME_TYPES


class FileMetrics(Protocol):
    """What the store reports (``GatewayMetrics``): bytes held, and each file offered."""

    def file_bytes(self, delta: int) -> None: ...

    def file(self, direction: str, outcome: str) -> None: ...


class FileError(ApiError):
    """A file operation refused, as docs/files.md's HTTP error (status and ``error_code``)."""


def files_path(session_id: str, transfer_id: str) -> str:
    """The ``file_url`` of a stored file: its path on the gateway (docs/files.md)."""
    return f"/v1/session/{session_id}/files/{transfer_id}"


def check_file_name(name: object) -> str:
    """``name`` if it is a base name (``valid_file_name``: no ``/`` nor a lookalike, no control,
    format or separator character, not ``.`` or ``..``, 1 to 255 UTF-8 bytes); ``FileError`` 400
    ``INVALID_FILE_NAME`` otherwise."""
    if not isinstance(name, str) or not valid_file_name(name):
        raise FileError(
            400,
            "INVALID_FILE_NAME",
            f"{name!r} is not a file name: a base name of 1 to {MAX_FILE_NAME_BYTES} bytes, "
            "without '/' or a lookalike, without control, format or separator characters, "
            "not '.' or '..'",
        )
    return name


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


def check_mime_type(value: str) -> str:
    """A MIME type ``type/subtype`` (lower case, no parameters); ``FileError`` 400 otherwise."""
    mime = value.strip().lower()
    if not _MIME.fullmatch(mime):
        raise FileError(400, "INVALID_REQUEST", f"{value!r} is not a MIME type (type/subtype)")
    return mime


def upload_mime_type(header: str | None) -> str:
    """The MIME type of an upload from its ``Content-Type`` header: the type without parameters,
    ``application/octet-stream`` when there is none; ``FileError`` 400 when it is not
    ``type/subtype`` (aiohttp's own parsing would quietly turn a malformed one into
    ``application/octet-stream``)."""
    if header is None or not header.strip():
        return "application/octet-stream"
    return check_mime_type(header.partition(";")[0])


def _ended() -> FileError:
    return FileError(404, "SESSION_NOT_FOUND", "the session has ended; its files are gone")


class FileStore:
    """One session's files (see the module docstring). ``directory``: the session's state
    directory (its descriptor and path), where the store keeps ``files/``; ``None`` for a
    temporary directory of its own."""

    def __init__(
        self,
        session_id: str,
        *,
        max_session_bytes: int,
        max_upload_bytes: int,
        url_of: Callable[[str, Path], str] | None = None,
        metrics: FileMetrics | None = None,
        directory: tuple[int, Path] | None = None,
    ) -> None:
        self.session_id = session_id
        self._metrics = metrics
        self.max_session_bytes = max_session_bytes
        self.max_upload_bytes = max_upload_bytes
        # The file_url of a stored file: the gateway's path by default; translate uses file URIs.
        self._url_of = url_of or (lambda transfer_id, _path: files_path(session_id, transfer_id))
        self.files: dict[str, ev.StoredFile] = {}
        self.used_bytes = 0  # stored, plus what uploads in progress have written so far
        self._saved = directory is not None  # the index is kept on disk, for a restart
        # Everything is reached from descriptors (gateway/storage/nofollow.py): the parent's and, once
        # made, the store's own directory's (owned). A session directory's descriptor is its
        # SavedSession's, which outlives the store (closed or released first); the temporary
        # directory's parent is the store's own.
        self._parent_fd = directory[0] if directory is not None else -1
        self._owns_parent = directory is None
        self._parent_path = directory[1] if directory is not None else None
        self._name = _FILES
        self._dir_fd = -1
        self._closed = False

    @property
    def _path(self) -> Path:
        assert self._parent_path is not None
        return self._parent_path / self._name

    @property
    def directory(self) -> Path | None:
        """Where the files are, once the first one was stored (``None`` before, and after the
        end)."""
        return self._path if self._dir_fd >= 0 else None

    # --- writing -----------------------------------------------------------------------------------

    def _directory(self) -> int:
        if self._closed:
            raise _ended()
        if self._dir_fd < 0:
            if self._parent_fd < 0:
                made = Path(tempfile.mkdtemp(prefix=f"rawp-files-{self.session_id[:8]}-"))
                # The system's temporary directory (it may be a link, as /tmp is on some
                # systems); what is under it is reached without following links.
                self._parent_fd = os.open(made.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                self._parent_path, self._name = made.parent, made.name
            self._dir_fd = nofollow.open_dir(self._name, dir_fd=self._parent_fd, create=True)
        return self._dir_fd

    def _reserve(self, size: int, limit: int | None) -> None:
        if self._closed:  # an upload still streaming when the session ended
            raise _ended()
        if limit is not None and size > limit:
            raise FileError(
                413,
                "FILE_TOO_LARGE",
                f"an upload may be at most {self.max_upload_bytes} bytes on this gateway",
            )
        if self.used_bytes + size > self.max_session_bytes:
            raise FileError(
                507,
                "SESSION_STORAGE_FULL",
                f"the session's files may take at most {self.max_session_bytes} bytes "
                f"({self.used_bytes} in use)",
            )
        self.used_bytes += size
        if self._metrics is not None:
            self._metrics.file_bytes(size)

    def _release(self, size: int) -> None:
        if self._closed:  # close() gave back everything, reservations of uploads included
            return
        self.used_bytes -= size
        if self._metrics is not None:
            self._metrics.file_bytes(-size)

    def _count(self, direction: str, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.file(direction, outcome)

    def _discard(self, name: str) -> None:
        if not self._closed:  # after close() the directory (and the descriptor) is gone
            with contextlib.suppress(OSError):
                os.unlink(name, dir_fd=self._dir_fd)

    def put(
        self,
        data: bytes,
        *,
        file_name: str,
        mime_type: str,
        workspace_relative_path: str | None = None,
    ) -> ev.StoredFile:
        """Store ``data`` (bounded by the session's total only: it came from the agent)."""
        try:
            check_file_name(file_name)
            self._reserve(len(data), None)
        except FileError:
            self._count("download", "refused")
            raise
        transfer_id = str(uuid.uuid4())
        try:
            with open(nofollow.create_fd(self._directory(), transfer_id), "wb") as out:
                out.write(data)
        except BaseException:
            self._release(len(data))
            self._discard(transfer_id)
            self._count("download", "refused")
            raise
        self._count("download", "stored")
        return self._index(
            transfer_id,
            file_name,
            mime_type,
            len(data),
            hashlib.sha256(data).hexdigest(),
            workspace_relative_path,
        )

    async def receive(
        self, chunks: AsyncIterable[bytes], *, file_name: str, mime_type: str
    ) -> ev.StoredFile:
        """Store an upload as it streams in, refusing it (and keeping nothing) as soon as it passes
        ``max_upload_bytes`` or the session's bound, or the session ends (404
        ``SESSION_NOT_FOUND``). An image type must start like one."""
        transfer_id = str(uuid.uuid4())
        try:
            check_file_name(file_name)
            fd = nofollow.create_fd(self._directory(), transfer_id)
        except FileError:
            self._count("upload", "refused")
            raise
        digest = hashlib.sha256()
        size = 0
        head = b""
        try:
            with open(fd, "wb") as out:
                async for chunk in chunks:
                    self._reserve(len(chunk), self.max_upload_bytes - size)
                    size += len(chunk)
                    if len(head) < 16:
                        head = (head + chunk)[:16]
                    digest.update(chunk)
                    out.write(chunk)
            if self._closed:
                raise _ended()
            looks_right = IMAGE_TYPES.get(mime_type)
            if looks_right is not None and not looks_right(head):
                raise FileError(400, "INVALID_REQUEST", f"the body is not a {mime_type} image")
        except BaseException:
            self._release(size)
            self._discard(transfer_id)
            self._count("upload", "refused")
            raise
        self._count("upload", "stored")
        return self._index(transfer_id, file_name, mime_type, size, digest.hexdigest(), None)

    def _index(
        self,
        transfer_id: str,
        file_name: str,
        mime_type: str,
        size: int,
        sha256: str,
        workspace_relative_path: str | None,
    ) -> ev.StoredFile:
        stored = ev.StoredFile(
            transfer_id=transfer_id,
            file_url=self._url_of(transfer_id, self._path / transfer_id),
            file_name=file_name,
            mime_type=mime_type,
            size_bytes=size,
            checksum=f"sha256:{sha256}",
            workspace_relative_path=workspace_relative_path,
        )
        self.files[transfer_id] = stored
        if self._saved:
            self._save_index()
        return stored

    def _save_index(self) -> None:
        data = msgspec.json.encode(list(self.files.values()))
        nofollow.replace_file(self._directory(), _INDEX, data, fsync=False)

    def restore(self) -> int:
        """Read back the files a saved session had (its ``index.json``, at most
        ``MAX_INDEX_BYTES``): each that is still there as a regular file of its size is served
        again. Returns how many."""
        if not self._saved:
            return 0
        try:
            self._dir_fd = nofollow.open_dir(self._name, dir_fd=self._parent_fd)
            saved = _index_decoder.decode(nofollow.read_file(self._dir_fd, _INDEX, MAX_INDEX_BYTES))
        except FileNotFoundError:
            return 0  # the session never stored a file
        except (OSError, msgspec.DecodeError, msgspec.ValidationError) as err:
            # The bytes stay on disk for a person to look at; the history's file_urls are 404.
            log.warning(
                "saved files skipped: %s is unusable: %s",
                _INDEX,
                getattr(err, "strerror", None) or err,
                extra={"session": self.session_id},
            )
            return 0
        for stored in saved:
            if (
                self._usable(stored)
                and self.used_bytes + stored.size_bytes <= self.max_session_bytes
            ):
                self.used_bytes += stored.size_bytes
                if self._metrics is not None:
                    self._metrics.file_bytes(stored.size_bytes)
                self.files[stored.transfer_id] = stored
            else:
                log.warning(
                    "saved file skipped: %s is missing, cut short, not a regular file or past "
                    "the session's bound",
                    stored.transfer_id[:64],
                    extra={"session": self.session_id},
                )
        return len(self.files)

    def _usable(self, stored: ev.StoredFile) -> bool:
        """A saved file named by its transfer id (nothing else: it becomes a name in our
        directory), there as a regular file of its recorded size."""
        try:
            if str(uuid.UUID(stored.transfer_id)) != stored.transfer_id:
                return False
            st = os.stat(stored.transfer_id, dir_fd=self._dir_fd, follow_symlinks=False)
        except (OSError, ValueError):
            return False
        return stat.S_ISREG(st.st_mode) and st.st_size == stored.size_bytes

    # --- reading -------------------------------------------------------------------------------------

    def get(self, transfer_id: str) -> tuple[ev.StoredFile, Path]:
        """The file and where its bytes are; ``FileError`` 404 ``TRANSFER_NOT_FOUND`` if there is no
        such file (or the session has ended)."""
        stored = self.files.get(transfer_id)
        if stored is None or self._dir_fd < 0:
            raise FileError(404, "TRANSFER_NOT_FOUND", f"no file {transfer_id!r} in this session")
        return stored, self._path / transfer_id

    def open(self, transfer_id: str) -> tuple[ev.StoredFile, int]:
        """The file and a descriptor to read it (the caller closes it); 404 as ``get``, and also
        when what is there now is not the regular file of its size that was stored."""
        stored, _ = self.get(transfer_id)
        try:
            fd = os.open(transfer_id, nofollow.READ_FLAGS, dir_fd=self._dir_fd)
            st = nofollow.regular_fd(fd, transfer_id)
        except OSError:
            raise FileError(404, "TRANSFER_NOT_FOUND", f"file {transfer_id!r} is gone") from None
        if st.st_size != stored.size_bytes:
            os.close(fd)
            raise FileError(404, "TRANSFER_NOT_FOUND", f"file {transfer_id!r} changed on disk")
        return stored, fd

    def read(self, transfer_id: str) -> bytes:
        stored, fd = self.open(transfer_id)
        with open(fd, "rb") as f:
            return f.read(stored.size_bytes)

    def copy_to(self, transfer_id: str, directory_fd: int, name: str) -> None:
        """Write the file as ``name`` in the directory ``directory_fd``: a new temporary file
        (``O_EXCL``, never one an agent planted) renamed over the name, so a link there (hard or
        symbolic) is replaced, never written through."""
        check_file_name(name)
        _, source = self.open(transfer_id)
        tmp = f".rawp-upload-{uuid.uuid4().hex}.tmp"
        with open(source, "rb") as src:
            try:
                with open(nofollow.create_fd(directory_fd, tmp, 0o644), "wb") as out:
                    shutil.copyfileobj(src, out, _CHUNK)
                os.replace(tmp, name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp, dir_fd=directory_fd)
                raise

    # --- the end -------------------------------------------------------------------------------------

    def release(self) -> None:
        """The gateway stops and the session lives on: the descriptors go, the files stay."""
        self._closed = True
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
        if self._owns_parent and self._parent_fd >= 0:
            os.close(self._parent_fd)
        self._dir_fd = self._parent_fd = -1

    def close(self) -> None:
        """The session ended: every file is deleted, and later lookups are 404."""
        if self._closed:
            return
        self.files.clear()
        self._release(self.used_bytes)
        if self._dir_fd >= 0:
            os.close(self._dir_fd)
            self._dir_fd = -1
        if self._parent_fd >= 0:  # the directory was made, or is a saved session's
            nofollow.remove_tree(self._parent_fd, self._name)
        self.release()


# --- the step between the parser and the session machine ---------------------------------------------


_TOOL_RESULT: Final = ev.ToolResult


def store_tool_files(
    events: list[ev.AgentEvent], store: FileStore, workspace: Path | None
) -> list[ev.AgentEvent]:
    """``events`` with the binary content of tool results stored in ``store`` (see the module
    docstring). The list is changed in place and returned; events without binary content are the
    same objects."""
    for event in events:  # the hot path: almost every line has no binary content
        if type(event) is _TOOL_RESULT and event.binary:  # type: ignore[attr-defined]
            break
    else:
        return events
    for i, event in enumerate(events):
        if type(event) is not ev.ToolResult or not event.binary:
            continue
        stored: list[ev.StoredFile] = []
        notes: list[str] = []
        for n, binary in enumerate(event.binary):
            mime = _mime_or_default(binary.mime_type)
            name = _name_for(binary, mime, event.tool_name, n)
            try:
                data = base64.b64decode(binary.data, validate=True)
                stored.append(
                    store.put(
                        data,
                        file_name=name,
                        mime_type=mime,
                        workspace_relative_path=_relative(binary.path, workspace),
                    )
                )
            except (binascii.Error, ValueError) as err:
                notes.append(f"[{mime} {name}: not relayed, not valid base64: {err}]")
            except FileError as err:
                notes.append(f"[{mime} {name}: not relayed: {err.message}]")
            except OSError as err:
                notes.append(f"[{mime} {name}: not relayed: {err.strerror}]")
        if notes:
            log.warning("tool output not stored", extra={"session": store.session_id, "why": notes})
        output = event.output
        if notes:
            text = output if isinstance(output, str) else ""
            output = "\n".join([text, *notes] if text else notes)
        events[i] = msgspec.structs.replace(event, binary=[], files=stored, output=output)
    return events


def _mime_or_default(value: str) -> str:
    try:
        return check_mime_type(value)
    except FileError:
        return OCTET_STREAM


def _name_for(binary: ev.BinaryData, mime: str, tool: str | None, n: int) -> str:
    """The file's own base name when the tool read a file, else ``<tool>-<n><ext>``."""
    if binary.path:
        name = PurePosixPath(binary.path).name
        try:
            return check_file_name(name)
        except FileError:
            pass
    extension = mimetypes.guess_extension(mime) or ".bin"
    return f"{tool or 'output'}-{n + 1}{extension}"


def _relative(path: str | None, workspace: Path | None) -> str | None:
    """``path`` relative to the workspace when it is inside it (``context.workspace_relative_path``)."""
    if not path or workspace is None:
        return None
    if not PurePosixPath(path).is_absolute():
        parts = PurePosixPath(path).parts
        return None if ".." in parts else PurePosixPath(path).as_posix()
    try:
        return PurePosixPath(path).relative_to(PurePosixPath(str(workspace))).as_posix()
    except ValueError:
        return None
