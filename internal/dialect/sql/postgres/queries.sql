-- name: now
SELECT clock_timestamp()

-- name: version
SELECT current_setting('server_version_num')::int

-- name: mark_sent
-- Deletes the published events' rows from the pending set (schema
-- version 9): one primary-key probe and one small WAL record each; the
-- outbox rows are not touched. $1 = ids as a PostgreSQL array literal
-- '{1,2,3}'. {{"{{FENCE_BATCH}}"}}: the lease fence, read once for the
-- statement. The statement's own transaction commits without waiting for
-- the WAL flush (synchronous_commit off, set for this transaction only):
-- the broker has the messages already, and a mark lost in a database crash
-- only makes the relay send them again (same message IDs). WAL is flushed
-- in order, so what a crash loses is the latest marks, never one between
-- kept ones.
WITH async AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))
DELETE FROM {{.Pending}} USING async
WHERE id = ANY($1::bigint[]) {{"{{FENCE_BATCH}}"}}

-- name: mark_sent_durable
-- mark_sent whose commit waits for the WAL flush (the relay's exactly-once
-- mode: a transaction's manifest lists only the batch before it whose mark
-- is not confirmed, so a confirmed mark must survive a database crash).
DELETE FROM {{.Pending}}
WHERE id = ANY($1::bigint[]) {{"{{FENCE_BATCH}}"}}

-- name: mark_sent_retried
-- Marks sent the published events that had failed before (attempts > 0):
-- their row carries a retry time that would stay in held_idx, so they are
-- updated (status 1, next_retry_at cleared, sent_at set), and the update
-- trigger removes them from the pending set. Rare: only messages that
-- failed at least once. Run before mark_sent. $1 = ids.
WITH async AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))
UPDATE {{.Table}}
SET status = 1, sent_at = clock_timestamp(), updated_at = clock_timestamp(), next_retry_at = NULL
FROM async
WHERE id = ANY($1::bigint[]) AND status = 0 AND attempts > 0 {{"{{FENCE}}"}}

-- name: mark_sent_retried_durable
-- mark_sent_retried whose commit waits for the WAL flush (see
-- mark_sent_durable).
UPDATE {{.Table}}
SET status = 1, sent_at = clock_timestamp(), updated_at = clock_timestamp(), next_retry_at = NULL
WHERE id = ANY($1::bigint[]) AND status = 0 AND attempts > 0 {{"{{FENCE}}"}}

-- name: mark_retry
-- $1 = delay in microseconds, $2 = error text, $3 = id. Only a pending row
-- (in the pending set): status 0 alone is also a sent row since schema
-- version 9.
UPDATE {{.Table}}
SET attempts = attempts + 1, next_retry_at = clock_timestamp() + ($1::bigint * interval '1 microsecond'),
    last_error = $2, updated_at = clock_timestamp()
WHERE id = $3 AND status = 0 AND EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = {{.Table}}.id) {{"{{FENCE}}"}}

-- name: mark_dead
-- Dead rows keep next_retry_at = "never" so that they hold their aggregate.
-- $1 = error text, $2 = id.
UPDATE {{.Table}}
SET status = 2, attempts = attempts + 1, next_retry_at = 'infinity'::timestamptz, last_error = $1, updated_at = clock_timestamp()
WHERE id = $2 AND status = 0 AND EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = {{.Table}}.id) {{"{{FENCE}}"}}

-- name: mark_dead_released
-- Dead, but not holding its aggregate (DeadLetterPolicy SkipDead).
-- $1 = error text, $2 = id.
UPDATE {{.Table}}
SET status = 2, attempts = attempts + 1, next_retry_at = NULL, last_error = $1, updated_at = clock_timestamp()
WHERE id = $2 AND status = 0 AND EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = {{.Table}}.id) {{"{{FENCE}}"}}

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

-- name: pending_list
-- Pending events (in the pending set) matching the selector ({{"{{WHERE}}"}},
-- built in Go from column names and placeholders only), oldest first, for
-- an operator who dead-letters them (DeadLetters.ListPending). The pending
-- set is small (the backlog), so the statement starts from it.
-- created: created_at in Unix microseconds.
SELECT id, message_id, aggregate_type, aggregate_id, event_type, COALESCE(topic, ''),
       attempts, COALESCE(last_error, ''),
       (EXTRACT(EPOCH FROM created_at) * 1000000)::bigint
FROM {{.Table}}
WHERE id IN (SELECT p.id FROM {{.Pending}} p) AND status = 0 AND {{"{{WHERE}}"}}
ORDER BY id
LIMIT {{"{{LIMIT}}"}}

-- name: pending_list_all
-- Every pending event, oldest first, at most {{"{{LIMIT}}"}}
-- (DeadLetters.ListPending with Selector.All): the pending set's primary
-- key walked in id order, each row read by the outbox table's primary key
-- in a LATERAL subquery that cannot be pulled up (OFFSET 0), so the plan
-- starts from the pending set whatever the statistics say: the cost is
-- the pending set's (the rows listed, and the index entries of rows
-- marked sent that VACUUM has not removed yet), not the sent history's
-- (TestListAllPendingCostFlat).
SELECT o.id, o.message_id, o.aggregate_type, o.aggregate_id, o.event_type, o.topic,
       o.attempts, o.last_error, o.created
FROM {{.Pending}} p
CROSS JOIN LATERAL (
    SELECT x.id, x.message_id, x.aggregate_type, x.aggregate_id, x.event_type, COALESCE(x.topic, '') AS topic,
           x.attempts, COALESCE(x.last_error, '') AS last_error,
           (EXTRACT(EPOCH FROM x.created_at) * 1000000)::bigint AS created
    FROM {{.Table}} x WHERE x.id = p.id AND x.status = 0 OFFSET 0) o
ORDER BY p.id
LIMIT {{"{{LIMIT}}"}}

-- name: pending_lock
-- The first step of DeadLetters.DeadLetterPending, in its transaction:
-- locks the pending-set rows of the confirmed ids ({{"{{IDS}}"}}) that are
-- still pending. A relay's mark-sent (a DELETE of those rows) then waits
-- for this transaction, and one that committed first has removed them, so
-- they are not returned and stay sent.
SELECT p.id FROM {{.Pending}} p WHERE p.id IN ({{"{{IDS}}"}}) ORDER BY p.id FOR UPDATE

-- name: pending_dead
-- Dead-letters pending events on an operator's word (not an attempt:
-- attempts unchanged), holding their aggregate as mark_dead does. ? = the
-- error text; {{"{{IDS}}"}}: the ids pending_lock returned. The update
-- trigger removes them from the pending set.
UPDATE {{.Table}}
SET status = 2, next_retry_at = 'infinity'::timestamptz, last_error = ?, updated_at = clock_timestamp()
WHERE id IN ({{"{{IDS}}"}}) AND status = 0 AND EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = {{.Table}}.id)

-- name: pending_dead_released
-- pending_dead that does not hold the aggregate (as mark_dead_released).
UPDATE {{.Table}}
SET status = 2, next_retry_at = NULL, last_error = ?, updated_at = clock_timestamp()
WHERE id IN ({{"{{IDS}}"}}) AND status = 0 AND EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = {{.Table}}.id)

-- name: fence
-- Appended to the relay's writes when leases are on: the row's partition
-- must still be leased to this instance (? = instance ID), unexpired by the
-- database clock. A stale owner's outcomes are rejected.
AND EXISTS (SELECT 1 FROM {{.Lease}} l
            WHERE l.partition_key = {{.Table}}.partition_key AND l.owner = ? AND l.expires_at > clock_timestamp())

-- name: fence_batch
-- The lease fence of a statement over many rows (mark_sent,
-- delete_sent): the partitions leased to this instance (? = instance ID)
-- and unexpired by the database clock, read once for the statement (an
-- InitPlan) instead of one probe of the lease table per row. A stale
-- owner's outcomes are rejected as with fence.
AND partition_key = ANY(ARRAY(SELECT l.partition_key FROM {{.Lease}} l
                              WHERE l.owner = ? AND l.expires_at > clock_timestamp()))

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

-- name: member_prune
-- Membership rows expired for longer than ? microseconds (relays that
-- were killed and never left): the relay's heartbeat removes them.
DELETE FROM {{.Members}} WHERE expires_at < clock_timestamp() - (?::bigint * interval '1 microsecond')

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
-- Pending rows per relay partition: count and age of the oldest (the
-- lowest id's) in microseconds (database clock). Reads the pending set
-- once and one outbox row per partition, by primary key (a join would let
-- the planner hash the whole outbox table, history included).
SELECT s.partition_key, s.n,
       COALESCE((SELECT (EXTRACT(EPOCH FROM (clock_timestamp() - o.created_at)) * 1000000)::bigint
                 FROM {{.Table}} o WHERE o.id = s.first), 0)
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
-- retention ($1/first ?: microseconds, against created_at), at most one
-- batch ({{"{{LIMIT}}"}}), oldest first.
SELECT o.id FROM {{.Table}} o
WHERE o.status <> 2 AND o.created_at < clock_timestamp() - ($1::bigint * interval '1 microsecond')
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
DELETE FROM {{.Table}} o WHERE id IN ({{"{{IDS}}"}}) AND status <> 2
  AND NOT EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = o.id)

-- name: delete_sent
-- Mark-sent for DeleteOnPublish: acknowledged rows are deleted at once
-- (the delete trigger removes them from the pending set), with
-- synchronous_commit off as in mark_sent.
WITH async AS MATERIALIZED (SELECT set_config('synchronous_commit', 'off', true))
DELETE FROM {{.Table}} USING async WHERE id = ANY($1::bigint[]) AND status = 0 {{"{{FENCE_BATCH}}"}}

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
-- page shows "cap+"), through the pending set, dead_idx and dead_held_idx
-- (index-only scans once VACUUM has set the visibility map); the lowest and
-- highest id (primary key ends), and the age of the lowest-id pending row
-- in microseconds (database clock).
SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM {{.Pending}} LIMIT ?) p),
       (SELECT COUNT(*) FROM (SELECT 1 FROM {{.Table}} WHERE status = 2 LIMIT ?) d),
       (SELECT COUNT(*) FROM (SELECT 1 FROM {{.Table}} WHERE status = 2 AND next_retry_at IS NOT NULL LIMIT ?) h),
       COALESCE((SELECT MIN(id) FROM {{.Table}}), 0),
       COALESCE((SELECT MAX(id) FROM {{.Table}}), 0),
       COALESCE((SELECT (EXTRACT(EPOCH FROM clock_timestamp() - o.created_at) * 1000000)::bigint
                 FROM {{.Table}} o WHERE o.id = (SELECT MIN(p.id) FROM {{.Pending}} p)), 0)

-- name: admin_backlog
-- Pending rows per relay partition among the first ? pending rows in id
-- order (the pending set's primary key): count and age of the oldest in
-- microseconds, read by primary key (a join would let the planner hash
-- the whole outbox table).
SELECT partition_key, COUNT(*),
       COALESCE((SELECT (EXTRACT(EPOCH FROM clock_timestamp() - o.created_at) * 1000000)::bigint
                 FROM {{.Table}} o WHERE o.id = MIN(s.id)), 0)
FROM (SELECT p.id, p.partition_key FROM {{.Pending}} p ORDER BY p.id LIMIT ?) s
GROUP BY partition_key

-- name: admin_held_partitions
-- Dead letters still holding their aggregate, per partition, among the
-- first ? of them in (partition, id) order: an index-only scan of
-- dead_held_idx (schema version 10), which holds exactly those rows.
SELECT partition_key, COUNT(*)
FROM (SELECT partition_key FROM {{.Table}} WHERE status = 2 AND next_retry_at IS NOT NULL ORDER BY partition_key, id LIMIT ?) s
GROUP BY partition_key

-- name: admin_members
-- Relay instances with a membership row: ID, delivery mode, and the time
-- left on their heartbeat in microseconds (negative: expired).
SELECT instance_id, mode, (EXTRACT(EPOCH FROM expires_at - clock_timestamp()) * 1000000)::bigint
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
       (EXTRACT(EPOCH FROM created_at) * 1000000)::bigint, (EXTRACT(EPOCH FROM updated_at) * 1000000)::bigint,
       COALESCE((EXTRACT(EPOCH FROM sent_at) * 1000000)::bigint, 0)
FROM {{.Table}} o {{"{{INDEX}}"}}
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
/* dead_idx */

-- name: index_aggregate
-- No hint: the planner takes aggregate_idx if it exists.
/* aggregate_idx */

-- name: wal_accept
-- The WAL source's check of a batch read from the stream (relay/walclaim.go):
-- $1 ids (ascending), $2 their aggregate types, $3 their aggregate ids,
-- $4 their transactions' 32-bit ids (pgoutput's). One row per id:
-- 0 if it is not pending (sent, dead-lettered; dropped); 3 if it is not
-- pending because its transaction is not visible yet in this snapshot (a
-- commit is decoded from its WAL record before the committing backend
-- leaves the process array; the relay asks again); 1 if an event of its
-- aggregate up to it failed and was not sent (a retry waiting or a dead
-- letter holding the aggregate: held_idx; the table claim decides);
-- 2 if it may be published; and the table's floor epoch, read in the
-- same snapshot. A primary-key probe of the pending set and a probe of
-- held_idx (empty in normal operation) per row; the outbox rows
-- themselves are not read. The 32-bit transaction id gets the epoch of
-- the snapshot's xmax (one less if it is above xmax's low half: it
-- wrapped), which is exact for any transaction younger than 2^31.
SELECT b.id,
       CASE WHEN NOT EXISTS (SELECT 1 FROM {{.Pending}} p WHERE p.id = b.id) THEN
                CASE WHEN pg_visible_in_snapshot(
                         ((((s.xmax >> 32) - CASE WHEN b.xid > (s.xmax & 4294967295) THEN 1 ELSE 0 END) << 32) | b.xid)::text::xid8,
                         s.snap) THEN 0 ELSE 3 END
            WHEN EXISTS (SELECT 1 FROM {{.Table}} h
                         WHERE h.aggregate_type = b.atype AND h.aggregate_id = b.aid
                           AND h.status <> 1 AND h.next_retry_at IS NOT NULL AND h.id + 0 <= b.id) THEN 1
            ELSE 2 END,
       (SELECT m.floor_epoch FROM {{.Meta}} m WHERE m.id = 1)
FROM (SELECT pg_current_snapshot() AS snap, pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax) s,
     unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[]) AS b(id, atype, aid, xid)

-- name: log_held
-- The WAL source's log-only mode (relay/walclaim.go, walLog): which of the
-- aggregates ($1 types, $2 ids) have an event that failed and was not sent
-- (held_idx: a retry waiting, or a dead letter holding the aggregate), as
-- rows of kind 1; and the table's floor epoch, as the one row of kind 0,
-- read in the same snapshot. The first test runs once per statement (an
-- InitPlan): when nothing is held at all, the usual case, no aggregate
-- pays for its probe of held_idx. It is written as the first entry of
-- held_idx in its order, not as EXISTS (which drops an ORDER BY): on a
-- table never analyzed the planner read EXISTS's rows with a sequential
-- scan of the whole table, one page per ~70 rows of sent history, at
-- every batch (TestLogHeldCostFlat).
SELECT 0, '', '', (SELECT m.floor_epoch FROM {{.Meta}} m WHERE m.id = 1)
UNION ALL
SELECT 1, a.atype, a.aid, 0
FROM unnest($1::text[], $2::text[]) AS a(atype, aid)
WHERE (SELECT h.aggregate_type FROM {{.Table}} h WHERE h.status <> 1 AND h.next_retry_at IS NOT NULL
       ORDER BY h.aggregate_type, h.aggregate_id, h.next_retry_at LIMIT 1) IS NOT NULL
  AND EXISTS (SELECT 1 FROM {{.Table}} h
              WHERE h.aggregate_type = a.atype AND h.aggregate_id = a.aid
                AND h.status <> 1 AND h.next_retry_at IS NOT NULL)

-- name: log_spill_fresh
-- The WAL source's log-only mode (relay/walclaim.go, spill): writes events
-- of logical decoding messages that cannot be published at once (in the
-- exactly-once mode: every event) to the table as pending rows, in the
-- order given (arrays, one element per event: $1 message IDs, $2
-- aggregate types, $3 aggregate ids, $4 event types, $5 topics ('' for
-- none), $6 relay partitions, $7 content types, $8 payloads in hex, $9
-- headers ('' for none)). The transaction's ID is taken before the first
-- id, as insert_row_first does (the CASE reads it before nextval), for the
-- claim's floor proof. Returns the new rows' ids and message IDs. It
-- fails as a whole (unique violation) if a message ID is in the table
-- already; the relay then runs log_spill, which leaves those out. Without
-- ON CONFLICT the usual case is cheaper: 2,000 rows took 13.5 ms against
-- 20.5 ms (medians of 6 interleaved runs in psql, BENCHMARKS.md).
{{define "log_spill_insert"}}INSERT INTO {{.Table}} (id, message_id, aggregate_type, aggregate_id, event_type, topic, partition_key,
                        content_type, payload, headers, created_at, updated_at)
SELECT CASE WHEN t.x IS NOT NULL THEN nextval('{{.Sequence}}') END, u.mid, u.atype, u.aid, u.etype, NULLIF(u.topic, ''), u.part,
       u.ctype, decode(u.payload, 'hex'), NULLIF(u.headers, ''), clock_timestamp(), clock_timestamp()
FROM (SELECT txid_current() AS x) t,
     unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int[], $7::text[], $8::text[], $9::text[])
         WITH ORDINALITY AS u(mid, atype, aid, etype, topic, part, ctype, payload, headers, n)
ORDER BY u.n{{end}}{{template "log_spill_insert" .}}
RETURNING id, message_id

-- name: log_spill
-- log_spill_fresh for a batch in which a message ID is in the table
-- already (an event read again after the stream restarted): such an
-- event is left out. Returns the new rows' ids and message IDs.
{{template "log_spill_insert" .}}
ON CONFLICT (message_id) DO NOTHING
RETURNING id, message_id
