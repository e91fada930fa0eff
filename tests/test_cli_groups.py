"""Option groups (prefixscan/cli/groups.py): each option declared once, with the config field it sets; a
command lists its groups and typer, prefixscan.toml and the parameter sources still see flat options."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import typer
from typer.testing import CliRunner

from prefixscan.cli.app import app
from prefixscan.cli.estimate import ScenarioOptions, WhatIfOptions
from prefixscan.cli.groups import config_fields, flag, grouped, opt
from prefixscan.cli.simulate_options import LogOptions, ReplayOptions, TierOptions
from prefixscan.sim.config import SimConfig
from tests.conftest import ROOT

runner = CliRunner()


def _flags(command: str) -> set[str]:
    """Every long option name of `prefixscan COMMAND` as click (and so `--help`) sees it."""
    cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {o for p in cmd.params for o in p.opts if o.startswith("--")}


def _declared(*groups: type) -> set[str]:
    """The long option names the groups declare (a --x/--no-x switch: --x)."""
    return {d.split("/")[0] for g in groups for f in dataclasses.fields(g)
            for d in f.metadata["prefixscan.option"][0] if d.startswith("--")}


def test_simulate_help_shows_each_group_option_once() -> None:
    shown = _flags("simulate")
    groups = _declared(ReplayOptions, LogOptions, TierOptions)
    own = {"--name", "--list", "--output", "--force", "--save", "--load", "--json", "--quiet"}
    assert shown == groups | own and len(shown) == 74  # the same 74 long options as before the groups


def test_estimate_and_report_share_one_scenario_declaration() -> None:
    scenario = _declared(ScenarioOptions)
    assert scenario <= _flags("report") and scenario <= _flags("estimate")
    assert _declared(WhatIfOptions) <= _flags("estimate") and not _declared(WhatIfOptions) & _flags("report")


def test_every_replay_and_tier_option_sets_a_simconfig_field() -> None:
    """The one declaration says where each value goes: a field of SimConfig (or one the code combines)."""
    sim_fields = {f.name for f in dataclasses.fields(SimConfig)}
    cfg = {**ReplayOptions().sim_fields(None), **TierOptions().sim_fields()}
    assert set(cfg) <= sim_fields
    assert SimConfig.from_options(**cfg) == SimConfig()  # the options' defaults are the config's defaults
    t = TierOptions(shared_latency_ms=2.0, host_kv_blocks="unbounded", prefill_replicas=3, decode_replicas=2)
    assert (t.sim_fields()["shared_latency_s"], t.sim_fields()["host_kv_blocks"], t.sim_fields()["replicas"]) == (
        0.002, -1, 3)


def test_log_options_map_to_analyze_config_and_name_their_flags() -> None:
    given = LogOptions(fmt="chat", field=["tenant=meta.team"], strict=True, no_infer_conversations=True)
    assert given.analyze_options() == {"format": "chat", "fields": (("tenant", "meta.team"),), "strict": True,
                                       "infer_conversations": False}
    assert LogOptions().analyze_options() == {}  # nothing given: analyze's defaults and prefixscan.toml apply
    assert [LogOptions.flag_of(k) for k in ("format", "hash", "lora_paths", "infer_conversations")] == [
        "--format", "--hash", "--lora-path", "--no-infer-conversations"]


def test_prefixscan_toml_still_sets_a_grouped_option(tmp_path) -> None:
    """prefixscan.toml keys are the flat option names, group or not ([simulate] host_kv_gib, reserve_decode)."""
    run = tmp_path / "run"
    r = runner.invoke(app, ["analyze", str(ROOT / "sample_logs" / "chat.jsonl"), "-o", str(run), "-q", "--no-findings"])
    assert r.exit_code == 0, r.output
    cfg = tmp_path / "p.toml"
    cfg.write_text('[simulate]\nreplicas = 3\nreserve_decode = false\nshared_latency_ms = 4.0\n')
    r = runner.invoke(app, ["--config", str(cfg), "simulate", str(run), "--no-save", "--json", "-q",
                            "-p", "round_robin"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)["config"]
    assert (got["replicas"], got["reserve_decode_blocks"], got["shared_latency_s"]) == (3, False, 0.004)
    cfg.write_text('[simulate]\nreplicas = "three"\n')
    r = runner.invoke(app, ["--config", str(cfg), "simulate", str(run), "--no-save", "-q"])
    assert r.exit_code == 2 and "replicas should be an integer" in r.output
    shutil.rmtree(run)


def test_grouped_refuses_a_repeated_option_name() -> None:
    @dataclasses.dataclass(frozen=True)
    class Twice:
        quiet: bool = opt(False, "--quiet-too")

    def command(twice: Twice = ..., quiet: bool = typer.Option(False, "--quiet")) -> None:  # type: ignore[assignment]
        pass

    command.__annotations__ = {"twice": Twice, "quiet": bool}
    with pytest.raises(TypeError, match="repeats a parameter name"):
        grouped(command)
    assert flag(dataclasses.fields(Twice)[0]) == "--quiet-too" and config_fields(Twice()) == {"quiet": False}
