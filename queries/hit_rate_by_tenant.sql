-- Token-weighted ideal-cache hit rate per tenant, with absolute tokens (largest reuse first).
SELECT coalesce(tenant, '(none)') AS tenant,
       count(*) AS requests,
       sum(prompt_tokens) AS prompt_tokens,
       sum(cached_tokens) AS cached_tokens,
       round(sum(cached_tokens) / nullif(sum(prompt_tokens), 0), 4) AS token_weighted_hit_rate,
       round(sum(tenant_cached_tokens) / nullif(sum(prompt_tokens), 0), 4) AS isolated_hit_rate
FROM requests
GROUP BY 1
ORDER BY cached_tokens DESC, tenant;
