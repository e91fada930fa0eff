"""The planned field lookup (`record.FieldPlans`) finds the same value as trying every candidate (`_lookup_ref`)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixscan.read import shapes
from prefixscan.read.record import FIELD_CANDIDATES, FieldPlans, get_path
from prefixscan.read.shapes import _lookup

# Keys that candidates start with, plus a few no candidate uses; values that are null, scalars, nested
# objects (dotted paths walk them) and JSON strings (get_path parses them on the way).
_FIRSTS = sorted({p.split(".")[0] for c in FIELD_CANDIDATES.values() for p in c})
_SECONDS = sorted({q for c in FIELD_CANDIDATES.values() for p in c for q in p.split(".")[1:]})
_KEYS = st.sampled_from(_FIRSTS + ["messages", "extra", "zz"])
_LEAF = st.one_of(st.none(), st.integers(-3, 3), st.sampled_from(["", "a", "b"]), st.booleans())
_NESTED = st.recursive(_LEAF, lambda kids: st.dictionaries(st.sampled_from(_SECONDS + ["q"]), kids, max_size=4),
                       max_leaves=8)
_VALUE = st.one_of(_NESTED, _NESTED.map(lambda v: shapes.orjson.dumps(v).decode() if isinstance(v, dict) else v))
_HOLDER = st.dictionaries(_KEYS, _VALUE, max_size=10)


def _lookup_ref(field: str, holders: tuple[dict, ...], outer: dict, overrides: dict[str, str]):
    """The plain loop: the first non-null candidate, candidate by candidate, holder by holder."""
    if field in overrides:
        return get_path(outer, overrides[field])
    for path in FIELD_CANDIDATES[field]:
        for holder in holders:
            v = get_path(holder, path) if "." in path else holder.get(path)
            if v is not None:
                return v
    return None


@settings(max_examples=400, deadline=None)
@given(holders=st.lists(_HOLDER, min_size=1, max_size=3),
       overrides=st.dictionaries(st.sampled_from(sorted(FIELD_CANDIDATES)), st.sampled_from(["tenant", "metadata.x"]),
                                 max_size=2))
def test_planned_lookup_equals_reference(holders: list[dict], overrides: dict[str, str]) -> None:
    hs = tuple(holders)
    plan = FieldPlans(FIELD_CANDIDATES).plan(hs)
    for field in FIELD_CANDIDATES:
        assert _lookup(field, hs, hs[0], overrides, plan)[0] == _lookup_ref(field, hs, hs[0], overrides)


def test_plans_are_reused_per_layout_and_bounded() -> None:
    plans = FieldPlans(FIELD_CANDIDATES, limit=2)
    a = plans.plan(({"tenant": "x", "messages": []},))
    assert plans.plan(({"tenant": None, "messages": [1]},)) is a  # same keys: same plan, values not involved
    assert a["tenant"] == (("tenant", False, 0),) and a["user"] == ()
    plans.plan(({"user": 1},))
    plans.plan(({"model": 1},))  # a third layout clears the two held
    assert len(plans.plans) == 1


def test_normalise_reads_fields_through_the_plan() -> None:
    rec = shapes.normalise({"messages": [{"role": "user", "content": "hi"}], "timestamp": 5, "team_id": "t",
                            "metadata": {"session_id": "s"}, "usage": {"completion_tokens": 3}}, "chat", "f", 1, {})
    assert (rec.tenant, rec.conversation_id, rec.output_tokens, rec.timestamp_s) == ("t", "s", 3, 5.0)
