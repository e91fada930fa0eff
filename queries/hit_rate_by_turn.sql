-- Hit rate by turn index: multi-turn chats should reuse more with every turn.
SELECT turn_index,
       count(*) AS requests,
       round(avg(prompt_tokens), 1) AS mean_prompt_tokens,
       sum(cached_tokens) AS cached_tokens,
       round(sum(cached_tokens) / nullif(sum(prompt_tokens), 0), 4) AS token_weighted_hit_rate
FROM requests
GROUP BY 1
ORDER BY turn_index NULLS LAST;
