"""Collect rows measured by separate `bench/run.py` invocations into one results file.

    .venv/bin/python bench/merge_results.py OUT.md MAIN.json [OTHER.json ...] [--fallback SMALL.json]
        [--profile-from X.json] [--note TEXT]

Rows come from the JSON files in order (a later file's row replaces an earlier one with the same number);
rows missing from all of them are taken from --fallback and marked as measured at that file's scale.
Machine info and versions are the first file's; every source invocation is listed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import RowResult, write_markdown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("sources", nargs="+")
    ap.add_argument("--fallback")
    ap.add_argument("--profile-from")
    ap.add_argument("--note", action="append", default=[])
    args = ap.parse_args()
    docs = [json.loads(Path(p).read_text()) for p in args.sources]
    rows: dict[int, RowResult] = {}
    for d in docs:
        for r in d["rows"]:
            rows[r["row"]] = RowResult(**r)
    if args.fallback:
        fb = json.loads(Path(args.fallback).read_text())
        for r in fb["rows"]:
            if r["row"] not in rows:
                rr = RowResult(**r)
                scale = fb["meta"]["scale"]
                rr.measured = f"[{scale} scale] {rr.measured}"
                rr.verdict = f"[{scale} scale] {rr.verdict}"
                rr.details.insert(0, f"not run at this scale in this session; the figures below are from the "
                                     f"`--scale {scale}` run ({Path(args.fallback).name})")
                rows[r["row"]] = rr
    meta = dict(docs[0]["meta"])
    meta["command"] = "`; `".join(d["meta"]["command"] for d in docs)
    profile = []
    if args.profile_from:
        profile = json.loads(Path(args.profile_from).read_text()).get("profile", [])
    extra = ["", "## Notes", ""] + [f"- {n}" for n in args.note] if args.note else []
    out = Path(args.out)
    write_markdown(out, meta, [rows[k] for k in sorted(rows)], extra + profile)
    out.with_suffix(".json").write_text(json.dumps(
        {"meta": meta, "rows": [rows[k].__dict__ for k in sorted(rows)], "profile": profile}, indent=1, default=str))


if __name__ == "__main__":
    main()
