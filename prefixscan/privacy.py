"""What of the customer's text and names may leave a run: the k-sharers rule and keyed tenant hashes.

A text may be shown (redacted) only when at least k independent sources share it: a system prompt or a
template line qualifies, one customer's name does not, however many requests or conversations repeat it.
Sources are distinct users where the log names them; without a user, requests of different tenants or
with different surroundings (what follows the text, the prompt's length); one conversation is always one
source (`independent_sources`, `may_show`).
Tenant (and user) names are replaced, with `--hash-tenants`, by an HMAC-SHA256 under a key the user gives
or a random one per run; the key is never written anywhere.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # polars is imported where used: the CLI imports this module for `scrub_argv`
    import polars as pl

    from prefixscan.config import AnalyzeConfig

DEFAULT_SNIPPET_K = 5
TENANT_KEY_ENV = "PREFIXSCAN_TENANT_KEY"
_KEY_OPTION = re.compile(r"(--tenant-key)(=|\s+)('[^']*'|\S+)")


IDENTITY_COLUMNS = ("user", "tenant", "conversation_id")
LENGTH_SLACK = 2  # tokens: prompts this close in length are the same surroundings (a clock, a counter grows)


def independent_sources(rows: pl.DataFrame, group: str) -> dict[Any, int]:
    """Per value of `group`, how many independent sources its rows (requests) come from.

    A conversation id does not make a source: one customer opens many conversations, and a log without
    ids gets one inferred conversation per single-turn request. So two rows are the same source when
    they have the same user (a person), or, with no user, the same tenant and the same surroundings of
    the text in that request (`context`: what follows it; `length`: the prompt's length in tokens, where
    lengths within LENGTH_SLACK of each other are the same, so a value one token longer is no new
    source), or the same conversation (its turns are one source however they differ). Sources are the
    connected groups of rows under those links. A row with no user and no context (null) vouches for
    nobody. `rows` columns: `group`, `context`, and any of `length`, user, tenant, conversation_id
    (missing ones count as absent).
    """
    import polars as pl

    rows = rows.with_columns(*[pl.lit(None, dtype=pl.String).alias(c) for c in IDENTITY_COLUMNS
                               if c not in rows.columns])
    if "length" not in rows.columns:
        rows = rows.with_columns(pl.lit(None, dtype=pl.Int64).alias("length"))
    base = pl.when(pl.col("context").is_not_null()).then(
        pl.lit("x\x00") + pl.col("tenant").cast(pl.String).fill_null("") + pl.lit("\x00")
        + pl.col("context").cast(pl.String))
    df = rows.select(pl.col(group).alias("_g"), pl.col("user").cast(pl.String), base.alias("_base"),
                     pl.col("length").cast(pl.Int64), pl.col("conversation_id").cast(pl.String))
    # lengths cluster within (group, base): sorted, a gap wider than the slack starts another cluster
    df = df.sort("_g", "_base", "length", nulls_last=True).with_columns(
        (pl.col("length").diff().over("_g", "_base").fill_null(0) > LENGTH_SLACK).cast(pl.Int64)
        .cum_sum().over("_g", "_base").alias("_cluster"))
    who = pl.when(pl.col("user").is_not_null()).then(pl.lit("u\x00") + pl.col("user")).otherwise(
        pl.col("_base") + pl.lit("\x00") + pl.col("_cluster").cast(pl.String))
    df = (df.select("_g", who.alias("_who"), "conversation_id")
          .filter(pl.col("_who").is_not_null()).with_row_index("_lab"))
    if df.height == 0:
        return {}
    conv = df["conversation_id"].is_not_null()
    while True:  # labels only fall: each round spreads the least label over shared keys until none moves
        lab = df.select(pl.col("_lab").min().over("_g", "_who"))["_lab"]
        by_conv = df.with_columns(lab.alias("_lab")).select(
            pl.when(conv).then(pl.col("_lab").min().over("_g", "conversation_id")).otherwise(pl.col("_lab")))
        lab = by_conv.to_series()
        if lab.equals(df["_lab"]):
            break
        df = df.with_columns(lab.alias("_lab"))
    g = df.group_by("_g").agg(pl.col("_lab").n_unique().alias("n"))
    return dict(zip(g["_g"].to_list(), g["n"].to_list(), strict=True))


def may_show(sources: int, k: int) -> bool:
    """The privacy rule in one place: text may be shown (redacted) when at least `k` independent sources
    (`independent_sources`) share it."""
    return sources >= k


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
    return ["***" if i and argv[i - 1] == "--tenant-key" else "--tenant-key=***" if a.startswith("--tenant-key=")
            else a for i, a in enumerate(argv)]


def scrub_command_line(command_line: str) -> str:
    """A joined command line with any `--tenant-key` value masked (the CLI scrubs its argv first)."""
    return _KEY_OPTION.sub(r"\1\2***", command_line)


def identity_hasher(cfg: AnalyzeConfig) -> Callable[[str | None], str | None] | None:
    """The keyed hash `--hash-tenants` applies to tenant and user names (None: names are kept). The run
    resolves its key once (`pipeline.run.run_analysis`), so every chunk and the findings hash alike."""
    if not cfg.hash_tenants:
        return None
    if not cfg.tenant_key:
        raise ValueError("hash_tenants needs the run's tenant_key (resolved by run_analysis)")
    return tenant_hasher(cfg.tenant_key)
