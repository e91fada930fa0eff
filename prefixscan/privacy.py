"""What of the customer's text and names may leave a run: the k-sharers rule and keyed tenant hashes.

A text may be shown (redacted) only when at least k distinct conversations share it: a system prompt or a
template line qualifies, one customer's name does not. Who shares is counted by conversation id, else by
user, else by tenant; a request with none of them counts for nobody, so a log without ids shows no text.
Tenant (and user) names are replaced, with `--hash-tenants`, by an HMAC-SHA256 under a key the user gives
or a random one per run; the key is never written anywhere.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # polars is imported where used: the CLI imports this module for `scrub_argv`
    import polars as pl

DEFAULT_SNIPPET_K = 5
TENANT_KEY_ENV = "PREFIXSCAN_TENANT_KEY"
_KEY_OPTION = re.compile(r"(--tenant-key)(=|\s+)('[^']*'|\S+)")


def sharer_key() -> pl.Expr:
    """Who a request belongs to, for counting sharers: its conversation, else its user, else its tenant."""
    import polars as pl

    return pl.coalesce(pl.lit("c:") + pl.col("conversation_id"), pl.lit("u:") + pl.col("user"),
                       pl.lit("t:") + pl.col("tenant"))


def sharer_keys(frame: pl.DataFrame) -> pl.Series:
    """`sharer_key()` per row of a frame that may lack some of the identity columns (they count as absent)."""
    import polars as pl

    missing = [c for c in ("conversation_id", "user", "tenant") if c not in frame.columns]
    if missing:
        frame = frame.with_columns(*[pl.lit(None, dtype=pl.String).alias(c) for c in missing])
    return frame.select(sharer_key().alias("_who"))["_who"]


def count_sharers(keys: Iterable[str | None]) -> int:
    """Distinct known owners among some requests' sharer keys."""
    return len({k for k in keys if k is not None})


def resolve_tenant_key(given: str | None) -> str:
    """The HMAC key of this run: the user's (`--tenant-key`, else $PREFIXSCAN_TENANT_KEY), else random.
    A random key makes hashes unlinkable across runs (and changes them on every run); give a key to join
    runs on hashed tenants."""
    return given or os.environ.get(TENANT_KEY_ENV) or secrets.token_hex(32)


def tenant_hasher(key: str) -> Callable[[str | None], str | None]:
    """name -> `t-` + the first 16 hex digits of HMAC-SHA256(key, name); None stays None. Without the key,
    a guessed name cannot be checked against a hash (a bare hash of the name could)."""
    k = key.encode("utf-8", "surrogatepass")

    def digest(name: str | None) -> str | None:
        if name is None:
            return None
        return "t-" + hmac.new(k, name.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:16]

    return digest


def scrub_argv(argv: list[str]) -> list[str]:
    """Arguments with any `--tenant-key` value masked, fit for the manifest's command line."""
    out: list[str] = []
    for i, a in enumerate(argv):
        if i and argv[i - 1] == "--tenant-key":
            out.append("***")
        else:
            out.append("--tenant-key=***" if a.startswith("--tenant-key=") else a)
    return out


def scrub_command_line(command_line: str) -> str:
    """A joined command line with any `--tenant-key` value masked (the CLI scrubs its argv first)."""
    return _KEY_OPTION.sub(r"\1\2***", command_line)
