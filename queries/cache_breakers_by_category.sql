-- Cache breakers (docs/findings.md): how many findings and how much prefill they cost, in total and by
-- category (dynamic_field, pattern_free, normalisation, actual_vs_predicted). Most tokens lost first.
SELECT 'all' AS category, count(*) AS findings, coalesce(sum(tokens_lost), 0) AS tokens_lost,
       coalesce(sum(requests_affected), 0) AS requests_affected
FROM findings
UNION ALL
SELECT category, count(*), sum(tokens_lost), sum(requests_affected)
FROM findings
GROUP BY category
ORDER BY tokens_lost DESC, category;
