"""`prefixscan.toml`: a project's analysis settings, so the same analysis runs every week with no flags
(docs/config.md): one table per command (`[analyze]`, `[simulate]`, ...) of option values by their Python
names, and a `[scenario]` shared by simulate, estimate and report.

Found first at `prefixscan --config FILE`; for `analyze`, beside the first log; for a command on a run
directory, in the settings `analyze` recorded there; else `./prefixscan.toml`. A flag always wins; unknown
keys and values of the wrong type are errors (a typo must not fall back to a default in silence). A file
that was found came with the data, not from the user: it may not set PROTECTED_KEYS (where output goes,
replacing, customer text, engines and hosts). What a file set is printed, for a found file even with --quiet.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prefixscan.errors import UsageError

FILENAME = "prefixscan.toml"
COMMANDS = ("analyze", "simulate", "estimate", "report")
SCENARIO_COMMANDS = ("simulate", "estimate", "report")


SECRET_KEYS = {"tenant_key"}
# What a found file may not set, with why: destinations, replacing, customer text, engines and hosts.
PROTECTED_KEYS = {
    "output": "chooses where output is written", "force": "replaces existing output",
    "include_text": "shows customer text", "snippet_k": "decides how much customer text is shown",
    "engine": "chooses an engine to run on", "ray_address": "names a host to connect to",
    "reuse_temp_dir": "names a directory to write to",
}
# Never taken from the settings a run recorded: a manifest may be crafted, and a protected key a run
# recorded came from a file given with --config then, which a later command must be given again.
NOT_RECORDED = set(PROTECTED_KEYS)


@dataclass(frozen=True)
class ProjectConfig:
    """The parsed file: one table per command, plus the shared scenario."""

    path: str
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    explicit: bool = False  # given with --config (else found: beside the logs, in a run, in the cwd)

    def for_command(self, command: str) -> dict[str, Any]:
        """Settings for one command: the scenario (where it applies), then the command's own table."""
        out = dict(self.sections.get("scenario", {})) if command in SCENARIO_COMMANDS else {}
        out.update(self.sections.get(command, {}))
        return out

    def to_json(self) -> dict[str, Any]:
        """What a run records: everything but secrets (the `--hash-tenants` key is never written)."""
        return {"path": self.path, "sections": {name: {k: v for k, v in table.items() if k not in SECRET_KEYS}
                                                for name, table in self.sections.items()}}


def parse(path: str | os.PathLike[str]) -> ProjectConfig:
    """Read and check a prefixscan.toml; a UsageError names the file, the line and what is wrong."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"config file {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read config file {p}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{p} is not valid TOML: {exc}") from None
    unknown = [k for k in data if k not in (*COMMANDS, "scenario")]
    if unknown:
        raise UsageError(f"{p}: unknown table(s) {', '.join(sorted(unknown))}; use [analyze], [scenario], "
                         "[simulate], [estimate], [report]")
    for name, table in data.items():
        if not isinstance(table, dict):
            raise UsageError(f"{p}: `{name}` must be a table ([{name}])")
    return ProjectConfig(str(p), {k: dict(v) for k, v in data.items()})


def locate(command: str, explicit: str | None, params: dict[str, Any]) -> ProjectConfig | None:
    """The config that applies to one invocation (see the module docstring for the order)."""
    if explicit:
        return replace(parse(explicit), explicit=True)
    if command == "analyze":
        logs = params.get("logs") or []
        first = Path(logs[0]) if logs else None
        if first is not None and not any(ch in str(first) for ch in "*?["):
            beside = (first if first.is_dir() else first.parent) / FILENAME
            if beside.is_file():
                return parse(beside)
    else:
        recorded = _recorded(params)
        if recorded is not None:
            return recorded
    here = Path(FILENAME)
    return parse(here) if here.is_file() else None


def _recorded(params: dict[str, Any]) -> ProjectConfig | None:
    """The settings the run's analyze recorded, when the command is given a run directory (a directory
    that is not a readable run has none: the command itself then says what is wrong with it)."""
    from prefixscan.errors import PrefixscanError
    from prefixscan.run.load import read_manifest

    cand = params.get("run_dir") or (params.get("inputs") or [None])[0]
    if not cand or not Path(cand).is_dir():
        return None
    try:
        pc = read_manifest(cand).get("project_config")
    except PrefixscanError:
        return None
    if not isinstance(pc, dict) or "sections" not in pc:
        return None
    sections = pc["sections"]
    if not isinstance(sections, dict) or not all(isinstance(t, dict) for t in sections.values()):
        from prefixscan.errors import RunDirError

        raise RunDirError(f"run directory damaged: {cand}/manifest.json: project_config.sections is not a table "
                          "of tables; re-create the run with `prefixscan analyze --force`")
    # what a run recorded settles analysis and scenario only: where output goes, and --force, come from the
    # command line or an explicit --config (a crafted manifest must not make `report` write elsewhere)
    kept = {name: {k: v for k, v in table.items() if k not in NOT_RECORDED} for name, table in sections.items()}
    return ProjectConfig(str(pc.get("path", "")), kept)


def _as_param(value: Any, current: Any) -> Any:
    """A TOML value in the form the CLI parameter takes (a table of fields becomes NAME=PATH items)."""
    if isinstance(value, dict) and isinstance(current, list):
        return [f"{k}={v}" for k, v in value.items()]
    if isinstance(value, list) and isinstance(current, str):
        return ",".join(map(str, value))
    return value


def apply(command: str, config: ProjectConfig, params: dict[str, Any], defaulted: set[str],
          hints: dict[str, Any] | None = None) -> list[str]:
    """Fill the parameters the user left at their defaults from the config; returns the keys used.
    `hints`: the command's parameter types, to refuse a value of the wrong type in one line."""
    settings = config.for_command(command)
    own = config.sections.get(command, {})
    bad = sorted(k for k in own if k not in params)
    if bad:
        raise UsageError(f"{config.path}: [{command}] has unknown key(s) {', '.join(bad)}; known: "
                         f"{', '.join(sorted(k for k in params if k not in ('json_out', 'quiet')))}")
    for section, key in ((s, k) for s, table in config.sections.items() for k in table):
        if key in PROTECTED_KEYS and not config.explicit:  # any table: a run must never record one
            raise UsageError(f"{config.path}: [{section}] {key} {PROTECTED_KEYS[key]}, which only the command "
                             f"line or a file given with --config may do (this file was found, not given); "
                             f"remove it, or pass the option or --config {config.path}")
    used = []
    for key, value in settings.items():
        if key in params and key in defaulted:
            if hints is not None and key in hints:
                check_type(config, command if key in own else "scenario", key, value, hints[key])
            params[key] = _as_param(value, params[key])
            used.append(key)
    return used


_SCALARS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_FITS = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}  # TOML values an option type takes
_TOML_TYPES = ((bool, "a boolean"), ((int, float), "a number"), (str, "a string"), (list, "an array"),
               (dict, "a table"))


def check_type(config: ProjectConfig, section: str, key: str, value: Any, hint: Any) -> None:
    """A UsageError naming the key, the file and the expected type when `value` does not fit the option's
    type `hint` (`int | None`, `list[str]`, ...): `block_size = "sixteen"` or `replicas = [1]`."""
    import types
    import typing

    args = [a for a in typing.get_args(hint) if a is not type(None)] if isinstance(
        hint, types.UnionType) or typing.get_origin(hint) is typing.Union else [hint]
    for want in args:
        origin = typing.get_origin(want) or want
        if origin is list and isinstance(value, (list, dict)):  # a list, or a table of NAME=PATH items
            return
        if want is str and isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
            return  # joined with commas (policies = ["a", "b"])
        if want in _FITS and isinstance(value, _FITS[want]) and (want is bool or not isinstance(value, bool)):
            return
        if origin not in (list, bool, int, float, str):
            return  # a type this check does not know: the command validates the value itself
    expected = " or ".join(_SCALARS.get(typing.get_origin(a) or a, "a list") for a in args)
    raise UsageError(f"{config.path}: [{section}] {key} should be {expected}, got {_toml_type(value)}")


def _toml_type(value: Any) -> str:
    return next((name for kind, name in _TOML_TYPES if isinstance(value, kind)), f"a {type(value).__name__}")


def describe(config: ProjectConfig, used: list[str], params: dict[str, Any]) -> str:
    """The one line that says what a file set: `settings from FILE: tokenizer=..., block_size=16`
    (secrets masked, long values cut)."""
    def shown(key: str) -> str:
        if key in SECRET_KEYS:
            return "***"
        v = params[key]
        text = ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)
        return text if len(text) <= 60 else text[:59] + "…"

    return f"settings from {config.path}: {', '.join(f'{k}={shown(k)}' for k in used)}"


def check_scenario(config: ProjectConfig, known: set[str]) -> None:
    """Scenario keys must mean something to at least one command that takes the scenario."""
    bad = sorted(k for k in config.sections.get("scenario", {}) if k not in known)
    if bad:
        raise UsageError(f"{config.path}: [scenario] has unknown key(s) {', '.join(bad)}; known: "
                         f"{', '.join(sorted(known))}")
