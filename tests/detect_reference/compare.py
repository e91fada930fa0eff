"""The whole observable state of a detector, as plain values, so a fast and a reference detector fed the
same records can be compared with `==` (and a difference shown field by field)."""

from __future__ import annotations

from typing import Any


def _family(f: Any) -> dict[str, Any]:
    return {"fid": f.fid, "tenant": f.tenant, "units": [tuple(u) for u in f.units], "texts": f.texts,
            "pos": f.pos, "request_id": f.request_id, "root": f.root, "pre": f.pre, "tools": f.tools,
            "record": f.record, "slots": f.slots, "requests": f.requests}


def snapshot(det: Any) -> dict[str, Any]:
    """Everything `finalize` and `fix` read from a detector, and the state later requests depend on."""
    return {
        "fed": det.fed, "errors": det.errors,
        "owner": det.index.owner, "exemplar_chars": det.index.exemplar_chars,
        "families": [_family(f) for f in det.index.families],
        "accs": det.accs, "ops_of": det.ops_of, "opsets": det.opsets, "keys": det.keys,
        "pending": det.pending, "orders": det.orders, "seeded": det._seeded,
        "lists": {ms: (e.mi, e.first, e.canon, e.conflicted, e.held) for ms, e in det.lists.items()},
    }


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Names of the snapshot fields that differ (with the first differing family or acc, if any)."""
    out = []
    for k in a:
        if a[k] == b[k]:
            continue
        if k == "families" and len(a[k]) == len(b[k]):
            i = next(i for i, (x, y) in enumerate(zip(a[k], b[k], strict=True)) if x != y)
            out.append(f"families[{i}]: " + ", ".join(f for f in a[k][i] if a[k][i][f] != b[k][i][f]))
        elif k == "accs" and a[k].keys() == b[k].keys():
            key = next(key for key in a[k] if a[k][key] != b[k][key])
            out.append(f"accs[{key!r}]")
        else:
            out.append(k)
    return out
