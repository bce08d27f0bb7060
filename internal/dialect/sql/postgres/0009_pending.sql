-- outbox schema version 9: the pending set. Marking an event sent no longer
-- updates its row.
--
-- Until version 8 the relay marked each published row sent with an UPDATE
-- of status, sent_at and attempts. status is in the predicates of the
-- partial indexes (pending_idx, held_idx, dead_idx), so that UPDATE could
-- never be HOT: a new copy of every row (payload included) with new
-- entries in the primary key and message_id_key, 14 buffers, 4 WAL records
-- and about 1 kB of WAL per event, the largest part of the database's
-- work per event (BENCHMARKS.md, "Issue 34").
--
-- Now the events waiting to be published are listed in a small table of
-- their own, <table>_pending (id, partition_key), and marking an event
-- sent deletes its row there: a primary-key probe and a 40-byte WAL
-- record. The outbox row itself is written once and never updated when
-- all goes well; it stays the history (message ID lookups, the admin page,
-- retention and the archive) and keeps the message ID unique
-- (ErrDuplicateID) until retention removes it.
--
-- A row's state, from here on:
--   pending  its id is in <table>_pending (status 0: new, retrying, or
--            held behind an earlier event of its aggregate);
--   sent     status 0 or 1 and not in <table>_pending (1: marked by a
--            build before this version, or a message that failed before
--            it was sent, whose retry state the relay clears with an
--            UPDATE anyway);
--   dead     status 2.
--
-- Triggers keep the pending set, so every writer (this build, earlier
-- builds during a rolling upgrade, SQL written by hand or in another
-- language) and every status change take part without knowing of it:
--   - INSERT of rows with status 0 adds them (one statement-level
--     trigger per INSERT statement, reading the statement's new rows);
--   - status leaving 0 (dead-lettered, or marked sent by an earlier
--     build's relay) removes the row, status returning to 0 (a dead
--     letter retried, a row reset by hand) adds it, a new partition_key
--     follows it;
--   - DELETE removes the deleted rows' entries.
-- To send a sent row again by hand, insert its id and partition_key into
-- <table>_pending (then raise <table>_meta.floor_epoch, as for any row
-- made pending below the relays' scan floors).
CREATE TABLE IF NOT EXISTS {{.Pending}} (
    id            BIGINT  NOT NULL PRIMARY KEY,
    partition_key INTEGER NOT NULL
);
CREATE OR REPLACE FUNCTION {{.PendingFunction "ins"}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {{.Pending}} (id, partition_key) SELECT n.id, n.partition_key FROM new_rows n WHERE n.status = 0;
    RETURN NULL;
END
$$;
CREATE OR REPLACE FUNCTION {{.PendingFunction "upd"}}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 0 AND NEW.status <> 0 THEN
        DELETE FROM {{.Pending}} WHERE id = OLD.id;
    ELSIF NEW.status = 0 AND OLD.status <> 0 THEN
        INSERT INTO {{.Pending}} (id, partition_key) VALUES (NEW.id, NEW.partition_key) ON CONFLICT (id) DO NOTHING;
    ELSIF NEW.partition_key IS DISTINCT FROM OLD.partition_key THEN
        UPDATE {{.Pending}} SET partition_key = NEW.partition_key WHERE id = NEW.id;
    END IF;
    RETURN NULL;
END
$$;
-- The deleted rows' entries, one primary-key probe each (the SET clauses
-- keep the planner from scanning the pending set or hashing it: the
-- transition table has no statistics).
CREATE OR REPLACE FUNCTION {{.PendingFunction "del"}}() RETURNS trigger LANGUAGE plpgsql
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_hashjoin = off SET enable_mergejoin = off
AS $$
BEGIN
    DELETE FROM {{.Pending}} p USING old_rows o WHERE p.id = o.id AND o.status = 0;
    RETURN NULL;
END
$$;
-- CREATE TRIGGER takes a SHARE ROW EXCLUSIVE lock on the table until this
-- migration commits: writers wait until then, so no row is written
-- between the triggers' creation and the copy of the pending rows below.
DROP TRIGGER IF EXISTS {{.Trigger "pending_ins"}} ON {{.Table}};
CREATE TRIGGER {{.Trigger "pending_ins"}} AFTER INSERT ON {{.Table}}
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {{.PendingFunction "ins"}}();
DROP TRIGGER IF EXISTS {{.Trigger "pending_upd"}} ON {{.Table}};
CREATE TRIGGER {{.Trigger "pending_upd"}} AFTER UPDATE OF status, partition_key ON {{.Table}}
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.partition_key IS DISTINCT FROM NEW.partition_key)
    EXECUTE FUNCTION {{.PendingFunction "upd"}}();
DROP TRIGGER IF EXISTS {{.Trigger "pending_del"}} ON {{.Table}};
CREATE TRIGGER {{.Trigger "pending_del"}} AFTER DELETE ON {{.Table}}
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION {{.PendingFunction "del"}}();
-- The rows pending now, read through pending_idx (the backlog, not the
-- history: a table of 10,000,000 sent rows and no backlog copies nothing),
-- then pending_idx goes: status 0 no longer means pending, and writers no
-- longer pay for its entries.
SET LOCAL enable_seqscan = off;
INSERT INTO {{.Pending}} (id, partition_key) SELECT id, partition_key FROM {{.Table}} WHERE status = 0 ON CONFLICT (id) DO NOTHING;
RESET enable_seqscan;
DROP INDEX IF EXISTS {{.QualifiedIndex "pending_idx"}};
-- The claim walks the pending set in id order from the relay's scan floor
-- and reads each row by primary key (version 6's function otherwise; see
-- 0006_claim_floor.sql for the floor's proof, which holds as before: the
-- pending rows are written in the transaction of their outbox rows). The
-- outbox row is read in a LATERAL subquery that cannot be pulled up
-- (OFFSET 0), so the pending set is always the outer side of the join:
-- the function's statements are planned once per session, often on an
-- empty table, and a plain join planned there read the outbox table from
-- the start and probed the pending set for each row, a cost that grew
-- with every event sent since (TestClaimPlanMadeOnAnEmptyTable).
{{define "claim"}}
    SELECT 1::smallint, o.id, o.message_id::text, o.aggregate_type::text, o.aggregate_id::text,
           o.event_type::text, COALESCE(o.topic, '')::text, o.partition_key, o.content_type::text, o.payload,
           COALESCE(o.headers, ''), o.attempts,
           (EXTRACT(EPOCH FROM (statement_timestamp() - o.created_at)) * 1000000)::bigint,
           0::bigint, false, 0::bigint, 0::bigint, 0::bigint
    FROM {{.Pending}} p
    CROSS JOIN LATERAL (
        SELECT r.id, r.message_id, r.aggregate_type, r.aggregate_id, r.event_type, r.topic, r.partition_key,
               r.content_type, r.payload, r.headers, r.attempts, r.created_at
        FROM {{.Table}} r
        WHERE r.id = p.id AND r.status = 0
          AND (r.next_retry_at IS NULL OR r.next_retry_at <= statement_timestamp())
        OFFSET 0) o
    WHERE p.id >= (SELECT CASE WHEN m.floor_epoch = $2 THEN $1 ELSE 0 END FROM {{.Meta}} m WHERE m.id = 1)
      AND p.partition_key = ANY($5)
      AND p.id <> ALL($4)
      AND ((SELECT NOT EXISTS (SELECT 1 FROM {{.Table}} h
                               WHERE h.status <> 1 AND h.next_retry_at > statement_timestamp()))
           OR NOT EXISTS (
            SELECT 1 FROM {{.Table}} h
            WHERE h.aggregate_type = o.aggregate_type AND h.aggregate_id = o.aggregate_id
              AND h.status <> 1 AND h.next_retry_at > statement_timestamp() AND h.id + 0 < o.id))
    ORDER BY p.id
    LIMIT $3{{end}}CREATE OR REPLACE FUNCTION {{.ClaimFunction}}(
    p_floor bigint, p_epoch bigint, p_limit integer, p_skip bigint[], p_parts integer[],
    p_check bigint, p_want boolean)
RETURNS TABLE (kind smallint, id bigint, message_id text, aggregate_type text, aggregate_id text,
               event_type text, topic text, partition_key integer, content_type text, payload bytea,
               headers text, attempts integer, age_us bigint,
               floor_epoch bigint, resolved boolean, pending_min bigint, seq_last bigint, xid bigint)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off
SET enable_hashjoin = off SET enable_mergejoin = off SET enable_material = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
DECLARE
    v_resolved boolean := false;
    v_min      bigint;
    v_epoch    bigint;
    v_last     bigint;
    v_xid      bigint;
BEGIN
    IF cardinality(p_skip) <= 16 THEN
        RETURN QUERY
{{template "claim" .}};
    ELSE
        RETURN QUERY EXECUTE $claim$
{{template "claim" .}}
        $claim$ USING p_floor, p_epoch, p_limit, p_skip, p_parts;
    END IF;
    IF p_check IS NOT NULL THEN
        v_resolved := txid_snapshot_xmin(txid_current_snapshot()) >= p_check;
    END IF;
    SELECT m.floor_epoch,
           CASE WHEN v_resolved THEN
               (SELECT p.id FROM {{.Pending}} p
                WHERE p.id >= p_floor AND p.partition_key = ANY(p_parts)
                ORDER BY p.id LIMIT 1)
           END
    INTO v_epoch, v_min
    FROM {{.Meta}} m WHERE m.id = 1;
    IF p_want THEN
        SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END INTO v_last FROM {{.Sequence}} s;
        v_xid := txid_current();
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN QUERY SELECT 0::smallint, 0::bigint, ''::text, ''::text, ''::text, ''::text, ''::text, 0, ''::text,
           ''::bytea, ''::text, 0, 0::bigint,
           v_epoch, v_resolved, COALESCE(v_min, -1), COALESCE(v_last, -1), COALESCE(v_xid, -1);
END
$$;
