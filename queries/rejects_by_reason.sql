-- Why records were rejected, with the first place each reason occurred.
SELECT reason, count(*) AS records, min(source_file || ':' || source_line) AS first_seen
FROM rejects
GROUP BY 1
ORDER BY records DESC, reason;
