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

-- name: mark_dead_released
-- Dead, but not holding its aggregate (DeadLetterPolicy SkipDead).
UPDATE {{.Table}}
SET status = 2, attempts = attempts + 1, next_retry_at = NULL, last_error = ?, updated_at = UTC_TIMESTAMP(6)
WHERE id = ? AND status = 0

-- name: insert
-- Multi-row INSERT written by the commit hook: the row template below is
-- repeated once per event ({{"{{ROWS}}"}}); its ? become the dialect's placeholders.
INSERT INTO {{.Table}} (message_id, aggregate_type, aggregate_id, event_type, topic, partition_key,
                        content_type, payload, headers, created_at, updated_at)
VALUES {{"{{ROWS}}"}}

-- name: insert_row
(?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))

-- name: dead_list
-- Dead letters matching the selector (built in Go from column
-- names and placeholders only), oldest first. held: it still holds its
-- aggregate. dead_at: updated_at in Unix microseconds.
SELECT id, message_id, aggregate_type, aggregate_id, event_type, COALESCE(topic, ''),
       attempts, COALESCE(last_error, ''),
       CASE WHEN next_retry_at IS NULL THEN 0 ELSE 1 END,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', updated_at)
FROM {{.Table}}
WHERE status = 2 AND {{"{{WHERE}}"}}
ORDER BY id
LIMIT {{"{{LIMIT}}"}}

-- name: dead_retry
-- Back to pending with a fresh attempt budget. Its id is lower than any
-- event it held, so the claim hands it out first: order is kept.
UPDATE {{.Table}}
SET status = 0, attempts = 0, next_retry_at = NULL, updated_at = UTC_TIMESTAMP(6)
WHERE status = 2 AND {{"{{WHERE}}"}}

-- name: dead_skip
-- Stays failed, but releases its aggregate.
UPDATE {{.Table}}
SET next_retry_at = NULL, updated_at = UTC_TIMESTAMP(6)
WHERE status = 2 AND next_retry_at IS NOT NULL AND {{"{{WHERE}}"}}
