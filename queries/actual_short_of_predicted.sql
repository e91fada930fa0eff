-- Requests whose engine-reported cached tokens fall short of the ideal prediction: a hidden dynamic
-- field, a template or tokenizer mismatch, or eviction. Largest shortfall first.
SELECT request_id, tenant, conversation_id, prompt_tokens, cached_tokens AS predicted_cached_tokens,
       actual_cached_tokens, predicted_minus_actual
FROM requests
WHERE actual_cached_tokens IS NOT NULL AND predicted_minus_actual > 0
ORDER BY predicted_minus_actual DESC, seq
LIMIT 100;
