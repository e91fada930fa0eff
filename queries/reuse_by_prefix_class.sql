-- Where reuse lives: prefix class x hit source, in absolute tokens.
SELECT prefix_class, hit_source, count(*) AS requests, sum(cached_tokens) AS cached_tokens,
       sum(prompt_tokens) AS prompt_tokens
FROM requests
GROUP BY 1, 2
ORDER BY cached_tokens DESC, prefix_class, hit_source;
