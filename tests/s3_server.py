"""A local S3 server for the object-storage tests: moto's (`pip install 'moto[server]'`), in a subprocess.

There is no network in CI beyond package registries, so `s3://` inputs are tested against this server
through the environment a real deployment would use (AWS_ENDPOINT_URL and the AWS_* credentials).
"""

from __future__ import annotations

import importlib.util
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

HAS_MOTO = importlib.util.find_spec("moto") is not None and importlib.util.find_spec("flask") is not None
NO_MOTO = "moto[server] is not installed: pip install 'moto[server]' for the s3:// input tests"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env(endpoint: str) -> dict[str, str]:
    """What a process needs to reach the server (moto accepts any credentials)."""
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint, "AWS_EC2_METADATA_DISABLED": "true"}


@contextmanager
def s3_server() -> Iterator[str]:
    """Start moto's S3 server on a free port; yields its endpoint URL; stops it after."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("moto_server did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def upload(endpoint: str, bucket: str, files: dict[str, Path]) -> None:
    """Create `bucket` and put each local file at its key."""
    import pyarrow.fs as pafs

    host = endpoint.split("://", 1)[1]
    s3 = pafs.S3FileSystem(endpoint_override=host, scheme="http", access_key="testing", secret_key="testing",
                           region="us-east-1", allow_bucket_creation=True)
    s3.create_dir(bucket)
    for key, path in files.items():
        with s3.open_output_stream(f"{bucket}/{key}", compression=None) as f:  # the bytes as given
            f.write(path.read_bytes())
