-- name: now
SELECT UTC_TIMESTAMP(6)

-- name: version
SELECT VERSION()

-- name: claim
-- Pending rows whose retry is due, in id order, except rows behind an
-- earlier row of the same aggregate that holds it: one waiting for a retry
-- (next_retry_at in the future) or dead (next_retry_at = never). The
-- pending set (schema version 6) is walked in id order by its primary key
-- and each row read by the outbox table's primary key (STRAIGHT_JOIN and
-- FORCE INDEX: the walk stays in id order, so LIMIT stops it early
-- instead of sorting the whole backlog, whatever the statistics say). The
-- held rows are few; the UNION (two ranges of status_retry_idx) keeps
-- MariaDB from merging them into a correlated probe, which it could only
-- bound by the aggregate (every pending or sent row of it), never by
-- next_retry_at. Materialized once per statement, they are probed by key
-- per candidate. FORCE INDEX keeps each half of the UNION on its range of
-- status_retry_idx whatever the estimates say: with no dead letters
-- MariaDB 10.11 took the status = 2 half by status_id_idx (type=ref on
-- status alone), a plan that reads every dead letter, released ones
-- included, once the estimates mislead it.
-- {{"{{PARTITIONS}}"}} also carries the ids to leave out
-- (Dialect.ClaimExcluding) as "p.id NOT BETWEEN a AND b" / "p.id <> a":
-- conditions on the pending set's primary key, so the range optimizer
-- cuts them out of the scanned range (type=range) and their records,
-- delete-marked or still pending, are never visited. ? = batch size.
-- The relay runs this text twice per claim that returns rows: the second
-- time (Dialect.ClaimLate) with those rows left out and "p.id < " their
-- highest id, for rows its first read view did not show (relay/doc.go,
-- "Late rows").
SELECT o.id, o.message_id, o.aggregate_type, o.aggregate_id, o.event_type,
       COALESCE(o.topic, ''), o.partition_key, o.content_type, o.payload,
       COALESCE(o.headers, ''), o.attempts,
       TIMESTAMPDIFF(MICROSECOND, o.created_at, UTC_TIMESTAMP(6))
FROM {{.Pending}} p FORCE INDEX (PRIMARY)
STRAIGHT_JOIN {{.Table}} o FORCE INDEX (PRIMARY) ON o.id = p.id
WHERE o.status = 0
  AND (o.next_retry_at IS NULL OR o.next_retry_at <= UTC_TIMESTAMP(6))
  AND NOT EXISTS (
        SELECT 1 FROM (
            SELECT aggregate_type, aggregate_id, id FROM {{.Table}} FORCE INDEX ({{.Index "status_retry_idx"}})
            WHERE status = 2 AND next_retry_at > UTC_TIMESTAMP(6)
            UNION ALL
            SELECT aggregate_type, aggregate_id, id FROM {{.Table}} FORCE INDEX ({{.Index "status_retry_idx"}})
            WHERE status = 0 AND next_retry_at > UTC_TIMESTAMP(6)
        ) h
        WHERE h.aggregate_type = o.aggregate_type AND h.aggregate_id = o.aggregate_id AND h.id < o.id)
  {{"{{PARTITIONS}}"}}
ORDER BY p.id
LIMIT ?

-- name: mark_sent
-- Deletes the published events' rows from the pending set (schema
-- version 6): one clustered-index record each; the outbox rows are not
-- touched. The id list ({{"{{IDS}}"}}) is expanded to one placeholder per
-- id, at most Dialect.MaxIDs (500) per statement. FORCE INDEX (PRIMARY),
-- which only the multi-table syntax takes in MariaDB 10.11, makes it one
-- primary-key lookup per id (EXPLAIN: type=range, key=PRIMARY, rows =
-- ids), so it locks exactly its batch's records: left to itself MariaDB
-- scans the small pending set whole (type=ALL) and, under REPEATABLE
-- READ, waits on the record of every writer whose COMMIT has not
-- completed (TestMySQLRelayNoLockWaitsUnderWriters). At 1,000 ids
-- (in_predicate_conversion_threshold) MariaDB would turn the list into a
-- join with a derived table and scan again. The fence probes the lease
-- table's primary key per row, with the shared locks of fence.
DELETE o FROM {{.Pending}} AS o FORCE INDEX (PRIMARY) WHERE o.id IN ({{"{{IDS}}"}}) {{"{{FENCE}}"}}

-- name: mark_sent_retried
-- Marks sent the published events that had failed before (attempts > 0),
-- by primary key as mark_retry: status 1, next_retry_at cleared, sent_at
-- set; the update trigger removes them from the pending set. Rare: only
-- messages that failed at least once. Run before mark_sent.
UPDATE {{.Table}} AS o FORCE INDEX (PRIMARY)
SET o.status = 1, o.sent_at = UTC_TIMESTAMP(6), o.updated_at = UTC_TIMESTAMP(6), o.next_retry_at = NULL
WHERE o.id IN ({{"{{IDS}}"}}) AND o.status = 0 AND o.attempts > 0 {{"{{FENCE}}"}}

-- name: mark_retry
-- One row by primary key (FORCE INDEX as in mark_sent: it locks that row
-- only). Unlike PostgreSQL and SQLite it does not check the pending set:
-- MySQL refuses a statement that reads a table its triggers write (error
-- 1442, "already used by statement which invoked this stored
-- function/trigger"). The relay only marks a message it claimed (pending)
-- within its lease, which the fence checks.
UPDATE {{.Table}} AS o FORCE INDEX (PRIMARY)
SET o.attempts = o.attempts + 1, o.next_retry_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
    o.last_error = ?, o.updated_at = UTC_TIMESTAMP(6)
WHERE o.id = ? AND o.status = 0 {{"{{FENCE}}"}}

-- name: mark_dead
-- Dead rows keep next_retry_at = "never" so that they hold their aggregate.
UPDATE {{.Table}} AS o FORCE INDEX (PRIMARY)
SET o.status = 2, o.attempts = o.attempts + 1, o.next_retry_at = '9999-12-31 23:59:59.999999', o.last_error = ?, o.updated_at = UTC_TIMESTAMP(6)
WHERE o.id = ? AND o.status = 0 {{"{{FENCE}}"}}

-- name: mark_dead_released
-- Dead, but not holding its aggregate (DeadLetterPolicy SkipDead).
UPDATE {{.Table}} AS o FORCE INDEX (PRIMARY)
SET o.status = 2, o.attempts = o.attempts + 1, o.next_retry_at = NULL, o.last_error = ?, o.updated_at = UTC_TIMESTAMP(6)
WHERE o.id = ? AND o.status = 0 {{"{{FENCE}}"}}

-- name: insert
-- Multi-row INSERT written by the commit hook: the row template below is
-- repeated once per event ({{"{{ROWS}}"}}); its ? become the dialect's placeholders.
INSERT INTO {{.Table}} (message_id, aggregate_type, aggregate_id, event_type, topic, partition_key,
                        content_type, payload, headers, created_at, updated_at)
VALUES {{"{{ROWS}}"}}

-- name: insert_row
(?, ?, ?, ?, ?, ?, ?, ?, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))

-- name: dead_list
-- {{"{{INDEX}}"}}: the selector's index hint (index_status,
-- index_aggregate) or nothing.
-- Dead letters matching the selector (built in Go from column
-- names and placeholders only), oldest first. held: it still holds its
-- aggregate. dead_at: updated_at in Unix microseconds.
SELECT id, message_id, aggregate_type, aggregate_id, event_type, COALESCE(topic, ''),
       attempts, COALESCE(last_error, ''),
       CASE WHEN next_retry_at IS NULL THEN 0 ELSE 1 END,
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', updated_at)
FROM {{.Table}} {{"{{INDEX}}"}}
WHERE status = 2 AND {{"{{WHERE}}"}}
ORDER BY id
LIMIT {{"{{LIMIT}}"}}

-- name: dead_ids
-- Ids of the dead letters matching the selector (as dead_list; a plain
-- read, it locks nothing), for dead_retry and dead_skip. Updating by the
-- selector itself scanned the whole PRIMARY index when most rows were
-- dead (type=index), or every row of the aggregate (index_merge with
-- aggregate_idx), and under REPEATABLE READ waited on any uncommitted
-- writer's row there.
SELECT id FROM {{.Table}} {{"{{INDEX}}"}}
WHERE status = 2 AND {{"{{WHERE}}"}}
ORDER BY id

-- name: dead_retry
-- Back to pending with a fresh attempt budget. Its id is lower than any
-- event it held, so the claim hands it out first: order is kept.
-- {{"{{IDS}}"}}: ids from dead_ids, by primary key as mark_sent.
UPDATE {{.Table}} AS o FORCE INDEX (PRIMARY)
SET o.status = 0, o.attempts = 0, o.next_retry_at = NULL, o.updated_at = UTC_TIMESTAMP(6)
WHERE o.id IN ({{"{{IDS}}"}}) AND o.status = 2

-- name: dead_skip
-- Stays failed, but releases its aggregate. {{"{{IDS}}"}}: ids from dead_ids.
UPDATE {{.Table}} AS o FORCE INDEX (PRIMARY)
SET o.next_retry_at = NULL, o.updated_at = UTC_TIMESTAMP(6)
WHERE o.id IN ({{"{{IDS}}"}}) AND o.status = 2 AND o.next_retry_at IS NOT NULL

-- name: pending_list
-- Pending events (in the pending set) matching the selector ({{"{{WHERE}}"}},
-- built in Go from column names and placeholders only), oldest first, for
-- an operator who dead-letters them (DeadLetters.ListPending). A plain
-- read: it locks nothing. created: created_at in Unix microseconds.
SELECT id, message_id, aggregate_type, aggregate_id, event_type, COALESCE(topic, ''),
       attempts, COALESCE(last_error, ''),
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at)
FROM {{.Table}}
WHERE id IN (SELECT p.id FROM {{.Pending}} p) AND status = 0 AND {{"{{WHERE}}"}}
ORDER BY id
LIMIT {{"{{LIMIT}}"}}

-- name: pending_list_all
-- Every pending event, oldest first, at most {{"{{LIMIT}}"}}
-- (DeadLetters.ListPending with Selector.All): the pending set's primary
-- key walked in id order, each row read by the outbox table's primary key
-- (STRAIGHT_JOIN and FORCE INDEX, as the claim), so the cost is the rows
-- listed, not the sent history. A plain read: it locks nothing.
SELECT o.id, o.message_id, o.aggregate_type, o.aggregate_id, o.event_type, COALESCE(o.topic, ''),
       o.attempts, COALESCE(o.last_error, ''),
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', o.created_at)
FROM {{.Pending}} p FORCE INDEX (PRIMARY)
STRAIGHT_JOIN {{.Table}} o FORCE INDEX (PRIMARY) ON o.id = p.id
WHERE o.status = 0
ORDER BY p.id
LIMIT {{"{{LIMIT}}"}}

-- name: pending_lock
-- The first step of DeadLetters.DeadLetterPending, in its transaction:
-- locks, by primary key, the pending-set rows of the confirmed ids
-- ({{"{{IDS}}"}}) that are still pending. pending_dead cannot check the
-- pending set itself (error 1442: its triggers write that table), so this
-- lock stands in: a relay's mark-sent (a DELETE of those rows) waits for
-- this transaction, and one that committed first has removed them, so
-- they are not returned and stay sent.
SELECT p.id FROM {{.Pending}} p FORCE INDEX (PRIMARY) WHERE p.id IN ({{"{{IDS}}"}}) ORDER BY p.id FOR UPDATE

-- name: pending_dead
-- Dead-letters pending events on an operator's word (not an attempt:
-- attempts unchanged), holding their aggregate as mark_dead does. ? = the
-- error text; {{"{{IDS}}"}}: the ids pending_lock returned and locked. The
-- update trigger removes them from the pending set.
UPDATE {{.Table}} AS o FORCE INDEX (PRIMARY)
SET o.status = 2, o.next_retry_at = '9999-12-31 23:59:59.999999', o.last_error = ?, o.updated_at = UTC_TIMESTAMP(6)
WHERE o.id IN ({{"{{IDS}}"}}) AND o.status = 0

-- name: pending_dead_released
-- pending_dead that does not hold the aggregate (as mark_dead_released).
UPDATE {{.Table}} AS o FORCE INDEX (PRIMARY)
SET o.status = 2, o.next_retry_at = NULL, o.last_error = ?, o.updated_at = UTC_TIMESTAMP(6)
WHERE o.id IN ({{"{{IDS}}"}}) AND o.status = 0

-- name: fence
-- Appended to the relay's writes when leases are on (the outbox table is
-- aliased o in them): the row's partition must still be leased to this
-- instance (? = instance ID), unexpired by the database clock. A stale
-- owner's outcomes are rejected. Under REPEATABLE READ InnoDB reads the
-- lease rows of a writing statement with shared locks, taken in the order
-- of the statement's rows' partitions; lease writes (lease_renew,
-- lease_acquire, lease_release) therefore each change one lease row by
-- primary key, so none holds one lease row while waiting for another and
-- none can close a deadlock cycle with this fence.
AND EXISTS (SELECT 1 FROM {{.Lease}} l
            WHERE l.partition_key = o.partition_key AND l.owner = ? AND l.expires_at > UTC_TIMESTAMP(6))

-- name: lease_init
-- One row per partition, created once; {{"{{ROWS}}"}} is "(?, 0)" per partition.
INSERT IGNORE INTO {{.Lease}} (partition_key, epoch) VALUES {{"{{ROWS}}"}}

-- name: member_beat
-- ? = instance ID, lease TTL in microseconds, delivery mode (schema
-- version with the mode column).
INSERT INTO {{.Members}} (instance_id, expires_at, mode) VALUES (?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, ?)
ON DUPLICATE KEY UPDATE expires_at = VALUES(expires_at), mode = VALUES(mode)

-- name: member_count
SELECT COUNT(*) FROM {{.Members}} WHERE expires_at > UTC_TIMESTAMP(6)

-- name: member_census
-- Live instances, and one of them whose delivery mode differs from ? (the
-- caller's), as "instance (mode)", or NULL. The members table holds a row
-- per live instance (a few), so this reads a few rows.
SELECT COUNT(*), MIN(CASE WHEN mode <> ? THEN CONCAT(instance_id, ' (', mode, ')') END) FROM {{.Members}} WHERE expires_at > UTC_TIMESTAMP(6)

-- name: member_leave
DELETE FROM {{.Members}} WHERE instance_id = ?

-- name: member_prune
-- Membership rows expired for longer than ? microseconds (relays that
-- were killed and never left): the relay's heartbeat removes them.
DELETE FROM {{.Members}} WHERE expires_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND

-- name: lease_renew_one
-- One partition by primary key: ? = TTL in microseconds, partition,
-- instance ID. (Renewing all of an owner's rows in one statement scanned
-- the lease table under REPEATABLE READ and locked every row, its own in
-- ascending order and everyone else's: it deadlocked with the fence of a
-- mark-sent, which holds shared locks on lease rows in its rows' order.)
UPDATE {{.Lease}} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE partition_key = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)

-- name: lease_mine
SELECT partition_key, epoch FROM {{.Lease}}
WHERE owner = ? AND expires_at > UTC_TIMESTAMP(6)
ORDER BY partition_key

-- name: lease_free
SELECT partition_key FROM {{.Lease}}
WHERE owner IS NULL OR expires_at IS NULL OR expires_at <= UTC_TIMESTAMP(6)
ORDER BY partition_key

-- name: lease_acquire
-- ? = instance ID, TTL in microseconds, partition. Raises the epoch: the
-- fencing token that tells this ownership from every earlier one.
UPDATE {{.Lease}} SET owner = ?, epoch = epoch + 1, expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE partition_key = ? AND (owner IS NULL OR expires_at IS NULL OR expires_at <= UTC_TIMESTAMP(6))

-- name: lease_lock_free
-- The first statement of a transaction taking several partitions at once:
-- locks those of the listed partitions ({{"{{PARTITIONS}}"}}: one "?" each)
-- that are free, skipping any row another transaction holds a lock on (a
-- mark-sent fence's shared lock, another instance's acquisition). It never
-- waits, so the transaction never holds one lease row while waiting for
-- another, the wait that closed deadlock cycles with the fence
-- (Dialect.RenewsLeasesOneByOne); lease_acquire_many then updates exactly
-- the rows it locked.
SELECT partition_key FROM {{.Lease}} FORCE INDEX (PRIMARY)
WHERE partition_key IN ({{"{{PARTITIONS}}"}}) AND (owner IS NULL OR expires_at IS NULL OR expires_at <= UTC_TIMESTAMP(6))
ORDER BY partition_key
FOR UPDATE SKIP LOCKED

-- name: lease_acquire_many
-- lease_acquire for several partitions in one statement, after
-- lease_lock_free locked them in the same transaction: ? = instance ID,
-- TTL in microseconds, then the partitions ({{"{{PARTITIONS}}"}}).
-- FORCE INDEX (PRIMARY), as in mark_sent: left to itself MariaDB scans the
-- whole 32-row table for such a list and, under REPEATABLE READ, waits on
-- the row it just skipped (seen in TestLeaseAcquireSkipsLockedRows).
UPDATE {{.Lease}} FORCE INDEX (PRIMARY) SET owner = ?, epoch = epoch + 1, expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
WHERE partition_key IN ({{"{{PARTITIONS}}"}}) AND (owner IS NULL OR expires_at IS NULL OR expires_at <= UTC_TIMESTAMP(6))

-- name: lease_release
-- ? = partition, instance ID.
UPDATE {{.Lease}} SET owner = NULL, expires_at = NULL
WHERE partition_key = ? AND owner = ?

-- name: lease_owners
-- Every partition's owner, epoch and remaining lease in milliseconds
-- (negative: expired), for stats and tests.
SELECT partition_key, COALESCE(owner, ''), epoch,
       COALESCE(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) DIV 1000, -1)
FROM {{.Lease}} ORDER BY partition_key

-- name: stats_pending
-- Pending rows per relay partition: count and age of the oldest (the
-- lowest id's) in microseconds (database clock): the pending set once,
-- then one outbox row per partition by primary key.
SELECT s.partition_key, s.n,
       COALESCE((SELECT TIMESTAMPDIFF(MICROSECOND, o.created_at, UTC_TIMESTAMP(6)) FROM {{.Table}} o WHERE o.id = s.first), 0)
FROM (SELECT partition_key, COUNT(*) AS n, MIN(id) AS first FROM {{.Pending}} GROUP BY partition_key) s
ORDER BY s.partition_key

-- name: stats_status
-- Rows per state, as (status, count): 0 pending (the pending set), 1 sent
-- (neither pending nor dead), 2 dead. Reads the whole table once.
SELECT 0, COUNT(*) FROM {{.Pending}}
UNION ALL
SELECT 1, GREATEST(0, (SELECT COUNT(*) FROM {{.Table}} WHERE status <> 2) - (SELECT COUNT(*) FROM {{.Pending}}))
UNION ALL
SELECT 2, COUNT(*) FROM {{.Table}} WHERE status = 2

-- name: retention_batch
-- Ids of sent rows (neither pending nor dead) written longer ago than the
-- retention (?: microseconds, against created_at), at most one batch
-- ({{"{{LIMIT}}"}}), oldest first.
SELECT o.id FROM {{.Table}} AS o FORCE INDEX (PRIMARY)
WHERE o.status <> 2 AND o.created_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
  AND NOT EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = o.id)
ORDER BY o.id
LIMIT {{"{{LIMIT}}"}}

-- name: retention_archive
-- Copies one chunk of sent rows ({{"{{IDS}}"}}, at most Dialect.MaxIDs) to the
-- archive table, by primary key: INSERT ... SELECT reads with shared locks
-- under REPEATABLE READ, and without FORCE INDEX MariaDB read every sent
-- row through the status index (type=ref) or the whole table (type=ALL).
INSERT INTO {{.Archive}} (id, message_id, aggregate_type, aggregate_id, event_type, topic, partition_key, content_type,
                          payload, headers, status, attempts, next_retry_at, last_error, created_at, updated_at, sent_at)
SELECT o.id, o.message_id, o.aggregate_type, o.aggregate_id, o.event_type, o.topic, o.partition_key, o.content_type,
       o.payload, o.headers, 1, o.attempts, o.next_retry_at, o.last_error, o.created_at, o.updated_at, o.sent_at
FROM {{.Table}} AS o FORCE INDEX (PRIMARY) WHERE o.id IN ({{"{{IDS}}"}}) AND o.status <> 2
  AND NOT EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = o.id)

-- name: retention_delete
-- Ids from retention_batch (sent rows: a sent row never becomes pending
-- again, except by hand); not checked against the pending set again, which
-- the delete trigger writes (MySQL error 1442, see mark_retry).
-- By primary key (multi-table syntax: MariaDB 10.11's single-table DELETE
-- takes no index hint); without it MariaDB scanned the whole table
-- (type=ALL) for a few hundred ids, locking every row and gap: writers'
-- INSERTs waited for retention, retention for any uncommitted writer. At
-- most Dialect.MaxIDs ids: at 1,000 (in_predicate_conversion_threshold)
-- MariaDB turns the list into a join with a derived table and scans again.
DELETE o FROM {{.Table}} AS o FORCE INDEX (PRIMARY) WHERE o.id IN ({{"{{IDS}}"}}) AND o.status <> 2

-- name: delete_sent
-- Mark-sent for DeleteOnPublish: acknowledged rows are deleted at once, by
-- primary key and at most Dialect.MaxIDs at a time, as retention_delete.
DELETE o FROM {{.Table}} AS o FORCE INDEX (PRIMARY) WHERE o.id IN ({{"{{IDS}}"}}) AND o.status = 0 {{"{{FENCE}}"}}

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
UPDATE {{.Meta}} SET partitions = ?, updated_at = UTC_TIMESTAMP(6) WHERE id = 1

-- name: admin_counts
-- The admin page's overview, from indexes only: pending, dead and held
-- dead rows, each counted up to the cap (the three ?: the cap), through
-- the pending set and status_id_idx; the lowest and highest id, and the
-- age of the lowest-id pending row in microseconds (database clock).
SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM {{.Pending}} LIMIT ?) p),
       (SELECT COUNT(*) FROM (SELECT 1 FROM {{.Table}} WHERE status = 2 LIMIT ?) d),
       (SELECT COUNT(*) FROM (SELECT 1 FROM {{.Table}} FORCE INDEX ({{.IndexName "status_retry_idx"}}) WHERE status = 2 AND next_retry_at IS NOT NULL LIMIT ?) h),
       COALESCE((SELECT MIN(id) FROM {{.Table}}), 0),
       COALESCE((SELECT MAX(id) FROM {{.Table}}), 0),
       COALESCE((SELECT TIMESTAMPDIFF(MICROSECOND, o.created_at, UTC_TIMESTAMP(6))
                 FROM {{.Table}} o WHERE o.id = (SELECT MIN(p.id) FROM {{.Pending}} p)), 0)

-- name: admin_backlog
-- Pending rows per relay partition among the first ? pending rows in id
-- order: count and age of the oldest in microseconds.
SELECT partition_key, COUNT(*), TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6))
FROM (SELECT p.partition_key, o.created_at FROM {{.Pending}} p FORCE INDEX (PRIMARY)
      STRAIGHT_JOIN {{.Table}} o FORCE INDEX (PRIMARY) ON o.id = p.id ORDER BY p.id LIMIT ?) s
GROUP BY partition_key

-- name: admin_held_partitions
-- Dead letters still holding their aggregate, per partition, among the
-- first ? dead rows (status_id_idx).
SELECT partition_key, COUNT(*)
FROM (SELECT partition_key FROM {{.Table}} FORCE INDEX ({{.Index "status_id_idx"}}) WHERE status = 2 AND next_retry_at IS NOT NULL ORDER BY id LIMIT ?) s
GROUP BY partition_key

-- name: admin_members
-- Relay instances with a membership row: ID, delivery mode, and the time
-- left on their heartbeat in microseconds (negative: expired).
SELECT instance_id, mode, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at)
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
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', created_at),
       TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', updated_at),
       COALESCE(TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', sent_at), 0)
FROM {{.Table}} AS o {{"{{INDEX}}"}}
WHERE {{"{{WHERE}}"}}
ORDER BY id
LIMIT {{"{{LIMIT}}"}}

-- name: admin_event_body
-- One row's content type, payload and headers, by id.
SELECT content_type, payload, COALESCE(headers, '') FROM {{.Table}} WHERE id = ?

-- name: admin_older_than
-- A dead-letter filter: dead (or last acted on) at least ? microseconds
-- ago by the database clock.
updated_at <= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND

-- name: admin_aggregate_index
-- 1: MySQL/MariaDB tables have had aggregate_idx since schema version 1.
SELECT 1

-- name: admin_aggregate_index_ddl
-- Nothing to create: aggregate_idx is part of schema version 1.
SELECT 1

-- name: index_status
-- A listing's hint for a filter on status (admin_events, dead_list, dead_ids): with ORDER BY id LIMIT, the
-- optimizer otherwise walks the primary key through the sent history
-- (EXPLAIN: type index, key PRIMARY, every row); (status, id) keeps the
-- id order within one status.
FORCE INDEX ({{.Index "status_id_idx"}})

-- name: index_aggregate
-- A listing's hint for a filter on one aggregate: (aggregate_type,
-- aggregate_id, id) keeps the id order within the aggregate.
FORCE INDEX ({{.Index "aggregate_idx"}})
