-- Smallest capacity on the curve where one LRU cache (vLLM eviction order) reaches 90% of the ideal hit rate.
SELECT capacity_tokens, capacity_blocks, round(lru_hit_rate, 4) AS lru_hit_rate,
       round(opt_hit_rate, 4) AS opt_hit_rate, round(ideal_hit_rate, 4) AS ideal_hit_rate
FROM capacity_curve
WHERE lru_hit_rate >= 0.9 * ideal_hit_rate
ORDER BY capacity_tokens
LIMIT 1;
