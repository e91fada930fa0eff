"""`prefixscan.toml`: a project's analysis settings, so the same analysis runs every week with no flags.

```toml
[analyze]                      # any `prefixscan analyze` option, by its Python name
tokenizer = "hf:/models/llama-3.1-70b"
block_size = 16
field = { tenant = "metadata.team", conversation_id = "metadata.session" }

[scenario]                     # shared by simulate, estimate and report: model, GPU, fleet, rate, price
model = "llama-3.1-70b"
gpu = "h100"
replicas = 16
rps = 50
usd_per_gpu_hour = 2.5

[simulate]                     # options of one command override the scenario for that command
policies = "round_robin,dynamo_kv"
```

Where it comes from, first found: `prefixscan --config FILE`; for `analyze`, `prefixscan.toml` beside the first
log; for a command on a run directory, the settings `analyze` recorded in that run; else `./prefixscan.toml`.
A flag given on the command line always wins over the file. Unknown keys are errors (a typo must not
silently fall back to a default).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefixscan.errors import UsageError

FILENAME = "prefixscan.toml"
COMMANDS = ("analyze", "simulate", "estimate", "report")
SCENARIO_COMMANDS = ("simulate", "estimate", "report")


SECRET_KEYS = {"tenant_key"}
NOT_RECORDED = {"output", "force"}  # never taken from the settings a run recorded (destinations, replacing)


@dataclass(frozen=True)
class ProjectConfig:
    """The parsed file: one table per command, plus the shared scenario."""

    path: str
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)

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
        return parse(explicit)
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
    from prefixscan.io.rundir import read_manifest

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


def apply(command: str, config: ProjectConfig, params: dict[str, Any], defaulted: set[str]) -> list[str]:
    """Fill the parameters the user left at their defaults from the config; returns the keys used."""
    settings = config.for_command(command)
    own = config.sections.get(command, {})
    bad = sorted(k for k in own if k not in params)
    if bad:
        raise UsageError(f"{config.path}: [{command}] has unknown key(s) {', '.join(bad)}; known: "
                         f"{', '.join(sorted(k for k in params if k not in ('json_out', 'quiet')))}")
    used = []
    for key, value in settings.items():
        if key in params and key in defaulted:
            params[key] = _as_param(value, params[key])
            used.append(key)
    return used


def check_scenario(config: ProjectConfig, known: set[str]) -> None:
    """Scenario keys must mean something to at least one command that takes the scenario."""
    bad = sorted(k for k in config.sections.get("scenario", {}) if k not in known)
    if bad:
        raise UsageError(f"{config.path}: [scenario] has unknown key(s) {', '.join(bad)}; known: "
                         f"{', '.join(sorted(known))}")
