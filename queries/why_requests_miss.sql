-- Why requests miss: the tokens an ideal cache with the breakers fixed would hit, split into prompt
-- breakers, routing, eviction and unexplained (a tokenizer/template mismatch), per replica.
-- Only the breaker column is a cache breaker (docs/findings.md, "Why requests miss").
select coalesce(replica, '(not logged)') as replica,
       count(*) as requests,
       sum(counterfactual_cached_tokens) as hittable_if_fixed,
       sum(actual_cached_tokens) as engine_cached,
       sum(lost_breaker_tokens) as lost_breaker,
       sum(lost_routing_tokens) as lost_routing,
       sum(lost_eviction_tokens) as lost_eviction,
       sum(lost_unexplained_tokens) as lost_unexplained
from misses
group by 1
order by 1
