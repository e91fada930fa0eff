"""Golden values on the Mooncake traces (docs/engines.md, 'Public traces'), to 1e-6."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import prefixscan
from prefixscan.cli.app import app
from tests.conftest import MOONCAKE

pytestmark = pytest.mark.skipif(not MOONCAKE.exists(), reason="shared/data/mooncake not present")


def test_synthetic_trace_published_numbers() -> None:
    r = prefixscan.analyze(str(MOONCAKE / "synthetic_trace.jsonl"), capacities=(1_000_000,))
    s = r.summary
    assert s["requests"] == {"read": 3993, "accepted": 3993, "rejected": 0, "rejects_by_reason": {}}
    assert s["input"]["shapes"] == {str(MOONCAKE / "synthetic_trace.jsonl"): "mooncake"}
    assert s["input"]["block_size"] == 512 and s["input"]["hit_rule"] == "trace"
    assert s["hit_rate"]["block_weighted"] == pytest.approx(0.639604, abs=1e-6)
    assert s["hit_rate"]["token_weighted"] == pytest.approx(0.651244, abs=1e-6)
    assert s["hit_rate"]["request_mean"] == pytest.approx(0.423235, abs=1e-6)
    mean_in = s["tokens"]["prompt"] / 3993
    assert mean_in == pytest.approx(15325.48, abs=0.01)


def test_conversation_trace_cli_json_detects_format() -> None:
    res = CliRunner().invoke(app, ["analyze", str(MOONCAKE / "conversation_trace.jsonl"), "--json", "-q",
                                   "--capacities", "1e6,1e7"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["requests"]["accepted"] == 12031 and s["requests"]["rejected"] == 0
    assert list(s["input"]["shapes"].values()) == ["mooncake"]
    assert 0.3 < s["hit_rate"]["token_weighted"] < 0.45
    assert s["conversations"]["share_with_id"] == 0.0
    assert any("no conversation id" in n for n in s["notes"])
