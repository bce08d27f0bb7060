-- name: now
SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)

-- name: version
SELECT sqlite_version()

-- name: claim
-- Pending rows whose retry is due, in id order, except rows behind an
-- earlier row of the same aggregate that holds it: one waiting for a retry
-- (next_retry_at in the future) or dead (next_retry_at = never). The
-- pending set (schema version 8) is walked in id order (its rowid) and
-- each row read by the outbox table's rowid: CROSS JOIN keeps that loop
-- order whatever the statistics say (ANALYZE, PRAGMA optimize), so LIMIT
-- stops the walk early. Each candidate costs one probe of held_idx, which
-- holds only rows with a next_retry_at (retrying or dead: few), so the
-- cost does not grow with history, with the backlog or with one
-- aggregate's backlog. The database clock is read once (the materialized
-- CTE c): SQLite re-reads 'now' at each step of a statement, and two reads
-- could disagree about a retry that comes due between them, letting a
-- later event of the aggregate out first. The redundant "h.status <> 1"
-- lets the planner prove the partial index applies (next_retry_at > now
-- implies IS NOT NULL); "h.id + 0" keeps it from walking the primary key
-- instead (a walk over all earlier rows, history included, when nothing
-- holds). ? = batch size.
WITH c AS MATERIALIZED (SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS now)
SELECT o.id, o.message_id, o.aggregate_type, o.aggregate_id, o.event_type,
       COALESCE(o.topic, ''), o.partition_key, o.content_type, o.payload,
       COALESCE(o.headers, ''), o.attempts,
       (c.now - o.created_at) * 1000
FROM c CROSS JOIN {{.Pending}} p CROSS JOIN {{.Table}} o
WHERE o.id = p.id
  AND o.status = 0
  AND (o.next_retry_at IS NULL OR o.next_retry_at <= c.now)
  AND NOT EXISTS (
        SELECT 1 FROM {{.Table}} h
        WHERE h.aggregate_type = o.aggregate_type AND h.aggregate_id = o.aggregate_id
          AND h.status <> 1 AND h.next_retry_at > c.now AND h.id + 0 < o.id)
  {{"{{PARTITIONS}}"}}
ORDER BY p.id
LIMIT ?

-- name: mark_sent
-- Deletes the published events' rows from the pending set (schema
-- version 8); the outbox rows are not touched.
DELETE FROM {{.Pending}} WHERE id IN ({{"{{IDS}}"}}) {{"{{FENCE_BATCH}}"}}

-- name: mark_sent_retried
-- Marks sent the published events that had failed before (attempts > 0):
-- status 1, next_retry_at cleared, sent_at set; the update trigger removes
-- them from the pending set. Rare. Run before mark_sent.
UPDATE {{.Table}}
SET status = 1, sent_at = CAST(unixepoch('subsec') * 1000 AS INTEGER),
    updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER), next_retry_at = NULL
WHERE id IN ({{"{{IDS}}"}}) AND status = 0 AND attempts > 0 {{"{{FENCE}}"}}

-- name: mark_retry
UPDATE {{.Table}}
SET attempts = attempts + 1, next_retry_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) + (? / 1000),
    last_error = ?, updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE id = ? AND status = 0 AND EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = {{.Table}}.id) {{"{{FENCE}}"}}

-- name: mark_dead
-- Dead rows keep next_retry_at = "never" so that they hold their aggregate.
UPDATE {{.Table}}
SET status = 2, attempts = attempts + 1, next_retry_at = 253402300799999, last_error = ?, updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE id = ? AND status = 0 AND EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = {{.Table}}.id) {{"{{FENCE}}"}}

-- name: mark_dead_released
-- Dead, but not holding its aggregate (DeadLetterPolicy SkipDead).
UPDATE {{.Table}}
SET status = 2, attempts = attempts + 1, next_retry_at = NULL, last_error = ?, updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE id = ? AND status = 0 AND EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = {{.Table}}.id) {{"{{FENCE}}"}}

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

-- name: pending_list
-- Pending events (in the pending set) matching the selector ({{"{{WHERE}}"}},
-- built in Go from column names and placeholders only), oldest first, for
-- an operator who dead-letters them (DeadLetters.ListPending). created:
-- created_at in Unix microseconds.
SELECT id, message_id, aggregate_type, aggregate_id, event_type, COALESCE(topic, ''),
       attempts, COALESCE(last_error, ''),
       created_at * 1000
FROM {{.Table}}
WHERE id IN (SELECT p.id FROM {{.Pending}} p) AND status = 0 AND {{"{{WHERE}}"}}
ORDER BY id
LIMIT {{"{{LIMIT}}"}}

-- name: pending_list_all
-- Every pending event, oldest first, at most {{"{{LIMIT}}"}}
-- (DeadLetters.ListPending with Selector.All): the pending set walked in
-- id order (its rowid), each row read by the outbox table's primary key;
-- CROSS JOIN keeps SQLite from reordering the join.
SELECT o.id, o.message_id, o.aggregate_type, o.aggregate_id, o.event_type, COALESCE(o.topic, ''),
       o.attempts, COALESCE(o.last_error, ''),
       o.created_at * 1000
FROM {{.Pending}} p CROSS JOIN {{.Table}} o ON o.id = p.id
WHERE o.status = 0
ORDER BY p.id
LIMIT {{"{{LIMIT}}"}}

-- name: pending_lock
-- The first step of DeadLetters.DeadLetterPending: the confirmed ids
-- ({{"{{IDS}}"}}) still pending. SQLite has one writer at a time, and
-- pending_dead checks the pending set again in its own statement.
SELECT p.id FROM {{.Pending}} p WHERE p.id IN ({{"{{IDS}}"}}) ORDER BY p.id

-- name: pending_dead
-- Dead-letters pending events on an operator's word (not an attempt:
-- attempts unchanged), holding their aggregate as mark_dead does. ? = the
-- error text; {{"{{IDS}}"}}: the ids pending_lock returned. Only rows still
-- in the pending set change (a relay may have marked them sent since);
-- the update trigger removes them from it.
UPDATE {{.Table}}
SET status = 2, next_retry_at = 253402300799999, last_error = ?, updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE id IN ({{"{{IDS}}"}}) AND status = 0 AND EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = {{.Table}}.id)

-- name: pending_dead_released
-- pending_dead that does not hold the aggregate (as mark_dead_released).
UPDATE {{.Table}}
SET status = 2, next_retry_at = NULL, last_error = ?, updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER)
WHERE id IN ({{"{{IDS}}"}}) AND status = 0 AND EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = {{.Table}}.id)

-- name: fence
-- Appended to the relay's writes when leases are on: the row's partition
-- must still be leased to this instance (? = instance ID), unexpired by the
-- database clock. A stale owner's outcomes are rejected.
AND EXISTS (SELECT 1 FROM {{.Lease}} l
            WHERE l.partition_key = {{.Table}}.partition_key AND l.owner = ? AND l.expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER))

-- name: fence_batch
-- The fence of mark_sent (a DELETE of the pending set): the partitions
-- leased to this instance (? = instance ID), unexpired by the database
-- clock, read once for the statement (an uncorrelated IN subquery).
AND partition_key IN (SELECT l.partition_key FROM {{.Lease}} l
                      WHERE l.owner = ? AND l.expires_at > CAST(unixepoch('subsec') * 1000 AS INTEGER))

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

-- name: member_prune
-- Membership rows expired for longer than ? microseconds (relays that
-- were killed and never left): the relay's heartbeat removes them.
DELETE FROM {{.Members}} WHERE expires_at < CAST(unixepoch('subsec') * 1000 AS INTEGER) - (? / 1000)

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
-- Pending rows per relay partition: count and age of the oldest (the
-- lowest id's) in microseconds (database clock): the pending set once,
-- then one outbox row per partition by rowid.
SELECT s.partition_key, s.n,
       COALESCE((SELECT (CAST(unixepoch('subsec') * 1000 AS INTEGER) - o.created_at) * 1000 FROM {{.Table}} o WHERE o.id = s.first), 0)
FROM (SELECT partition_key, COUNT(*) AS n, MIN(id) AS first FROM {{.Pending}} GROUP BY partition_key) s
ORDER BY s.partition_key

-- name: stats_status
-- Rows per state, as (status, count): 0 pending (the pending set), 1 sent
-- (neither pending nor dead), 2 dead. Reads the whole table once.
SELECT 0, COUNT(*) FROM {{.Pending}}
UNION ALL
SELECT 1, MAX(0, (SELECT COUNT(*) FROM {{.Table}} WHERE status <> 2) - (SELECT COUNT(*) FROM {{.Pending}}))
UNION ALL
SELECT 2, COUNT(*) FROM {{.Table}} WHERE status = 2

-- name: retention_batch
-- Ids of sent rows (neither pending nor dead) written longer ago than the
-- retention (?: microseconds, against created_at), at most one batch
-- ({{"{{LIMIT}}"}}), oldest first.
SELECT o.id FROM {{.Table}} o
WHERE o.status <> 2 AND o.created_at < CAST(unixepoch('subsec') * 1000 AS INTEGER) - (? / 1000)
  AND NOT EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = o.id)
ORDER BY o.id
LIMIT {{"{{LIMIT}}"}}

-- name: retention_archive
-- Copies one batch of sent rows ({{"{{IDS}}"}}) to the archive table, with
-- status 1 (sent).
INSERT INTO {{.Archive}} (id, message_id, aggregate_type, aggregate_id, event_type, topic, partition_key, content_type,
                          payload, headers, status, attempts, next_retry_at, last_error, created_at, updated_at, sent_at)
SELECT id, message_id, aggregate_type, aggregate_id, event_type, topic, partition_key, content_type,
       payload, headers, 1, attempts, next_retry_at, last_error, created_at, updated_at, sent_at
FROM {{.Table}} o WHERE id IN ({{"{{IDS}}"}}) AND status <> 2
  AND NOT EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = o.id)

-- name: retention_delete
DELETE FROM {{.Table}} WHERE id IN ({{"{{IDS}}"}}) AND status <> 2
  AND NOT EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = {{.Table}}.id)

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
-- stored count. Reads the pending set once, so the relay runs it at start
-- and every PartitionCheckInterval.
SELECT COUNT(*) FROM {{.Pending}} WHERE partition_key >= ? OR partition_key < 0

-- name: set_partitions
-- relay.Repartition, the one way to change the stored count. ? = count.
UPDATE {{.Meta}} SET partitions = ?, updated_at = CAST(unixepoch('subsec') * 1000 AS INTEGER) WHERE id = 1

-- name: admin_counts
-- The admin page's overview, from indexes only: pending, dead and held
-- dead rows, each counted up to the cap (the three ?: the cap), through
-- the pending set and dead_idx; the lowest and highest id, and the age of the
-- lowest-id pending row in microseconds (database clock).
SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM {{.Pending}} LIMIT ?)),
       (SELECT COUNT(*) FROM (SELECT 1 FROM {{.Table}} WHERE status = 2 LIMIT ?)),
       (SELECT COUNT(*) FROM (SELECT 1 FROM {{.Table}} WHERE status = 2 AND next_retry_at IS NOT NULL LIMIT ?)),
       COALESCE((SELECT MIN(id) FROM {{.Table}}), 0),
       COALESCE((SELECT MAX(id) FROM {{.Table}}), 0),
       COALESCE((SELECT (CAST(unixepoch('subsec') * 1000 AS INTEGER) - o.created_at) * 1000
                 FROM {{.Table}} o WHERE o.id = (SELECT MIN(p.id) FROM {{.Pending}} p)), 0)

-- name: admin_backlog
-- Pending rows per relay partition among the first ? pending rows in id
-- order (the pending set): count and age of the oldest in microseconds.
SELECT partition_key, COUNT(*), (CAST(unixepoch('subsec') * 1000 AS INTEGER) - MIN(created_at)) * 1000
FROM (SELECT p.partition_key, o.created_at FROM {{.Pending}} p CROSS JOIN {{.Table}} o WHERE o.id = p.id ORDER BY p.id LIMIT ?)
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
-- placeholders, built in Go), in id order, without their payload, with
-- their state as a status (0 pending: in the pending set; 1 sent; 2 dead).
-- {{"{{INDEX}}"}}: an index hint (index_status or index_aggregate) or
-- nothing.
SELECT id, message_id, aggregate_type, aggregate_id, event_type, COALESCE(topic, ''), partition_key,
       CASE WHEN status = 2 THEN 2 WHEN EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = o.id) THEN 0 ELSE 1 END,
       attempts, COALESCE(last_error, ''), CASE WHEN next_retry_at IS NULL THEN 0 ELSE 1 END,
       created_at * 1000, updated_at * 1000, COALESCE(sent_at * 1000, 0)
FROM {{.Table}} o {{"{{INDEX}}"}}
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
/* dead_idx */

-- name: index_aggregate
-- No hint: the planner takes aggregate_idx if it exists.
/* aggregate_idx */
