-- name: now
SELECT clock_timestamp()

-- name: version
SELECT current_setting('server_version_num')::int

-- name: mark_sent
-- $1 = ids as a PostgreSQL array literal '{1,2,3}'. The statement's own
-- transaction commits without waiting for the WAL flush
-- (synchronous_commit off, set for this transaction only): the broker has
-- the messages already, and a mark lost in a database crash only makes
-- the relay send them again (same message IDs). WAL is flushed in order,
-- so what a crash loses is the latest marks, never one between kept ones.
-- It takes the flush (3 ms per mark on the benchmark machine) off the
-- relay's loop.
WITH async AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))
UPDATE {{.Table}}
SET status = 1, attempts = attempts + 1, sent_at = clock_timestamp(), updated_at = clock_timestamp(),
    next_retry_at = NULL
FROM async
WHERE id = ANY($1::bigint[]) AND status = 0 {{"{{FENCE}}"}}

-- name: mark_retry
-- $1 = delay in microseconds, $2 = error text, $3 = id.
UPDATE {{.Table}}
SET attempts = attempts + 1, next_retry_at = clock_timestamp() + ($1::bigint * interval '1 microsecond'),
    last_error = $2, updated_at = clock_timestamp()
WHERE id = $3 AND status = 0 {{"{{FENCE}}"}}

-- name: mark_dead
-- Dead rows keep next_retry_at = "never" so that they hold their aggregate.
-- $1 = error text, $2 = id.
UPDATE {{.Table}}
SET status = 2, attempts = attempts + 1, next_retry_at = 'infinity'::timestamptz, last_error = $1, updated_at = clock_timestamp()
WHERE id = $2 AND status = 0 {{"{{FENCE}}"}}

-- name: mark_dead_released
-- Dead, but not holding its aggregate (DeadLetterPolicy SkipDead).
-- $1 = error text, $2 = id.
UPDATE {{.Table}}
SET status = 2, attempts = attempts + 1, next_retry_at = NULL, last_error = $1, updated_at = clock_timestamp()
WHERE id = $2 AND status = 0 {{"{{FENCE}}"}}

-- name: insert
-- Multi-row INSERT written by the commit hook: the row template below is
-- repeated once per event ({{"{{ROWS}}"}}); its ? become the dialect's placeholders.
INSERT INTO {{.Table}} (id, message_id, aggregate_type, aggregate_id, event_type, topic, partition_key,
                        content_type, payload, headers, created_at, updated_at)
VALUES {{"{{ROWS}}"}}

-- name: insert_row_first
-- The first row takes the transaction's ID (txid_current() assigns one if
-- the transaction has none yet) before it takes an id from the sequence:
-- CASE evaluates its condition first, and neither call is folded at plan
-- time (both are volatile). The claim's floor proof relies on it (schema
-- version 6): a transaction that holds an id always shows as running in
-- the snapshots taken after it allocated that id. Later rows follow the
-- first, so they take their ids after the transaction ID too.
(CASE WHEN txid_current() IS NOT NULL THEN nextval('{{.Sequence}}') END, ?, ?, ?, ?, ?, ?, ?, ?, ?, clock_timestamp(), clock_timestamp())

-- name: insert_row
(DEFAULT, ?, ?, ?, ?, ?, ?, ?, ?, ?, clock_timestamp(), clock_timestamp())

-- name: dead_list
-- {{"{{INDEX}}"}}: the selector's index hint (index_status,
-- index_aggregate) or nothing.
-- Dead letters matching the selector (built in Go from column
-- names and placeholders only), oldest first. held: it still holds its
-- aggregate. dead_at: updated_at in Unix microseconds.
SELECT id, message_id, aggregate_type, aggregate_id, event_type, COALESCE(topic, ''),
       attempts, COALESCE(last_error, ''),
       CASE WHEN next_retry_at IS NULL THEN 0 ELSE 1 END,
       (EXTRACT(EPOCH FROM updated_at) * 1000000)::bigint
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
SET status = 0, attempts = 0, next_retry_at = NULL, updated_at = clock_timestamp()
WHERE id IN ({{"{{IDS}}"}}) AND status = 2

-- name: dead_skip
-- Stays failed, but releases its aggregate. {{"{{IDS}}"}}: ids from dead_ids.
UPDATE {{.Table}}
SET next_retry_at = NULL, updated_at = clock_timestamp()
WHERE id IN ({{"{{IDS}}"}}) AND status = 2 AND next_retry_at IS NOT NULL

-- name: fence
-- Appended to the relay's writes when leases are on: the row's partition
-- must still be leased to this instance (? = instance ID), unexpired by the
-- database clock. A stale owner's outcomes are rejected.
AND EXISTS (SELECT 1 FROM {{.Lease}} l
            WHERE l.partition_key = {{.Table}}.partition_key AND l.owner = ? AND l.expires_at > clock_timestamp())

-- name: lease_init
-- One row per partition, created once; {{"{{ROWS}}"}} is "(?, 0)" per partition.
INSERT INTO {{.Lease}} (partition_key, epoch) VALUES {{"{{ROWS}}"}} ON CONFLICT DO NOTHING

-- name: member_beat
-- ? = instance ID, lease TTL in microseconds, delivery mode (schema
-- version with the mode column).
INSERT INTO {{.Members}} (instance_id, expires_at, mode) VALUES (?, clock_timestamp() + (?::bigint * interval '1 microsecond'), ?)
ON CONFLICT (instance_id) DO UPDATE SET expires_at = EXCLUDED.expires_at, mode = EXCLUDED.mode

-- name: member_count
SELECT COUNT(*) FROM {{.Members}} WHERE expires_at > clock_timestamp()

-- name: member_census
-- Live instances, and one of them whose delivery mode differs from ? (the
-- caller's), as "instance (mode)", or NULL. The members table holds a row
-- per live instance (a few), so this reads a few rows.
SELECT COUNT(*), MIN(CASE WHEN mode <> ? THEN instance_id || ' (' || mode || ')' END) FROM {{.Members}} WHERE expires_at > clock_timestamp()

-- name: member_leave
DELETE FROM {{.Members}} WHERE instance_id = ?

-- name: lease_renew
-- Every lease of one instance in one statement: ? = TTL in microseconds,
-- instance ID. (The mark-sent fence is a plain read on PostgreSQL: it
-- takes no lock on lease rows, so this cannot deadlock with it; MySQL
-- renews one partition per statement, see its queries.sql.)
UPDATE {{.Lease}} SET expires_at = clock_timestamp() + (?::bigint * interval '1 microsecond')
WHERE owner = ? AND expires_at > clock_timestamp()

-- name: lease_mine
SELECT partition_key, epoch FROM {{.Lease}}
WHERE owner = ? AND expires_at > clock_timestamp()
ORDER BY partition_key

-- name: lease_free
SELECT partition_key FROM {{.Lease}}
WHERE owner IS NULL OR expires_at IS NULL OR expires_at <= clock_timestamp()
ORDER BY partition_key

-- name: lease_acquire
-- ? = instance ID, TTL in microseconds, partition. Raises the epoch: the
-- fencing token that tells this ownership from every earlier one.
UPDATE {{.Lease}} SET owner = ?, epoch = epoch + 1, expires_at = clock_timestamp() + (?::bigint * interval '1 microsecond')
WHERE partition_key = ? AND (owner IS NULL OR expires_at IS NULL OR expires_at <= clock_timestamp())

-- name: lease_acquire_many
-- lease_acquire for several partitions in one statement (one round trip
-- and one commit, where a relay taking its share of 32 partitions used to
-- wait for 32): ? = instance ID, TTL in microseconds, then the partitions
-- ({{"{{PARTITIONS}}"}} is one "?" per partition). Each row taken gets its
-- own epoch raise; rows another instance took first are left alone.
UPDATE {{.Lease}} SET owner = ?, epoch = epoch + 1, expires_at = clock_timestamp() + (?::bigint * interval '1 microsecond')
WHERE partition_key IN ({{"{{PARTITIONS}}"}}) AND (owner IS NULL OR expires_at IS NULL OR expires_at <= clock_timestamp())

-- name: lease_release
-- ? = partition, instance ID.
UPDATE {{.Lease}} SET owner = NULL, expires_at = NULL
WHERE partition_key = ? AND owner = ?

-- name: lease_owners
-- Every partition's owner, epoch and remaining lease in milliseconds
-- (negative: expired), for stats and tests.
SELECT partition_key, COALESCE(owner, ''), epoch,
       COALESCE(CAST(EXTRACT(EPOCH FROM expires_at - clock_timestamp()) * 1000 AS BIGINT), -1)
FROM {{.Lease}} ORDER BY partition_key

-- name: stats_pending
-- Pending rows per relay partition: count and age of the oldest in
-- microseconds (database clock).
SELECT partition_key, COUNT(*), COALESCE((EXTRACT(EPOCH FROM (clock_timestamp() - MIN(created_at))) * 1000000)::bigint, 0)
FROM {{.Table}} WHERE status = 0
GROUP BY partition_key ORDER BY partition_key

-- name: stats_status
SELECT status, COUNT(*) FROM {{.Table}} GROUP BY status ORDER BY status

-- name: retention_batch
-- Ids of sent rows older than the retention ($1/first ?: microseconds), at
-- most one batch ({{"{{LIMIT}}"}}), oldest first.
SELECT id FROM {{.Table}}
WHERE status = 1 AND sent_at < clock_timestamp() - ($1::bigint * interval '1 microsecond')
ORDER BY id
LIMIT {{"{{LIMIT}}"}}

-- name: retention_archive
-- Copies one batch of sent rows ({{"{{IDS}}"}}) to the archive table.
INSERT INTO {{.Archive}} SELECT * FROM {{.Table}} WHERE id IN ({{"{{IDS}}"}}) AND status = 1

-- name: retention_delete
DELETE FROM {{.Table}} WHERE id IN ({{"{{IDS}}"}}) AND status = 1

-- name: delete_sent
-- Mark-sent for DeleteOnPublish: acknowledged rows are deleted at once,
-- with synchronous_commit off as in mark_sent.
WITH async AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))
DELETE FROM {{.Table}} USING async WHERE id = ANY($1::bigint[]) AND status = 0 {{"{{FENCE}}"}}

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
UPDATE {{.Meta}} SET partitions = ?, updated_at = clock_timestamp() WHERE id = 1

-- name: claim_floor
-- The claim (schema version 6): the claim function, which plans its
-- statements independently of statistics and starts its index walk at
-- the relay's proven floor (see 0006_claim_floor.sql and relay/floor.go).
-- $1 floor, $2 floor epoch, $3 batch size, $4 ids to leave out (the batch
-- still being marked sent), $5 the relay's partitions, $6 the transaction
-- ID of the pending floor proof (NULL: none), $7 take a new proof.
SELECT kind, id, message_id, aggregate_type, aggregate_id, event_type, topic, partition_key,
       content_type, payload, headers, attempts, age_us,
       floor_epoch, resolved, pending_min, seq_last, xid
FROM {{.ClaimFunction}}($1::bigint, $2::bigint, $3::integer, $4::bigint[], $5::integer[], $6::bigint, $7::boolean)

-- name: floor_bump
-- Raised in the transaction of any change that makes rows pending again
-- (DeadLetters.Retry): relays then discard their scan floors.
UPDATE {{.Meta}} SET floor_epoch = floor_epoch + 1 WHERE id = 1

-- name: admin_counts
-- The admin page's overview, from indexes only: pending, dead and held
-- dead rows, each counted up to the cap (the three ?: the cap, then the
-- page shows "cap+"), through pending_idx and dead_idx; the lowest and
-- highest id (primary key ends), and the age of the lowest-id pending row
-- in microseconds (database clock).
SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM {{.Table}} WHERE status = 0 LIMIT ?) p),
       (SELECT COUNT(*) FROM (SELECT 1 FROM {{.Table}} WHERE status = 2 LIMIT ?) d),
       (SELECT COUNT(*) FROM (SELECT 1 FROM {{.Table}} WHERE status = 2 AND next_retry_at IS NOT NULL LIMIT ?) h),
       COALESCE((SELECT MIN(id) FROM {{.Table}}), 0),
       COALESCE((SELECT MAX(id) FROM {{.Table}}), 0),
       COALESCE((SELECT (EXTRACT(EPOCH FROM clock_timestamp() - created_at) * 1000000)::bigint
                 FROM {{.Table}} WHERE status = 0 ORDER BY id LIMIT 1), 0)

-- name: admin_backlog
-- Pending rows per relay partition among the first ? pending rows in id
-- order (pending_idx): count and age of the oldest in microseconds.
SELECT partition_key, COUNT(*), (EXTRACT(EPOCH FROM clock_timestamp() - MIN(created_at)) * 1000000)::bigint
FROM (SELECT partition_key, created_at FROM {{.Table}} WHERE status = 0 ORDER BY id LIMIT ?) s
GROUP BY partition_key

-- name: admin_held_partitions
-- Dead letters still holding their aggregate, per partition, among the
-- first ? dead rows (dead_idx).
SELECT partition_key, COUNT(*)
FROM (SELECT partition_key FROM {{.Table}} WHERE status = 2 AND next_retry_at IS NOT NULL ORDER BY id LIMIT ?) s
GROUP BY partition_key

-- name: admin_members
-- Relay instances with a membership row: ID, delivery mode, and the time
-- left on their heartbeat in microseconds (negative: expired).
SELECT instance_id, mode, (EXTRACT(EPOCH FROM expires_at - clock_timestamp()) * 1000000)::bigint
FROM {{.Members}} ORDER BY instance_id LIMIT 200

-- name: admin_events
-- Rows of any status matching {{"{{WHERE}}"}} (column names and
-- placeholders, built in Go), in id order, without their payload.
-- {{"{{INDEX}}"}}: an index hint (index_status or index_aggregate) or
-- nothing.
SELECT id, message_id, aggregate_type, aggregate_id, event_type, COALESCE(topic, ''), partition_key,
       status, attempts, COALESCE(last_error, ''), CASE WHEN next_retry_at IS NULL THEN 0 ELSE 1 END,
       (EXTRACT(EPOCH FROM created_at) * 1000000)::bigint, (EXTRACT(EPOCH FROM updated_at) * 1000000)::bigint,
       COALESCE((EXTRACT(EPOCH FROM sent_at) * 1000000)::bigint, 0)
FROM {{.Table}} {{"{{INDEX}}"}}
WHERE {{"{{WHERE}}"}}
ORDER BY id
LIMIT {{"{{LIMIT}}"}}

-- name: admin_event_body
-- One row's content type, payload and headers, by id.
SELECT content_type, payload, COALESCE(headers, '') FROM {{.Table}} WHERE id = ?

-- name: admin_older_than
-- A dead-letter filter: dead (or last acted on) at least ? microseconds
-- ago by the database clock.
updated_at <= clock_timestamp() - (?::bigint * interval '1 microsecond')

-- name: admin_aggregate_index
-- 1 if the optional aggregate index exists (lookup by aggregate needs it).
SELECT CASE WHEN to_regclass('{{.QualifiedIndex "aggregate_idx"}}') IS NULL THEN 0 ELSE 1 END

-- name: admin_aggregate_index_ddl
-- The optional aggregate index for lookups by aggregate. CONCURRENTLY:
-- writers are not blocked while it is built (run it outside a transaction).
CREATE INDEX CONCURRENTLY IF NOT EXISTS {{.Index "aggregate_idx"}} ON {{.IndexTable}} (aggregate_type, aggregate_id, id)

-- name: index_status
-- No hint: the planner takes the partial index of the status.
/* pending_idx or dead_idx */

-- name: index_aggregate
-- No hint: the planner takes aggregate_idx if it exists.
/* aggregate_idx */
