"""docs/inputs.md stays true: every example line there is read by analyze with no reject, and the
`fields:` line printed under it is the one analyze gives for it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import prefixscan
from tests.conftest import ROOT

DOC = (ROOT / "docs" / "inputs.md").read_text()
EXAMPLES = re.findall(r"```json\n(.*?)\n```\n+```\n(fields: [^\n]*)", DOC)


def test_the_page_has_an_example_per_shape() -> None:
    assert len(EXAMPLES) >= 14
    for heading in ("OpenAI chat", "OpenAI Batch", "Gateway", "LiteLLM", "Anthropic Messages, bare",
                    "Anthropic Messages, wrapped", "Responses API", "OpenTelemetry", "Completions",
                    "Pre-tokenised", "Mooncake", "bailian", "Parquet", "gzip and zstd", "JSON arrays",
                    "Directories"):
        assert re.search(rf"^## .*{re.escape(heading)}", DOC, re.M), heading


@pytest.mark.parametrize(("line", "fields"), EXAMPLES, ids=[f"example{i}" for i in range(len(EXAMPLES))])
def test_each_example_line_reads_as_documented(tmp_path: Path, line: str, fields: str) -> None:
    log = tmp_path / ("x.json" if line.startswith('{"resourceSpans"') else "x.jsonl")
    log.write_text(line + "\n")
    tokens = "prompt_token_ids" in line
    res = prefixscan.analyze(str(log), findings=False, **({"tokenizer": "none"} if tokens else {}))
    rq = res.summary["requests"]
    assert rq["rejected"] == 0 and rq["accepted"] >= 1
    assert res.summary["input"]["fields"]["line"] == fields
