-- name: now
SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)

-- name: version
SELECT sqlite_version()

-- name: claim
-- Pending rows whose retry is due, in id order, except rows behind an
-- earlier row of the same aggregate that holds it: one waiting for a retry
-- (next_retry_at in the future) or dead (next_retry_at = never). Each
-- candidate costs one probe of held_idx, which holds only rows with a
-- next_retry_at (retrying or dead: few), so the cost does not grow with
-- history, with the backlog or with one aggregate's backlog. The
-- database clock is read once (the materialized CTE c): SQLite re-reads
-- 'now' at each step of a statement, and two reads could disagree about a
-- retry that comes due between them, letting a later event of the
-- aggregate out first. The redundant "h.status <> 1" lets the planner prove the partial index
-- applies (next_retry_at > now implies IS NOT NULL); "h.id + 0" keeps it from walking the primary key instead (a
-- walk over all earlier rows, history included, when nothing holds).
-- INDEXED BY pins the outer scan to the partial index of pending rows:
-- with statistics gathered while most rows were pending (ANALYZE, PRAGMA
-- optimize), SQLite otherwise scans the table in rowid order, through all
-- sent history, on every claim (90 ms per claim at 1,000,000 rows).
-- ? = batch size.
WITH c AS MATERIALIZED (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS now)
SELECT o.id, o.message_id, o.aggregate_type, o.aggregate_id, o.event_type,
       COALESCE(o.topic, ''), o.partition_key, o.content_type, o.payload,
       COALESCE(o.headers, ''), o.attempts,
       (c.now - o.created_at) * 1000
FROM c, {{.Table}} o INDEXED BY {{.IndexName "pending_idx"}}
WHERE o.status = 0
  AND (o.next_retry_at IS NULL OR o.next_retry_at <= c.now)
  AND NOT EXISTS (
        SELECT 1 FROM {{.Table}} h
        WHERE h.aggregate_type = o.aggregate_type AND h.aggregate_id = o.aggregate_id
          AND h.status <> 1 AND h.next_retry_at > c.now AND h.id + 0 < o.id)
  {{"{{PARTITIONS}}"}}
ORDER BY o.id
LIMIT ?

-- name: mark_sent
UPDATE {{.Table}}
SET status = 1, attempts = attempts + 1, sent_at = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER), next_retry_at = NULL
WHERE id IN ({{"{{IDS}}"}}) AND status = 0 {{"{{FENCE}}"}}

-- name: mark_retry
UPDATE {{.Table}}
SET attempts = attempts + 1, next_retry_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) + (? / 1000),
    last_error = ?, updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE id = ? AND status = 0 {{"{{FENCE}}"}}

-- name: mark_dead
-- Dead rows keep next_retry_at = "never" so that they hold their aggregate.
UPDATE {{.Table}}
SET status = 2, attempts = attempts + 1, next_retry_at = 253402300799999, last_error = ?, updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE id = ? AND status = 0 {{"{{FENCE}}"}}

-- name: mark_dead_released
-- Dead, but not holding its aggregate (DeadLetterPolicy SkipDead).
UPDATE {{.Table}}
SET status = 2, attempts = attempts + 1, next_retry_at = NULL, last_error = ?, updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE id = ? AND status = 0 {{"{{FENCE}}"}}

-- name: insert
-- Multi-row INSERT written by the commit hook: the row template below is
-- repeated once per event ({{"{{ROWS}}"}}); its ? become the dialect's placeholders.
INSERT INTO {{.Table}} (message_id, aggregate_type, aggregate_id, event_type, topic, partition_key,
                        content_type, payload, headers, created_at, updated_at)
VALUES {{"{{ROWS}}"}}

-- name: insert_row
(?, ?, ?, ?, ?, ?, ?, ?, ?, CAST(unixepoch('subsec') * 1000 AS INTEGER), CAST(unixepoch('subsec') * 1000 AS INTEGER))

-- name: dead_list
-- {{"{{INDEX}}"}}: the selector's index hint (index_status,
-- index_aggregate) or nothing.
-- Dead letters matching the selector (built in Go from column
-- names and placeholders only), oldest first. held: it still holds its
-- aggregate. dead_at: updated_at in Unix microseconds.
SELECT id, message_id, aggregate_type, aggregate_id, event_type, COALESCE(topic, ''),
       attempts, COALESCE(last_error, ''),
       CASE WHEN next_retry_at IS NULL THEN 0 ELSE 1 END,
       updated_at * 1000
FROM {{.Table}} {{"{{INDEX}}"}}
WHERE status = 2 AND {{"{{WHERE}}"}}
ORDER BY id
LIMIT {{"{{LIMIT}}"}}

-- name: dead_ids
-- Ids of the dead letters matching the selector (as dead_list), for
-- dead_retry and dead_skip, which then act on those rows by primary key.
SELECT id FROM {{.Table}} {{"{{INDEX}}"}}
WHERE status = 2 AND {{"{{WHERE}}"}}
ORDER BY id

-- name: dead_retry
-- Back to pending with a fresh attempt budget. Its id is lower than any
-- event it held, so the claim hands it out first: order is kept.
-- {{"{{IDS}}"}}: ids from dead_ids.
UPDATE {{.Table}}
SET status = 0, attempts = 0, next_retry_at = NULL, updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE id IN ({{"{{IDS}}"}}) AND status = 2

-- name: dead_skip
-- Stays failed, but releases its aggregate. {{"{{IDS}}"}}: ids from dead_ids.
UPDATE {{.Table}}
SET next_retry_at = NULL, updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE id IN ({{"{{IDS}}"}}) AND status = 2 AND next_retry_at IS NOT NULL

-- name: fence
-- Appended to the relay's writes when leases are on: the row's partition
-- must still be leased to this instance (? = instance ID), unexpired by the
-- database clock. A stale owner's outcomes are rejected.
AND EXISTS (SELECT 1 FROM {{.Lease}} l
            WHERE l.partition_key = {{.Table}}.partition_key AND l.owner = ? AND l.expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER))

-- name: lease_init
-- One row per partition, created once; {{"{{ROWS}}"}} is "(?, 0)" per partition.
INSERT OR IGNORE INTO {{.Lease}} (partition_key, epoch) VALUES {{"{{ROWS}}"}}

-- name: member_beat
-- ? = instance ID, lease TTL in microseconds, delivery mode (schema
-- version with the mode column).
INSERT INTO {{.Members}} (instance_id, expires_at, mode) VALUES (?, CAST(unixepoch('subsec') * 1000 AS INTEGER) + (? / 1000), ?)
ON CONFLICT (instance_id) DO UPDATE SET expires_at = excluded.expires_at, mode = excluded.mode

-- name: member_count
SELECT COUNT(*) FROM {{.Members}} WHERE expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER)

-- name: member_census
-- Live instances, and one of them whose delivery mode differs from ? (the
-- caller's), as "instance (mode)", or NULL. The members table holds a row
-- per live instance (a few), so this reads a few rows.
SELECT COUNT(*), MIN(CASE WHEN mode <> ? THEN instance_id || ' (' || mode || ')' END) FROM {{.Members}} WHERE expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER)

-- name: member_leave
DELETE FROM {{.Members}} WHERE instance_id = ?

-- name: lease_renew
-- Every lease of one instance in one statement: ? = TTL in microseconds,
-- instance ID. (SQLite has one writer at a time: no deadlock is possible;
-- MySQL renews one partition per statement, see its queries.sql.)
UPDATE {{.Lease}} SET expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) + (? / 1000)
WHERE owner = ? AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER)

-- name: lease_mine
SELECT partition_key, epoch FROM {{.Lease}}
WHERE owner = ? AND expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER)
ORDER BY partition_key

-- name: lease_free
SELECT partition_key FROM {{.Lease}}
WHERE owner IS NULL OR expires_at IS NULL OR expires_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER)
ORDER BY partition_key

-- name: lease_acquire
-- ? = instance ID, TTL in microseconds, partition. Raises the epoch: the
-- fencing token that tells this ownership from every earlier one.
UPDATE {{.Lease}} SET owner = ?, epoch = epoch + 1, expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) + (? / 1000)
WHERE partition_key = ? AND (owner IS NULL OR expires_at IS NULL OR expires_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER))

-- name: lease_acquire_many
-- lease_acquire for several partitions in one statement (one round trip
-- and one commit, where a relay taking its share of 32 partitions used to
-- wait for 32): ? = instance ID, TTL in microseconds, then the partitions
-- ({{"{{PARTITIONS}}"}} is one "?" per partition). Each row taken gets its
-- own epoch raise; rows another instance took first are left alone.
UPDATE {{.Lease}} SET owner = ?, epoch = epoch + 1, expires_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) + (? / 1000)
WHERE partition_key IN ({{"{{PARTITIONS}}"}}) AND (owner IS NULL OR expires_at IS NULL OR expires_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER))

-- name: lease_release
-- ? = partition, instance ID.
UPDATE {{.Lease}} SET owner = NULL, expires_at = NULL
WHERE partition_key = ? AND owner = ?

-- name: lease_owners
-- Every partition's owner, epoch and remaining lease in milliseconds
-- (negative: expired), for stats and tests.
SELECT partition_key, COALESCE(owner, ''), epoch,
       COALESCE(expires_at - CAST(unixepoch('subsec') * 1000 AS INTEGER), -1)
FROM {{.Lease}} ORDER BY partition_key

-- name: stats_pending
-- Pending rows per relay partition: count and age of the oldest in
-- microseconds (database clock).
SELECT partition_key, COUNT(*), COALESCE((CAST(unixepoch('subsec') * 1000 AS INTEGER) - MIN(created_at)) * 1000, 0)
FROM {{.Table}} WHERE status = 0
GROUP BY partition_key ORDER BY partition_key

-- name: stats_status
SELECT status, COUNT(*) FROM {{.Table}} GROUP BY status ORDER BY status

-- name: retention_batch
-- Ids of sent rows older than the retention ($1/first ?: microseconds), at
-- most one batch ({{"{{LIMIT}}"}}), oldest first.
SELECT id FROM {{.Table}}
WHERE status = 1 AND sent_at < CAST(unixepoch('subsec') * 1000 AS INTEGER) - (? / 1000)
ORDER BY id
LIMIT {{"{{LIMIT}}"}}

-- name: retention_archive
-- Copies one batch of sent rows ({{"{{IDS}}"}}) to the archive table.
INSERT INTO {{.Archive}} SELECT * FROM {{.Table}} WHERE id IN ({{"{{IDS}}"}}) AND status = 1

-- name: retention_delete
DELETE FROM {{.Table}} WHERE id IN ({{"{{IDS}}"}}) AND status = 1

-- name: delete_sent
-- Mark-sent for DeleteOnPublish: acknowledged rows are deleted at once.
DELETE FROM {{.Table}} WHERE id IN ({{"{{IDS}}"}}) AND status = 0 {{"{{FENCE}}"}}

-- name: partitions
-- The stored relay partition count (schema version with the meta table).
SELECT partitions FROM {{.Meta}} WHERE id = 1

-- name: partition_check
-- What a running relay compares with the count it started with, in one
-- round trip: the stored count (NULL if the row is missing), the lease
-- rows, and the lowest and highest leased partition (-1 if none).
SELECT (SELECT partitions FROM {{.Meta}} WHERE id = 1),
       (SELECT COUNT(*) FROM {{.Lease}}),
       (SELECT COALESCE(MIN(partition_key), -1) FROM {{.Lease}}),
       (SELECT COALESCE(MAX(partition_key), -1) FROM {{.Lease}})

-- name: out_of_range
-- Pending rows in partitions no relay can own: outside 0..count-1, ? = the
-- stored count. Reads every pending row once (as stats_pending does), so
-- the relay runs it at start and every PartitionCheckInterval.
SELECT COUNT(*) FROM {{.Table}} WHERE status = 0 AND (partition_key >= ? OR partition_key < 0)

-- name: set_partitions
-- relay.Repartition, the one way to change the stored count. ? = count.
UPDATE {{.Meta}} SET partitions = ?, updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) WHERE id = 1

-- name: admin_counts
-- The admin page's overview, from indexes only: pending, dead and held
-- dead rows, each counted up to the cap (the three ?: the cap), through
-- pending_idx and dead_idx; the lowest and highest id, and the age of the
-- lowest-id pending row in microseconds (database clock).
SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM {{.Table}} WHERE status = 0 LIMIT ?)),
       (SELECT COUNT(*) FROM (SELECT 1 FROM {{.Table}} WHERE status = 2 LIMIT ?)),
       (SELECT COUNT(*) FROM (SELECT 1 FROM {{.Table}} WHERE status = 2 AND next_retry_at IS NOT NULL LIMIT ?)),
       COALESCE((SELECT MIN(id) FROM {{.Table}}), 0),
       COALESCE((SELECT MAX(id) FROM {{.Table}}), 0),
       COALESCE((SELECT (CAST(unixepoch('subsec') * 1000 AS INTEGER) - created_at) * 1000
                 FROM {{.Table}} WHERE status = 0 ORDER BY id LIMIT 1), 0)

-- name: admin_backlog
-- Pending rows per relay partition among the first ? pending rows in id
-- order (pending_idx): count and age of the oldest in microseconds.
SELECT partition_key, COUNT(*), (CAST(unixepoch('subsec') * 1000 AS INTEGER) - MIN(created_at)) * 1000
FROM (SELECT partition_key, created_at FROM {{.Table}} WHERE status = 0 ORDER BY id LIMIT ?)
GROUP BY partition_key

-- name: admin_held_partitions
-- Dead letters still holding their aggregate, per partition, among the
-- first ? dead rows (dead_idx).
SELECT partition_key, COUNT(*)
FROM (SELECT partition_key FROM {{.Table}} WHERE status = 2 AND next_retry_at IS NOT NULL ORDER BY id LIMIT ?)
GROUP BY partition_key

-- name: admin_members
-- Relay instances with a membership row: ID, delivery mode, and the time
-- left on their heartbeat in microseconds (negative: expired).
SELECT instance_id, mode, (expires_at - CAST(unixepoch('subsec') * 1000 AS INTEGER)) * 1000
FROM {{.Members}} ORDER BY instance_id LIMIT 200

-- name: admin_events
-- Rows of any status matching {{"{{WHERE}}"}} (column names and
-- placeholders, built in Go), in id order, without their payload.
-- {{"{{INDEX}}"}}: an index hint (index_status or index_aggregate) or
-- nothing.
SELECT id, message_id, aggregate_type, aggregate_id, event_type, COALESCE(topic, ''), partition_key,
       status, attempts, COALESCE(last_error, ''), CASE WHEN next_retry_at IS NULL THEN 0 ELSE 1 END,
       created_at * 1000, updated_at * 1000, COALESCE(sent_at * 1000, 0)
FROM {{.Table}} {{"{{INDEX}}"}}
WHERE {{"{{WHERE}}"}}
ORDER BY id
LIMIT {{"{{LIMIT}}"}}

-- name: admin_event_body
-- One row's content type, payload and headers, by id.
SELECT content_type, payload, COALESCE(headers, '') FROM {{.Table}} WHERE id = ?

-- name: admin_older_than
-- A dead-letter filter: dead (or last acted on) at least ? microseconds
-- ago by the database clock (timestamps here are Unix milliseconds).
updated_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER) - ? / 1000

-- name: admin_aggregate_index
-- 1 if the optional aggregate index exists (lookup by aggregate needs it).
SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = '{{.IndexBase "aggregate_idx"}}'

-- name: admin_aggregate_index_ddl
-- The optional aggregate index for lookups by aggregate.
CREATE INDEX IF NOT EXISTS {{.Index "aggregate_idx"}} ON {{.IndexTable}} (aggregate_type, aggregate_id, id)

-- name: index_status
-- No hint: the planner takes the partial index of the status.
/* pending_idx or dead_idx */

-- name: index_aggregate
-- No hint: the planner takes aggregate_idx if it exists.
/* aggregate_idx */
