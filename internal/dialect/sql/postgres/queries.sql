-- name: now
SELECT clock_timestamp()

-- name: version
SELECT current_setting('server_version_num')::int

-- name: claim
-- Pending rows whose retry is due, in id order, except rows behind an
-- earlier row of the same aggregate that holds it: one waiting for a retry
-- (next_retry_at in the future) or dead (next_retry_at = never). Each
-- candidate costs one probe of hold_idx bounded by next_retry_at, so the
-- cost does not grow with history or with one aggregate's backlog. The
-- redundant "h.status <> 1" lets the planner prove the partial index
-- applies; "h.id + 0" keeps it from walking the primary key instead (a
-- walk over all earlier rows, history included, when nothing holds). "(SELECT clock_timestamp())" is evaluated once per statement (an
-- InitPlan), so it can bound the index scan; bare clock_timestamp() is
-- volatile and could only filter. $1 = batch size.
SELECT o.id, o.message_id, o.aggregate_type, o.aggregate_id, o.event_type,
       COALESCE(o.topic, ''), o.partition_key, o.content_type, o.payload,
       COALESCE(o.headers, ''), o.attempts
FROM {{.Table}} o
WHERE o.status = 0
  AND (o.next_retry_at IS NULL OR o.next_retry_at <= (SELECT clock_timestamp()))
  AND NOT EXISTS (
        SELECT 1 FROM {{.Table}} h
        WHERE h.aggregate_type = o.aggregate_type AND h.aggregate_id = o.aggregate_id
          AND h.status <> 1 AND h.next_retry_at > (SELECT clock_timestamp()) AND h.id + 0 < o.id)
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
-- Dead rows keep next_retry_at = "never" so that they hold their aggregate.
-- $1 = error text, $2 = id.
UPDATE {{.Table}}
SET status = 2, attempts = attempts + 1, next_retry_at = 'infinity'::timestamptz, last_error = $1, updated_at = clock_timestamp()
WHERE id = $2 AND status = 0

-- name: mark_dead_released
-- Dead, but not holding its aggregate (DeadLetterPolicy SkipDead).
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

-- name: dead_list
-- Dead letters matching the selector (built in Go from column
-- names and placeholders only), oldest first. held: it still holds its
-- aggregate. dead_at: updated_at in Unix microseconds.
SELECT id, message_id, aggregate_type, aggregate_id, event_type, COALESCE(topic, ''),
       attempts, COALESCE(last_error, ''),
       CASE WHEN next_retry_at IS NULL THEN 0 ELSE 1 END,
       (EXTRACT(EPOCH FROM updated_at) * 1000000)::bigint
FROM {{.Table}}
WHERE status = 2 AND {{"{{WHERE}}"}}
ORDER BY id
LIMIT {{"{{LIMIT}}"}}

-- name: dead_retry
-- Back to pending with a fresh attempt budget. Its id is lower than any
-- event it held, so the claim hands it out first: order is kept.
UPDATE {{.Table}}
SET status = 0, attempts = 0, next_retry_at = NULL, updated_at = clock_timestamp()
WHERE status = 2 AND {{"{{WHERE}}"}}

-- name: dead_skip
-- Stays failed, but releases its aggregate.
UPDATE {{.Table}}
SET next_retry_at = NULL, updated_at = clock_timestamp()
WHERE status = 2 AND next_retry_at IS NOT NULL AND {{"{{WHERE}}"}}
