"""One verdict from one rule: cases at each boundary, the text checked against the numbers it was given."""

from __future__ import annotations

import dataclasses

import pytest

from prefixscan.cost.verdict import (
    HOT_SPOT_IMBALANCE,
    MIN_IDEAL_HIT,
    MIN_PREFILL_SHARE,
    MIN_SAVED_FRACTION,
    VerdictInputs,
    decide,
)

GOOD = VerdictInputs(repetition_measured=True, ideal_hit_rate=0.7, replicas=16, basis="replay", rps=50.0,
                     status_quo="round robin", status_quo_gpus=15.0, status_quo_hit=0.1, router="cost_based",
                     router_gpus=4.0, router_hit=0.65, round_robin_hit=0.1, prefill_share=0.6,
                     router_imbalance=1.2, router_ttft_p95_s=0.2, round_robin_ttft_p95_s=0.25,
                     best_policy="cost_based")


def _case(**kw) -> VerdictInputs:
    return dataclasses.replace(GOOD, **kw)


def _consistent(v, inputs: VerdictInputs) -> None:
    """Reasons agree with the headline: a "not worth it" lists failures only, a "worth it" passes only."""
    status = {c.text: c.status for c in v.checks}
    assert all(r in status for r in v.reasons)
    if v.worth_it is False:
        assert v.reasons and all(status[r] == "fail" for r in v.reasons)
        assert v.headline.startswith(f"Not worth it: {v.reasons[0]}")
    elif v.worth_it is True:
        assert all(status[r] == "pass" for r in v.reasons) and v.headline.startswith("Worth it.")
    else:
        assert "fail" not in {status[r] for r in v.reasons} and "unknown" in {status[r] for r in v.reasons}
    saving = next(c for c in v.checks if c.name == "saving")
    saved = inputs.status_quo_gpus - inputs.router_gpus
    assert saving.numbers["saved_gpus"] == pytest.approx(saved)
    assert f"{inputs.router_hit:.1%}" in saving.text and f"{inputs.status_quo_hit:.1%}" in saving.text
    assert f"on {inputs.replicas} replicas" in saving.text


def test_worth_it_lists_only_supporting_reasons():
    v = decide(GOOD)
    _consistent(v, GOOD)
    assert v.worth_it is True and "Dynamo" in v.headline
    assert "saves 11.0 of 15.0 prefill GPUs (73%)" in " ".join(v.reasons)


def test_eight_replicas_with_a_big_replayed_saving_is_not_rejected_for_its_replica_count():
    """The contradiction in issue 14: 8 replicas, yet routing saves 11 of 15 GPUs."""
    inputs = _case(replicas=8)
    v = decide(inputs)
    _consistent(v, inputs)
    assert v.worth_it is True and "8 replicas" not in v.headline


def test_few_replicas_round_robin_already_warm():
    inputs = _case(replicas=2, status_quo_gpus=10.0, router_gpus=9.4, status_quo_hit=0.60, round_robin_hit=0.60)
    v = decide(inputs)
    _consistent(v, inputs)
    assert v.worth_it is False
    assert "round robin already caches 60.0%" in v.headline
    assert "saves only 0.60 of 10.0 prefill GPUs (6%)" in v.headline


def test_round_robin_warm_just_below_the_saving_threshold():
    sq = 40.0
    below = _case(status_quo_gpus=sq, router_gpus=sq * (1 - MIN_SAVED_FRACTION) + 0.01, status_quo_hit=0.55,
                  round_robin_hit=0.55, router_hit=0.6)
    above = dataclasses.replace(below, router_gpus=sq * (1 - MIN_SAVED_FRACTION) - 0.01)
    vb, va = decide(below), decide(above)
    _consistent(vb, below)
    _consistent(va, above)
    assert vb.worth_it is False and "already caches 55.0%" in vb.headline
    assert va.worth_it is True and "saves 4.01 of 40.0 prefill GPUs (10%)" in " ".join(va.reasons)


def test_big_share_but_too_few_gpus_points_to_production_scale():
    inputs = _case(status_quo_gpus=0.4, router_gpus=0.2, rps=3.13)
    v = decide(inputs)
    _consistent(v, inputs)
    assert v.worth_it is False and "50% of prefill GPUs, but only 0.20 GPUs at 3.13 req/s" in v.headline
    assert "--rps" in v.headline


@pytest.mark.parametrize("hit,worth", [(MIN_IDEAL_HIT - 0.01, False), (MIN_IDEAL_HIT, True)])
def test_little_repetition_boundary(hit, worth):
    inputs = _case(ideal_hit_rate=hit)
    v = decide(inputs)
    _consistent(v, inputs)
    assert v.worth_it is worth
    if not worth:
        assert v.headline == (f"Not worth it: little repetition: an ideal cache would hit only {hit:.0%} of "
                              "prompt tokens, so no router can save much.")


@pytest.mark.parametrize("share,worth", [(MIN_PREFILL_SHARE - 0.01, False), (MIN_PREFILL_SHARE, True)])
def test_prefill_share_boundary(share, worth):
    inputs = _case(prefill_share=share)
    v = decide(inputs)
    _consistent(v, inputs)
    assert v.worth_it is worth
    if not worth:
        assert f"prefill is only {share:.0%} of GPU time under round robin" in v.headline


def test_hot_spots():
    inputs = _case(router_imbalance=HOT_SPOT_IMBALANCE + 0.5, router_ttft_p95_s=0.5, round_robin_ttft_p95_s=0.2)
    v = decide(inputs)
    _consistent(v, inputs)
    assert v.worth_it is False
    assert "busiest replica carries 2.00x the mean load and TTFT p95 rises to 0.500 s from 0.200 s" in v.headline
    balanced = _case(router_imbalance=HOT_SPOT_IMBALANCE + 0.5, router_ttft_p95_s=0.2, round_robin_ttft_p95_s=0.2)
    assert decide(balanced).worth_it is True  # imbalanced but not slower: no hot spot that hurts


def test_analytic_few_replicas_is_unchecked_not_a_reason_against():
    inputs = _case(basis="analytic", replicas=4, repetition_measured=False, ideal_hit_rate=None)
    v = decide(inputs)
    _consistent(v, inputs)
    assert v.worth_it is None and "2 unchecked" in v.headline
    assert any("1/4 hit chance" in r for r in v.reasons)


def test_several_failures_are_counted_in_the_headline():
    inputs = _case(prefill_share=0.1, ideal_hit_rate=0.1)
    v = decide(inputs)
    _consistent(v, inputs)
    assert v.headline.endswith("(and 1 more).") and len(v.reasons) == 2


def test_engine_reported_status_quo_is_named():
    inputs = _case(status_quo="today (engine-reported)", status_quo_hit=0.314)
    v = decide(inputs)
    _consistent(v, inputs)
    assert "against 31.4% for today (engine-reported)" in " ".join(v.reasons)
