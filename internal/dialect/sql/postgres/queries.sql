-- name: now
SELECT clock_timestamp()

-- name: version
SELECT current_setting('server_version_num')::int

-- name: claim
-- The redundant "h.status <> 1" lets the planner prove the partial index
-- hold_idx (WHERE status <> 1) applies; SQLite cannot infer it otherwise and
-- would scan all earlier rows, sent history included, per candidate.
-- Pending, due rows in id order, each only if no earlier event of its
-- aggregate is waiting for a retry or dead (held). $1 = batch size.
SELECT o.id, o.message_id, o.aggregate_type, o.aggregate_id, o.event_type,
       COALESCE(o.topic, ''), o.partition_key, o.content_type, o.payload,
       COALESCE(o.headers, ''), o.attempts
FROM {{.Table}} o
WHERE o.status = 0
  AND (o.next_retry_at IS NULL OR o.next_retry_at <= clock_timestamp())
  AND NOT EXISTS (
        SELECT 1 FROM {{.Table}} h
        WHERE h.aggregate_type = o.aggregate_type AND h.aggregate_id = o.aggregate_id
          AND h.status = 2 AND h.status <> 1 AND h.id < o.id)
  AND NOT EXISTS (
        SELECT 1 FROM {{.Table}} h
        WHERE h.aggregate_type = o.aggregate_type AND h.aggregate_id = o.aggregate_id
          AND h.status = 0 AND h.status <> 1 AND h.next_retry_at > clock_timestamp() AND h.id < o.id)
ORDER BY o.id
LIMIT $1

-- name: mark_sent
-- $1 = ids as a PostgreSQL array literal '{1,2,3}'.
UPDATE {{.Table}}
SET status = 1, attempts = attempts + 1, sent_at = clock_timestamp(), updated_at = clock_timestamp(),
    next_retry_at = NULL
WHERE id = ANY($1::bigint[]) AND status = 0

-- name: mark_retry
-- $1 = delay in microseconds, $2 = error text, $3 = id.
UPDATE {{.Table}}
SET attempts = attempts + 1, next_retry_at = clock_timestamp() + ($1::bigint * interval '1 microsecond'),
    last_error = $2, updated_at = clock_timestamp()
WHERE id = $3 AND status = 0

-- name: mark_dead
-- $1 = error text, $2 = id.
UPDATE {{.Table}}
SET status = 2, attempts = attempts + 1, next_retry_at = NULL, last_error = $1, updated_at = clock_timestamp()
WHERE id = $2 AND status = 0

-- name: insert
-- Multi-row INSERT written by the commit hook: the row template below is
-- repeated once per event ({{"{{ROWS}}"}}); its ? become the dialect's placeholders.
INSERT INTO {{.Table}} (message_id, aggregate_type, aggregate_id, event_type, topic, partition_key,
                        content_type, payload, headers, created_at, updated_at)
VALUES {{"{{ROWS}}"}}

-- name: insert_row
(?, ?, ?, ?, ?, ?, ?, ?, ?, clock_timestamp(), clock_timestamp())
