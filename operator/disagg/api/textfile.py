"""Reading the user's text files (manifests, policies, traces) with one clear line for what is wrong.

``Path.read_text`` raises a bare ``UnicodeDecodeError`` (a ValueError that names no file) on a binary
or Latin-1 file; the command lines catch :class:`TextFileError` and print its message, never a traceback.
"""

from __future__ import annotations

from pathlib import Path

# The largest manifest worth reading: a Kubernetes object must fit one etcd request, 1.5 MiB by default
# (etcd --max-request-bytes, https://etcd.io/docs/v3.5/dev-guide/limit/); a file of manifests may hold a
# few. Traces are not capped.
MAX_MANIFEST_BYTES = 8 * 1024 * 1024


class TextFileError(ValueError):
    """A file that can't be read as UTF-8 text; the message names it and says why, in one line."""


def decode_text(data: bytes, source: str) -> str:
    """``data`` as UTF-8 (a BOM dropped); TextFileError naming ``source``, the byte and its offset."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        byte = data[error.start]
        raise TextFileError(
            f"{source} is not UTF-8 text (byte 0x{byte:02x} at offset {error.start}): save it as UTF-8"
        ) from error


def read_text(path: str | Path, max_bytes: int | None = None) -> str:
    """The file's text; TextFileError when it can't be read, is too large or is not UTF-8."""
    source = str(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
    except OSError as error:
        raise TextFileError(f"cannot read {source}: {error.strerror or error}") from error
    if max_bytes is not None and len(data) > max_bytes:
        raise TextFileError(f"{source} is larger than {max_bytes // (1024 * 1024)} MiB: not a manifest")
    return decode_text(data, source)
