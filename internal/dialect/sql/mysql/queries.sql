-- name: now
SELECT UTC_TIMESTAMP(6)

-- name: version
SELECT VERSION()

-- name: claim
-- Pending rows whose retry is due, in id order, except rows behind an
-- earlier row of the same aggregate that holds it: one waiting for a retry
-- (next_retry_at in the future) or dead (next_retry_at = never). The held
-- rows are few; the UNION (two ranges of status_retry_idx) keeps MariaDB
-- from merging them into a correlated probe, which it could only bound by
-- the aggregate (every pending or sent row of it), never by next_retry_at.
-- Materialized once per statement, they are probed by key per candidate.
-- FORCE INDEX keeps the outer scan in id order, so LIMIT stops it early
-- instead of sorting the whole backlog. ? = batch size.
SELECT o.id, o.message_id, o.aggregate_type, o.aggregate_id, o.event_type,
       COALESCE(o.topic, ''), o.partition_key, o.content_type, o.payload,
       COALESCE(o.headers, ''), o.attempts
FROM {{.Table}} o FORCE INDEX ({{.Index "status_id_idx"}})
WHERE o.status = 0
  AND (o.next_retry_at IS NULL OR o.next_retry_at <= UTC_TIMESTAMP(6))
  AND NOT EXISTS (
        SELECT 1 FROM (
            SELECT aggregate_type, aggregate_id, id FROM {{.Table}}
            WHERE status = 2 AND next_retry_at > UTC_TIMESTAMP(6)
            UNION ALL
            SELECT aggregate_type, aggregate_id, id FROM {{.Table}}
            WHERE status = 0 AND next_retry_at > UTC_TIMESTAMP(6)
        ) h
        WHERE h.aggregate_type = o.aggregate_type AND h.aggregate_id = o.aggregate_id AND h.id < o.id)
ORDER BY o.id
LIMIT ?

-- name: mark_sent
-- The id list ({{"{{IDS}}"}}) is expanded to one placeholder per id.
UPDATE {{.Table}}
SET status = 1, attempts = attempts + 1, sent_at = UTC_TIMESTAMP(6), updated_at = UTC_TIMESTAMP(6),
    next_retry_at = NULL
WHERE id IN ({{"{{IDS}}"}}) AND status = 0

-- name: mark_retry
UPDATE {{.Table}}
SET attempts = attempts + 1, next_retry_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
    last_error = ?, updated_at = UTC_TIMESTAMP(6)
WHERE id = ? AND status = 0

-- name: mark_dead
-- Dead rows keep next_retry_at = "never" so that they hold their aggregate.
UPDATE {{.Table}}
SET status = 2, attempts = attempts + 1, next_retry_at = '9999-12-31 23:59:59.999999', last_error = ?, updated_at = UTC_TIMESTAMP(6)
WHERE id = ? AND status = 0

-- name: insert
-- Multi-row INSERT written by the commit hook: the row template below is
-- repeated once per event ({{"{{ROWS}}"}}); its ? become the dialect's placeholders.
INSERT INTO {{.Table}} (message_id, aggregate_type, aggregate_id, event_type, topic, partition_key,
                        content_type, payload, headers, created_at, updated_at)
VALUES {{"{{ROWS}}"}}

-- name: insert_row
(?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))
