"""Which log key became which field, counted over the records read: the summary's `fields:` line and
`input.fields`, and the warning for a --field path that matches (almost) nothing."""

from __future__ import annotations

from typing import Any

from prefixscan.read import latency

TRACE_UNITS = {"mooncake": "relative ms", "bailian": "relative s"}
# Keys an ecosystem converter (read/otel.py, anthropic.py, responses.py) fills, named in the summary by their source
CONVERTED_KEYS = {
    "otel": {"timestamp": "startTimeUnixNano", "conversation_id": "attributes.gen_ai.conversation.id",
             "tenant": "attributes.tenant|tenant.id|enduser.id"},
    "responses": {"conversation_id": "previous_response_id (chain)"},
}
KEY_SAMPLE = 64  # records whose keys are kept to suggest the nearest key of a --field path that matches nothing


class FieldUse:
    """Which log key each summarised field (tenant, timestamp, conversation, replica, and every --field
    mapping) came from, counted over the records read, so the summary can say so and a --field path that
    matches nothing (a typo) is caught instead of leaving a column null in silence."""

    TRACKED = ("tenant", "timestamp", "conversation_id", "replica")

    def __init__(self, overrides: dict[str, str] | None = None) -> None:
        self.overrides = dict(overrides or {})
        self.records = 0
        self.paths: dict[str, dict[str, int]] = {f: {} for f in (*self.TRACKED, *self.overrides)}
        self.units: dict[str, int] = {}  # how timestamps were read: "epoch s", "ISO-8601", "input order", ...
        self.keys: set[str] = set()  # dotted keys of the first records, for suggestions
        self.converted = False  # a shape converted to chat first (its keys are the converter's)
        self._sampled = 0

    def add(self, where: dict[str, str | None], unit: str | None, keys: dict[str, Any] | None = None,
            converted: bool = False, n: int = 1) -> None:
        """Count `n` records whose fields came from `where` (field -> path, None: not found)."""
        self.records += n
        self.converted |= converted
        for f, path in where.items():
            if path is not None and (f in self.paths or f in latency.COLUMNS):  # latency: once found
                got = self.paths.setdefault(f, {})
                got[path] = got.get(path, 0) + n
        if unit is not None:
            self.units[unit] = self.units.get(unit, 0) + n
        if keys is not None and self._sampled < KEY_SAMPLE:
            self._sampled += 1
            self.keys.update(_dotted_keys(keys))

    def summary(self, inferred: int = 0) -> dict[str, Any]:
        """The summary's `input.fields`: per field the log keys it came from (most records first), how many
        records had it, and `line`, the one line the terminal prints."""
        out: dict[str, Any] = {}
        for f, paths in self.paths.items():
            got = sorted(paths.items(), key=lambda kv: (-kv[1], kv[0]))
            entry: dict[str, Any] = {"from": [p for p, _ in got], "records": sum(n for _, n in got),
                                     "of": self.records, "mapped": f in self.overrides}
            if f == "timestamp":
                entry["read_as"] = [u for u, _ in sorted(self.units.items(), key=lambda kv: (-kv[1], kv[0]))]
            if f == "conversation_id":
                entry["inferred"] = inferred
            out[f] = entry
        out["line"] = "fields: " + ", ".join(self._shown(f, out[f]) for f in self.paths)
        return out

    def _shown(self, f: str, e: dict[str, Any]) -> str:
        name = {"conversation_id": "conversation"}.get(f, f)
        src = " | ".join(e["from"][:3]) + (f" (+{len(e['from']) - 3})" if len(e["from"]) > 3 else "")
        if e["mapped"] and not e["from"]:
            return f"{name} <- {self.overrides[f]} (--field; matched no record)"
        if e["from"] and e["records"] < e["of"]:
            src += f" ({e['records']:,} of {e['of']:,})"
        if f == "timestamp":
            units = [u for u in e.get("read_as", []) if u != "input order"]
            if units:
                src += f" ({', '.join(units[:2])})"
            if "input order" in e.get("read_as", []):
                src = (src + " + " if e["from"] else "") + "(input order)"
        if f == "conversation_id" and e.get("inferred"):
            src = (src + " + " if e["from"] else "") + "(inferred)"
        return f"{name} <- {src or '(none)'}"

    def warnings(self) -> list[str]:
        """One line per --field mapping that matched under half of the records: a typo leaves a column
        null in silence otherwise. Names the nearest keys the log has."""
        import difflib

        out = []
        for f, path in self.overrides.items():
            if f not in self.paths or not self.records:
                continue
            got = sum(self.paths[f].values())
            if got * 2 >= self.records:
                continue
            keys = sorted(self.keys)
            near = difflib.get_close_matches(path, keys, n=3, cutoff=0.6) or [
                k for k in keys if "." not in k][:6]
            out.append(f"--field {f}={path} matched {got:,} of {self.records:,} records ({f} stays null where "
                       f"it does not match); nearest keys in the log: {', '.join(near) or '(none)'}")
        return out


def _dotted_keys(obj: dict[str, Any], prefix: str = "", depth: int = 3) -> list[str]:
    """The record's keys as dotted paths, objects followed `depth` levels (lists and JSON strings are not)."""
    out = []
    for k, v in obj.items():
        if not isinstance(k, str):
            continue
        path = prefix + k
        out.append(path)
        if isinstance(v, dict) and depth > 1:
            out += _dotted_keys(v, path + ".", depth - 1)
    return out
