-- The inbox's statements, one "-- name: X" section each, shared by the three
-- dialects: the templates below render what differs ({{.Now}}: the database
-- clock; {{.Micros "col"}}: a timestamp as microseconds since the epoch;
-- {{.Ago}}: the database clock minus a bind parameter in microseconds;
-- {{.InsertIgnore}} ... {{.OnConflict}}: an INSERT that skips a duplicate
-- (consumer, message_id) and reports 0 rows; {{.ForUpdate}}: a row lock,
-- empty on SQLite; {{.ForShare}}: a shared lock on MySQL, empty elsewhere). Placeholders are written ? and rendered $n on PostgreSQL.
-- status: 1 processed, 2 parked, 3 held, 4 skipped.

-- name: held
SELECT 1 FROM {{.Table}} WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ? AND status IN (2, 3) LIMIT 1

-- name: insert_processed
{{.InsertIgnore}} INTO {{.Table}} (consumer, message_id, status, aggregate_type, aggregate_id, topic, kafka_partition, kafka_offset, created_at, updated_at, processed_at)
VALUES (?, ?, 1, ?, ?, ?, ?, ?, {{.Now}}, {{.Now}}, {{.Now}}){{.OnConflict}}

-- name: insert_stored
{{.InsertIgnore}} INTO {{.Table}} (consumer, message_id, status, aggregate_type, aggregate_id, topic, kafka_partition, kafka_offset, msg_key, headers, payload, cause, attempts, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, {{.Now}}, {{.Now}}){{.OnConflict}}

-- name: status
-- After an INSERT that found the key taken: a locking read on MySQL, whose
-- plain SELECT would read the transaction's snapshot, older than the commit
-- the INSERT waited for.
SELECT status FROM {{.Table}} WHERE consumer = ? AND message_id = ?{{.ForShare}}

-- name: recorded
-- One probe before the INSERT: the message's status if recorded, and 1 if its
-- aggregate is held.
SELECT (SELECT status FROM {{.Table}} WHERE consumer = ? AND message_id = ?),
       (SELECT 1 FROM {{.Table}} WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ? AND status IN (2, 3) LIMIT 1)

-- name: park_update
UPDATE {{.Table}} SET status = 2, cause = ?, attempts = attempts + ?, msg_key = ?, headers = ?, payload = ?, updated_at = {{.Now}}
WHERE consumer = ? AND message_id = ? AND status IN (2, 3)

-- name: stored
SELECT id, message_id, status, aggregate_type, aggregate_id, topic, kafka_partition, kafka_offset, msg_key, headers, payload, cause, attempts, {{.Micros "created_at"}}, {{.Micros "updated_at"}}
FROM {{.Table}} WHERE consumer = ? AND status IN (2, 3)

-- name: stored_all
-- stored across every aggregate of the consumer (ListParked without an ID
-- or aggregate), through ParkedIndex on MySQL/MariaDB.
SELECT id, message_id, status, aggregate_type, aggregate_id, topic, kafka_partition, kafka_offset, msg_key, headers, payload, cause, attempts, {{.Micros "created_at"}}, {{.Micros "updated_at"}}
FROM {{.Table}}{{.ParkedIndex}} WHERE consumer = ? AND processed_at IS NULL AND status IN (2, 3)

-- name: lock
SELECT status FROM {{.Table}} WHERE id = ?{{.ForUpdate}}

-- name: mark_processed
UPDATE {{.Table}} SET status = 1, msg_key = NULL, headers = NULL, payload = NULL, updated_at = {{.Now}}, processed_at = {{.Now}}
WHERE id = ? AND status IN (2, 3)

-- name: retry_failed
UPDATE {{.Table}} SET status = 2, cause = ?, attempts = attempts + 1, updated_at = {{.Now}} WHERE id = ?

-- name: skip
UPDATE {{.Table}} SET status = 4, updated_at = {{.Now}}, processed_at = {{.Now}} WHERE consumer = ? AND status = 2

-- name: retention_select
SELECT id FROM {{.Table}} WHERE consumer = ? AND processed_at < {{.Ago}} AND status IN (1, 4) ORDER BY processed_at

-- name: retention_delete
DELETE FROM {{.Table}} WHERE status IN (1, 4) AND id IN

-- name: stored_keys
SELECT id, aggregate_type, aggregate_id FROM {{.Table}} WHERE consumer = ? AND status IN (2, 3)

-- name: insert_processed_unheld
-- PostgreSQL only: insert_processed and the held probe in one statement (one
-- round trip fewer on the common path). 0 rows: held or a duplicate, and the
-- two-statement path decides. (Not on MySQL: INSERT ... SELECT takes shared
-- next-key locks on what its SELECT reads, and writers of neighbouring
-- aggregates would deadlock on the hold index's gaps.)
INSERT INTO {{.Table}} (consumer, message_id, status, aggregate_type, aggregate_id, topic, kafka_partition, kafka_offset, created_at, updated_at, processed_at)
SELECT CAST(? AS TEXT), CAST(? AS TEXT), 1, CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS TEXT), CAST(? AS INTEGER), CAST(? AS BIGINT), {{.Now}}, {{.Now}}, {{.Now}}
WHERE NOT EXISTS (SELECT 1 FROM {{.Table}} WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ? AND status IN (2, 3)){{.OnConflict}}

-- name: request_insert
-- A retry request for each aggregate (or, without one, each message) of the
-- stored rows the appended filter selects.
{{.InsertIgnore}} INTO {{.Requests}} (consumer, aggregate_type, aggregate_id, message_id, requested_at)
SELECT DISTINCT consumer, aggregate_type, aggregate_id, CASE WHEN aggregate_type = '' AND aggregate_id = '' THEN message_id ELSE '' END, {{.Now}}
FROM {{.Table}} WHERE consumer = ?

-- name: requests_pending
SELECT aggregate_type, aggregate_id, message_id FROM {{.Requests}} WHERE consumer = ? ORDER BY requested_at LIMIT 100

-- name: request_delete
DELETE FROM {{.Requests}} WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ? AND message_id = ?

-- name: aggregate_first
SELECT status FROM {{.Table}} WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ? AND status IN (2, 3) ORDER BY id LIMIT 1

-- name: stored_count
SELECT COUNT(*) FROM {{.Table}} WHERE consumer = ? AND status IN (2, 3)

-- name: batch_insert_head
-- HandleBatch's dedupe rows, written together: this head, then one
-- batch_insert_row per message.
{{.InsertIgnore}} INTO {{.Table}} (consumer, message_id, status, aggregate_type, aggregate_id, topic, kafka_partition, kafka_offset, created_at, updated_at, processed_at) VALUES

-- name: batch_insert_row
(?, ?, 1, ?, ?, ?, ?, ?, {{.Now}}, {{.Now}}, {{.Now}})

-- name: batch_any_held
-- PostgreSQL and SQLite: is anything of the consumer parked or held? An
-- index-only scan of the partial hold index, empty unless something is
-- parked; only then does a batch probe its aggregates one by one. (MySQL has
-- no partial index: there this would walk the consumer's whole history.)
SELECT 1 FROM {{.Table}} WHERE consumer = ? AND status IN (2, 3) LIMIT 1

-- name: batch_held_probe
-- One per distinct aggregate of a batch, joined with UNION ALL: each is the
-- held query's index probe (no IN list of tuples, whose plan MariaDB may
-- turn into a scan of the consumer's whole history); # is the aggregate's
-- number in the batch.
SELECT #{{.FromDual}} WHERE EXISTS (SELECT 1 FROM {{.Table}} WHERE consumer = ? AND aggregate_type = ? AND aggregate_id = ? AND status IN (2, 3))

-- name: batch_status
-- One per message, joined with UNION ALL: each is a unique-key lookup. (An
-- IN list is not: without statistics, a fresh table with autovacuum off,
-- PostgreSQL 15 scans the consumer's whole key range and filters the list,
-- 6,400 index entries to find 8 in the test that caught it.)
SELECT message_id, status FROM {{.Table}} WHERE consumer = ? AND message_id = ?

-- name: batch_delete
DELETE FROM {{.Table}} WHERE consumer = ? AND message_id = ?

-- name: consumers_stored
-- PostgreSQL and SQLite: consumers with parked or held messages, and how
-- many, through the partial hold_idx (only rows with status 2 or 3): never
-- the processed history. (MySQL/MariaDB: consumer_next and consumer_parked.)
SELECT consumer, SUM(CASE WHEN status = 2 THEN 1 ELSE 0 END), SUM(CASE WHEN status = 3 THEN 1 ELSE 0 END)
FROM {{.Table}} WHERE status IN (2, 3) GROUP BY consumer ORDER BY consumer LIMIT 1000

-- name: consumer_next
-- MySQL/MariaDB: the next consumer after ?, one probe of retention_idx (a
-- skip scan done by the caller, one statement per consumer).
SELECT consumer FROM {{.Table}}{{.ParkedIndex}} WHERE consumer > ? ORDER BY consumer LIMIT 1

-- name: consumer_parked
-- One consumer's parked and held counts, through its processed_at IS NULL
-- range of retention_idx on MySQL/MariaDB.
SELECT COALESCE(SUM(CASE WHEN status = 2 THEN 1 ELSE 0 END), 0), COALESCE(SUM(CASE WHEN status = 3 THEN 1 ELSE 0 END), 0)
FROM {{.Table}}{{.ParkedIndex}} WHERE consumer = ? AND processed_at IS NULL AND status IN (2, 3)

-- name: requests_list
-- A consumer's pending retry requests with when each was recorded, oldest first.
SELECT aggregate_type, aggregate_id, message_id, {{.Micros "requested_at"}} FROM {{.Requests}} WHERE consumer = ? ORDER BY requested_at LIMIT 1000
