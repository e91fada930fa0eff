-- The shared prefixes that save the most prefill with an ideal cache (snippets are redacted).
SELECT rank, prefix_tokens, hits, tokens_saved, tenants, round(median_reuse_gap_s, 1) AS median_gap_s, snippet
FROM prefixes
ORDER BY rank
LIMIT 20;
