"""Inputs in object storage: `s3://bucket/key` (and any URI pyarrow's file systems understand), read
through `pyarrow.fs` without a local copy.

Credentials and endpoint come from the usual environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_DEFAULT_REGION, AWS_ENDPOINT_URL for an S3-compatible server such as MinIO). Every failure to reach
or list the store is an InputError naming the URI and the store's own first line of explanation.
"""

from __future__ import annotations

from typing import Any

from prefixscan.errors import InputError

SCHEMES = ("s3://", "gs://", "gcs://", "hdfs://", "viewfs://", "abfs://", "abfss://")


def is_uri(path: object) -> bool:
    """Whether an input names an object in a store (not a local path)."""
    return isinstance(path, str) and path.lower().startswith(SCHEMES)


def _fail(uri: str, exc: BaseException) -> InputError:
    why = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    return InputError(f"cannot read input {uri}: {why}; check the URI, the credentials and AWS_ENDPOINT_URL")


def _fs(uri: str) -> tuple[Any, str]:
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(uri)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise _fail(uri, exc) from None


def list_uri(uri: str, suffixes: tuple[str, ...]) -> list[tuple[str, int]]:
    """(URI, size) of the object `uri`, or of every object under it with one of `suffixes` (a prefix is
    walked as a directory), sorted."""
    import pyarrow.fs as pafs

    fs, path = _fs(uri)
    try:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            return [(uri, int(info.size))]
        if info.type == pafs.FileType.NotFound:
            raise InputError(f"input {uri!r} does not exist; check the bucket and key")
        found = fs.get_file_info(pafs.FileSelector(path.rstrip("/"), recursive=True))
    except OSError as exc:
        raise _fail(uri, exc) from None
    scheme = uri[: uri.index("://") + 3]
    out = sorted((scheme + f.path, int(f.size)) for f in found
                 if f.type == pafs.FileType.File and f.path.lower().endswith(suffixes))
    if not out:
        raise InputError(f"{uri!r} holds no .jsonl, .jsonl.gz or .parquet objects")
    return out


def open_random(uri: str) -> Any:
    """A seekable binary file of the object, as stored (pyarrow's `open_input_stream` would decompress by
    the name's suffix; the readers decide by the magic bytes, as for local files)."""
    fs, path = _fs(uri)
    try:
        return fs.open_input_file(path)
    except OSError as exc:
        raise _fail(uri, exc) from None
