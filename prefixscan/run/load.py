"""A run directory opened for reading: the typed `Run` every command after `analyze` works on.

`Run.open(path, simulation=NAME)` reads and checks the manifest once and gives its sections as typed
objects, each parsed from what its producer writes: `analysis` (prefixscan.pipeline.write: the request
counts, hit rates, notes and summary), `sim` (the chosen stored simulation, prefixscan.run.simstore:
its config, workload and per-policy metrics), `estimate` (estimate.json, prefixscan.cost.saved) and
`findings` (prefixscan.detect). Tables load on first use; `sim_*` tables come from the chosen simulation
only. The chosen simulation travels with the Run (there is no global): a library function given a Run
uses the one it was opened with. This module is the bottom of the layering: it imports no reporter,
command or pipeline stage (prefixscan.run.rundir, which writes runs, builds on it).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prefixscan.errors import RunDirError
from prefixscan.run.atomic import env_error
from prefixscan.run.modes import MANIFEST_KEY, parse_mode
from prefixscan.run.simindex import selected_view, table_dir

MANIFEST = "manifest.json"
ESTIMATE_FILE = "estimate.json"


def redo(run: str | os.PathLike[str]) -> str:
    """The fix every damaged-run error ends with."""
    return f"re-create it with `prefixscan analyze LOGS -o {run} --force`"


def read_manifest(run: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a run's manifest, with a clear error when the directory is not a run or the file is damaged."""
    path = Path(run) / MANIFEST
    if not path.exists():
        raise RunDirError(f"{run} is not a prefixscan run directory (no {MANIFEST}); "
                          f"create one with `prefixscan analyze LOGS -o {run}`")
    try:
        doc = json.loads(path.read_bytes())
    except OSError as exc:
        raise env_error(exc, path) from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise RunDirError(f"{path} is damaged ({str(exc).splitlines()[0][:80]}); {redo(run)}") from None
    if not isinstance(doc, dict):
        raise RunDirError(f"{path} is damaged (not a JSON object); {redo(run)}")
    _check_manifest(doc, path, run)
    return doc


# The types of what readers take from a manifest (a key may be absent): a value of another type is a damaged
# (or crafted) run, refused in one line before any command uses it. Nested: (type, {key: type or spec}).
_SUMMARY = {k: dict for k in ("actual_vs_predicted", "by_hit_source", "by_model", "by_prefix_class", "by_tenant",
                              "by_turn", "capacity", "conversations", "counterfactual", "cross_tenant", "hit_rate",
                              "input", "miss_attribution", "requests", "reuse", "reuse_gap_s", "tokens")}
_SCHEMA: dict[str, Any] = {
    "analyze": (dict, {"hit_rate": dict, "requests": (dict, {"rejects_by_reason": dict}), "timings": dict,
                       "notes": list, "summary": (dict, {**_SUMMARY, "findings": list, "notes": list,
                                                         "top_prefixes": list})}),
    "command_line": str, "file_mode": str,
    "config": (dict, {"block_size": int, "hit_rule": str, "tokenizer": str, "granularity": str,
                      "isolate_tenants": bool, "inputs": list, "command_line": str}),
    "format_version": int, "inputs": list,
    "tables": dict, "tool": str, "version": str, "simulate": dict, "simulations": dict, "findings": dict,
    "project_config": dict,
}
_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", bool: "true or false"}


def _check_types(doc: dict[str, Any], schema: dict[str, Any], at: str) -> str | None:
    for key, spec in schema.items():
        if key not in doc or doc[key] is None:
            continue
        kind, inner = spec if isinstance(spec, tuple) else (spec, None)
        value = doc[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            return f"{at}{key} is not {_TYPE_NAMES[kind]}"
        if inner is not None:
            bad = _check_types(value, inner, f"{at}{key}.")
            if bad:
                return bad
    return None


def _check_manifest(doc: dict[str, Any], path: Path, run: str | os.PathLike[str]) -> None:
    """Refuse a manifest whose values a reader would misuse: wrong types, table names that are not plain
    names, a file mode beyond read/write bits; simulations are checked by prefixscan.run.simindex."""
    why = _check_types(doc, _SCHEMA, "")
    if why is None and not all(isinstance(t, str) and PLAIN_TABLE.fullmatch(t) and isinstance(v, dict)
                               for t, v in doc.get("tables", {}).items()):
        why = "tables must map plain table names to objects"
    if why is None and doc.get(MANIFEST_KEY) is not None and parse_mode(doc[MANIFEST_KEY]) is None:
        why = f"{MANIFEST_KEY} {str(doc[MANIFEST_KEY])[:12]!r} is not a file mode within 0666"
    if why is not None:
        raise RunDirError(f"run directory damaged: {path}: {why}; {redo(run)}")


PLAIN_TABLE = re.compile(r"[a-z][a-z0-9_]{0,63}")  # a run's table names (query registers them as relations)


def read_table_file(path: Path, run: str | os.PathLike[str], **kwargs: Any) -> pa.Table:
    """A run's Parquet table, or a one-line RunDirError when it is truncated or not Parquet."""
    return _parquet(pq.read_table, path, run, page_checksum_verification=True, **kwargs)


def read_schema_file(path: Path, run: str | os.PathLike[str]) -> pa.Schema:
    """A run's Parquet table's schema (its footer), or a one-line RunDirError when the file is empty or not
    Parquet."""
    return _parquet(pq.read_schema, path, run)


def _parquet(read: Any, path: Path, run: str | os.PathLike[str], **kwargs: Any) -> Any:
    """`read(path)`; an OS error is the environment's (env_error), anything Arrow cannot read a damaged run."""
    try:
        return read(path, **kwargs)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        if isinstance(exc, OSError) and exc.errno is not None:
            raise env_error(exc, path) from None
        raise RunDirError(f"{path} is damaged ({str(exc).splitlines()[0][:100]}); {redo(run)}") from None


def _same_kind(want: pa.DataType, got: pa.DataType) -> bool:
    """Whether a column of type `got` can stand for the schema's `want` (widths and string kinds may vary)."""
    if pa.types.is_null(got):
        return True  # a column that is null throughout
    if pa.types.is_list(want):
        return bool((pa.types.is_list(got) or pa.types.is_large_list(got)) and pa.types.is_integer(got.value_type))
    if pa.types.is_integer(want):
        return bool(pa.types.is_integer(got))
    if pa.types.is_floating(want):
        return bool(pa.types.is_floating(got) or pa.types.is_integer(got))
    if pa.types.is_string(want):
        return bool(pa.types.is_string(got) or pa.types.is_large_string(got) or (
            pa.types.is_dictionary(got) and pa.types.is_string(got.value_type)))
    if pa.types.is_boolean(want):
        return bool(pa.types.is_boolean(got))
    return True


def check_requests_schema(schema: pa.Schema, path: Path, run: str | os.PathLike[str]) -> None:
    """A requests table every reader can use: the columns a replay needs, and each known column of its
    documented kind (prefixscan.schema); anything else is a damaged run (RunDirError, exit 5)."""
    from prefixscan.schema import REPLAY_COLUMNS, REQUESTS_SCHEMA

    lacking = [c for c in REPLAY_COLUMNS if c not in schema.names]
    if lacking:
        raise RunDirError(f"run directory damaged: {path} lacks column(s) {', '.join(lacking)} (not a requests "
                          f"table); {redo(run)}")
    for f in schema:
        i = REQUESTS_SCHEMA.get_field_index(f.name)
        if i >= 0 and not _same_kind(REQUESTS_SCHEMA.field(i).type, f.type):
            raise RunDirError(f"run directory damaged: {path}: column {f.name} is {f.type}, expected "
                              f"{REQUESTS_SCHEMA.field(i).type}; {redo(run)}")


def _int(x: Any) -> int | None:
    return None if x is None else int(x)


@dataclass(frozen=True)
class RequestCounts:
    """What analyze read: read = accepted + rejected, and the rejects by reason (None: not recorded)."""

    read: int | None = None
    accepted: int | None = None
    rejected: int | None = None
    rejects_by_reason: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Analysis:
    """The manifest's `analyze` section (written by prefixscan.pipeline.write): typed where commands read
    it; `summary` is the summary JSON (`analyze --json`) as stored."""

    requests: RequestCounts = field(default_factory=RequestCounts)
    hit_rate: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    summary: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, section: dict[str, Any] | None) -> Analysis:
        sec = section or {}
        req = sec.get("requests") or {}
        counts = RequestCounts(_int(req.get("read")), _int(req.get("accepted")), _int(req.get("rejected")),
                               dict(req.get("rejects_by_reason") or {}))
        return cls(counts, dict(sec.get("hit_rate") or {}), tuple(sec.get("notes") or ()),
                   dict(sec.get("summary") or {}))

    @property
    def tenant_isolated_hit_rate(self) -> float | None:
        """Token-weighted hit rate with every tenant's hashes salted apart."""
        rate = self.hit_rate.get("tenant_isolated_token_weighted")
        return None if rate is None else float(rate)

    @property
    def exact_capacity(self) -> dict[str, int]:
        """LRU capacities (tokens) that reach 50% / 90% of the ideal hit rate, by summary key."""
        return dict(self.summary.get("capacity") or {})


@dataclass(frozen=True)
class Simulation:
    """The chosen stored simulation (prefixscan.run.simstore's index entry, written by `simulate`): the
    fields the report and estimate read, typed; `config`, `workload` and `policies` as stored."""

    name: str
    replicas: int | None
    decode_replicas: int | None
    model: str | None
    gpu: str | None
    dtype: str | None
    knowledge: str | None
    kv_blocks_per_replica: int | None
    block_size: int | None
    unbounded_kv: bool | None
    prefill_model: str | None
    policies: dict[str, dict[str, Any]]
    config: dict[str, Any]
    workload: dict[str, Any]

    @classmethod
    def parse(cls, name: str, section: dict[str, Any]) -> Simulation:
        cfg, wl = dict(section.get("config") or {}), dict(section.get("workload") or {})
        pols = {p: m for p, m in (section.get("policies") or {}).items() if isinstance(m, dict)}
        return cls(name, cfg.get("replicas"), cfg.get("decode_replicas") or None, cfg.get("model"), cfg.get("gpu"),
                   cfg.get("dtype"), cfg.get("knowledge"), wl.get("kv_blocks_per_replica"), wl.get("block_size"),
                   wl.get("unbounded_kv"), wl.get("prefill_model"), pols, cfg, wl)

    @property
    def own_name(self) -> bool:
        """Stored under a name of its own (not `default`): reports name it."""
        return self.name != "default"


@dataclass(frozen=True)
class SavedEstimate:
    """estimate.json (written by prefixscan.cost.saved): the last estimate's result and how it was made."""

    result: dict[str, Any]
    command_line: str
    run_fingerprint: str | None
    document: dict[str, Any]

    @property
    def scenario(self) -> dict[str, Any] | None:
        return self.result.get("scenario") or None


@dataclass(frozen=True)
class FindingsRun:
    """The manifest's `findings` section, when `prefixscan findings` re-ran the detector on the run."""

    command_line: str | None
    config: dict[str, Any]


def read_estimate(run_dir: str | os.PathLike[str]) -> SavedEstimate | None:
    """The run's estimate.json, or None when it has none; unreadable or not an estimate: RunDirError."""
    path = Path(run_dir) / ESTIMATE_FILE
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{path} is unreadable ({exc}); re-run `prefixscan estimate {run_dir}`") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("result"), dict):
        raise RunDirError(f"{path} is not a saved estimate; re-run `prefixscan estimate {run_dir}`")
    return SavedEstimate(doc["result"], str(doc.get("command_line") or ""), doc.get("run_fingerprint"), doc)


@dataclass(frozen=True)
class Run:
    """A run directory opened for reading (`Run.open`); tables load on first use. `sim_*` tables come from
    the chosen simulation only (`simulation`, its tables under `sim_dir`; prefixscan.run.simindex): never a
    stray file. `manifest` is the manifest with `simulate` = the chosen simulation's section."""

    path: Path
    manifest: dict[str, Any]
    sim_dir: str = ""
    simulation: str | None = None
    named: bool = False  # the caller named the simulation (a report then shows its own results)
    _cache: dict[str, pa.Table] = field(default_factory=dict, repr=False, compare=False)
    _checked: set[str] = field(default_factory=set, repr=False, compare=False)

    @classmethod
    def open(cls, path: str | os.PathLike[str] | Run, simulation: str | None = None) -> Run:
        """Open a run directory written by `prefixscan analyze`. `simulation` picks a named simulation
        (default: `default`, else the most recent; an unknown name is a UsageError listing the stored ones).
        Given a Run (and no other simulation), returns it: the simulation a caller chose travels with it."""
        if isinstance(path, Run):
            if simulation is None or (simulation == path.simulation and path.named):
                return path
            if simulation == path.simulation:
                return replace(path, named=True)  # the same tables (and cache), now named by the caller
            path = path.path
        manifest, sim_dir, chosen = selected_view(read_manifest(path), simulation, path)
        return cls(Path(path), manifest, sim_dir=sim_dir, simulation=chosen, named=simulation is not None)

    def __fspath__(self) -> str:
        """A Run stands for its directory wherever a path is taken; handed on (say to the estimator), it
        keeps the simulation it was opened with, since `Run.open` returns it as it is."""
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    @cached_property
    def analysis(self) -> Analysis:
        """What analyze recorded (request counts, hit rates, notes, summary)."""
        return Analysis.parse(self.manifest.get("analyze"))

    @cached_property
    def sim(self) -> Simulation | None:
        """The chosen simulation's section; None when the run has no stored simulation."""
        if self.simulation is None:
            return None
        return Simulation.parse(self.simulation, self.manifest.get("simulate") or {})

    @cached_property
    def estimate(self) -> SavedEstimate | None:
        """The saved estimate (estimate.json), if `prefixscan estimate` saved one."""
        return read_estimate(self.path)

    @cached_property
    def findings(self) -> FindingsRun | None:
        """The `prefixscan findings` re-run recorded in the manifest, if any."""
        sec = self.manifest.get("findings")
        if not isinstance(sec, dict):
            return None
        return FindingsRun(sec.get("command_line"), dict(sec.get("config") or {}))

    @property
    def config(self) -> dict[str, Any]:
        """The analysis settings (tokenizer, block_size, hit_rule, granularity, ...), as recorded."""
        return self.manifest.get("config") or {}

    def tables(self) -> list[str]:
        """The run's own tables and the chosen simulation's."""
        own = [p.stem for p in self.path.glob("*.parquet") if not p.stem.startswith("sim_")]
        return sorted({*own, *self.sim_tables()})

    def sim_tables(self) -> list[str]:
        """The chosen simulation's tables present on disk (none when no simulation is stored)."""
        if self.simulation is None:
            return []
        return sorted(p.stem for p in table_dir(self.path, self.sim_dir).glob("sim_*.parquet"))

    def file(self, name: str) -> Path | None:
        """Where table `name` lives (the chosen simulation's directory for `sim_*`); None: it cannot exist."""
        if name.startswith("sim_"):
            if self.simulation is None:
                return None
            return table_dir(self.path, self.sim_dir) / f"{name}.parquet"
        return self.path / f"{name}.parquet"

    def has(self, name: str) -> bool:
        p = self.file(name)
        return p is not None and p.exists()

    def checked_file(self, name: str) -> Path:
        """The file of table `name`, its footer read (and the requests table's columns checked): for
        readers that read a few columns themselves. A damaged file is a one-line RunDirError."""
        p = self.file(name)
        if p is not None and not p.parent.exists() and self.sim_dir:
            raise RunDirError(f"simulation {self.simulation!r} of run {self.path} was replaced while this command "
                              "read it (another prefixscan simulate); run the command again")
        if p is None or not p.exists():
            raise RunDirError(f"run {self.path} has no table {name!r} (tables: {', '.join(self.tables())})")
        if name not in self._checked:
            schema = read_schema_file(p, self.path)
            if name == "requests":
                check_requests_schema(schema, p, self.path)
            self._checked.add(name)
        return p

    def table(self, name: str) -> pa.Table:
        if name not in self._cache:
            self._cache[name] = read_table_file(self.checked_file(name), self.path)
        return self._cache[name]


def load_run(path: str | os.PathLike[str] | Run, simulation: str | None = None) -> Run:
    """`Run.open`: open a run directory (the named simulation's `sim_*` tables; default as `Run.open`)."""
    return Run.open(path, simulation)

