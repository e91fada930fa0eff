"""The replica model against the real vLLM engine under load, on every `make test`, without vLLM.

tests/data/calibration.json holds what `make calibrate` recorded (docs/simulator.md, "Calibration against
the real engine"): per request, the cached tokens of one vLLM 0.32.0 CPU engine in two load passes at the
log's (rate-scaled) arrival times, and of the one-replica simulation with the fitted profile. The workloads
are regenerated here (seeded; the bpe tokenizer is committed), analysed and replayed with the recorded
configuration: the simulator must still give the recorded per-request cached tokens, so it agrees with the
engine on as many requests as it did.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance import calibrate
from conformance.calibrate_report import config_from, simulate_rows

FIXTURE = Path(__file__).resolve().parent / "data" / "calibration.json"
DOC = json.loads(FIXTURE.read_text())


@pytest.mark.parametrize("name", sorted(DOC["workloads"]))
def test_simulation_reproduces_recorded_cached_tokens(tmp_path: Path, name: str) -> None:
    rec = DOC["workloads"][name]
    wl = tmp_path / "workload.jsonl"
    calibrate.make_workload(name, wl)
    sim = simulate_rows(wl, calibrate.TOKDIR, config_from(rec["config"]))
    got = {k: v["cached"] for k, v in sim.items()}
    assert got == rec["sim_cached"]
    for engine, equal in zip(rec["engine_cached"], rec["equal"], strict=True):
        assert engine.keys() == got.keys()
        assert sum(engine[k] == got[k] for k in got) == equal


def test_profile_is_the_recorded_one() -> None:
    from prefixscan.sim.timing import load_profile

    p = load_profile(DOC["profile"]).prefill
    for rec in DOC["workloads"].values():
        assert rec["config"]["prefill_coeffs"] == [p.a, p.b_new, p.c_cached, p.d_new_cached, p.e_new2]
        assert "not a GPU" in load_profile(DOC["profile"]).hardware
