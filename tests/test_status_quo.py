"""The gap between what the engine reported and the modelled round robin, explained from the numbers."""

from __future__ import annotations

from prefixscan.cost.measure import EngineReported
from prefixscan.cost.status_quo import explain, sweep_counts


def _engine(cached: int, prompt: int = 10_000, requests: int = 100, above: int = 0) -> EngineReported:
    return EngineReported(requests=requests, prompt_tokens=prompt, cached_tokens=cached, ideal_cached_tokens=6000,
                          hit_requests=80, above_ideal_requests=above)


def test_sweep_counts():
    assert sweep_counts(1) == []
    assert sweep_counts(8) == [1, 2, 3, 4, 6]
    assert sweep_counts(32) == [1, 2, 3, 4, 6, 8, 12, 16, 24]


def test_agreement():
    text = explain(_engine(3150), 100, 0.30, 8, 400_000)
    assert text[0] == "The engine reported 31.5% of prompt tokens cached over all 100 requests."
    assert "Round robin replayed on 8 replicas caches 30.0%; the two agree within 2 points" in text[1]


def test_more_than_modelled_names_the_matching_replica_count():
    sweep = ((1, 0.52), (2, 0.45), (3, 0.40), (4, 0.36), (6, 0.33))
    text = " ".join(explain(_engine(3600, requests=100), 250, 0.30, 8, 400_000, sweep, 0.31))
    assert "over the 100 of 250 requests that carry it" in text
    assert "caches 30.0%, 6.0 points less than the engine" in text
    assert "Replayed on 4 replicas it caches 36.0%" in text and "fewer than the 8 assumed" in text
    assert "More KV memory" not in text  # unbounded KV (31.0%) does not reach 36.0%


def test_more_than_even_fewer_replicas_points_to_memory():
    text = " ".join(explain(_engine(5000), 100, 0.30, 8, 400_000, ((1, 0.32), (4, 0.31)), 0.50))
    assert "More KV memory than the 400,000 tokens per replica modelled would also explain it" in text
    assert "unbounded KV gives 50.0%" in text and "fewer than" not in text


def test_less_than_modelled_with_eviction():
    text = " ".join(explain(_engine(1000), 100, 0.30, 8, 400_000, (), 0.45))
    assert "caches 30.0%, 20.0 points more than the engine" in text
    assert "Eviction already costs the modelled round robin 15.0 points (45.0% with unbounded KV)" in text


def test_less_than_modelled_without_eviction_names_the_other_causes():
    text = " ".join(explain(_engine(1000), 100, 0.30, 8, 400_000, (), 0.305))
    assert "Eviction costs the modelled round robin only 0.5 points" in text
    assert "More replicas than the 8 assumed" in text and "different tokenizer" in text


def test_counts_above_ideal_mean_another_tokenizer():
    text = " ".join(explain(_engine(3000, above=25), 100, 0.30, 8, 400_000))
    assert "25 of them (25%) report more cached tokens than an ideal cache could give them" in text
