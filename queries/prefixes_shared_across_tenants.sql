-- Prefixes whose hits need another tenant's cache entries: what tenant isolation (salting) would lose.
SELECT rank, prefix_tokens, hits, cross_tenant_hits, tenants, tokens_saved, snippet
FROM prefixes
WHERE cross_tenant_hits > 0
ORDER BY tokens_saved DESC, rank;
