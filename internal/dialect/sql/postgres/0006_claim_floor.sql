-- outbox schema version 6: a claim whose cost depends neither on planner
-- statistics nor on VACUUM (relay/doc.go, "Claiming").
--
-- 1. The id sequence gets a known name, so the commit hook can call
--    nextval on it (the hook assigns the transaction ID first: see the
--    insert_row_first query). An identity column's sequence is normally
--    <table>_id_seq already; it is renamed only if it is not.
DO $$ DECLARE s text := pg_get_serial_sequence('{{.Table}}', 'id'); BEGIN IF to_regclass('{{.Sequence}}') IS DISTINCT FROM s::regclass THEN EXECUTE format('ALTER SEQUENCE %s RENAME TO %I', s, '{{.SequenceName}}'); END IF; END $$;
-- The floor's proof needs every id to be allocated by a transaction that
-- already has its transaction ID, one at a time: no per-session cache.
ALTER SEQUENCE {{.Sequence}} CACHE 1;
-- 2. floor_epoch: raised by every change that makes a row pending again
--    below the relays' scan floors (DeadLetters.Retry); a relay that sees
--    it change scans from the start once.
ALTER TABLE {{.Meta}} ADD COLUMN IF NOT EXISTS floor_epoch BIGINT NOT NULL DEFAULT 0;
-- 3. The claim, as a function: its SET clauses plan the statements inside
--    without sequential scans, bitmap scans, sorts or hash/merge joins, so
--    the plan is the index walk in id order that stops after p_limit rows,
--    whatever the statistics say (none, stale, or taken during a backlog).
--    With statistics that say "few rows are pending" the planner would
--    otherwise read every pending row, sort them and keep the first
--    p_limit (226 ms per claim with a 20,000-row backlog).
--
--    The walk starts at p_floor, below which the relay has proven that
--    none of its partitions' rows is pending or can still become pending,
--    so it never walks the index entries of rows marked sent since the
--    last VACUUM below it. The proof (relay/floor.go):
--    - p_want: read the id sequence's last value L, then take a
--      transaction ID Y (txid_current(), in a later statement; its
--      commit record is written without waiting for the WAL flush). Every
--      transaction holding an id <= L allocated it before L was read, and
--      had its own transaction ID before it allocated the id
--      (insert_row_first), so its ID is below Y.
--    - p_check = Y of an earlier call: once the oldest running
--      transaction ID is >= Y, every row with an id <= L is committed or
--      rolled back for good. The floor can then move to the lowest id of
--      a pending row of the relay's partitions at or above p_floor, or to
--      L + 1 if there is none. Never "the last id seen": a row that got a
--      low id but commits late is still running when the proof is taken,
--      so it holds the floor below its id.
--    The result has one row of kind 0 (the proof's figures) and one row
--    of kind 1 per claimed message, in id order.
{{define "claim"}}
    SELECT 1::smallint, o.id, o.message_id::text, o.aggregate_type::text, o.aggregate_id::text,
           o.event_type::text, COALESCE(o.topic, '')::text, o.partition_key, o.content_type::text, o.payload,
           COALESCE(o.headers, ''), o.attempts,
           (EXTRACT(EPOCH FROM (statement_timestamp() - o.created_at)) * 1000000)::bigint,
           0::bigint, false, 0::bigint, 0::bigint, 0::bigint
    FROM {{.Table}} o
    WHERE o.status = 0
      -- The floor, unless a change made rows pending below it (the epoch
      -- is read in the claim's own snapshot, with the rows it changed).
      AND o.id >= (SELECT CASE WHEN m.floor_epoch = $2 THEN $1 ELSE 0 END FROM {{.Meta}} m WHERE m.id = 1)
      AND (o.next_retry_at IS NULL OR o.next_retry_at <= statement_timestamp())
      -- Not behind an earlier row of its aggregate that holds it (waiting
      -- for a retry, or dead: next_retry_at = infinity). The first test
      -- runs once per claim (an InitPlan): when nothing holds at all, the
      -- usual case, no row pays for the per-row probe of held_idx (two
      -- index pages each). "h.status <> 1" lets the planner use the
      -- partial index; "h.id + 0" keeps it off the primary key.
      AND ((SELECT NOT EXISTS (SELECT 1 FROM {{.Table}} h
                               WHERE h.status <> 1 AND h.next_retry_at > statement_timestamp()))
           OR NOT EXISTS (
            SELECT 1 FROM {{.Table}} h
            WHERE h.aggregate_type = o.aggregate_type AND h.aggregate_id = o.aggregate_id
              AND h.status <> 1 AND h.next_retry_at > statement_timestamp() AND h.id + 0 < o.id))
      AND o.id <> ALL($4)
      AND o.partition_key = ANY($5)
    ORDER BY o.id
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
-- A plan whose only path is a disabled one (the sequence's one-page
-- scan) is costed at 10^10, far above jit_above_cost: without this, each
-- proof compiled that statement with JIT (10-50 ms).
SET jit = off
AS $$
DECLARE
    v_resolved boolean := false;
    v_min      bigint;
    v_epoch    bigint;
    v_last     bigint;
    v_xid      bigint;
BEGIN
    -- The claim, once, in text: run as a static statement (a plan cached
    -- for the session) when few ids are left out, and through EXECUTE
    -- when many are (the batch still being marked sent, up to
    -- MaxBatchSize): EXECUTE plans with the values, so "id <> ALL(...)"
    -- becomes a hash lookup per row instead of a scan of the array (with
    -- 1,600 ids left out, 26 ms of 28 per claim). $1 floor, $2 floor
    -- epoch, $3 limit, $4 ids left out, $5 partitions.
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
    -- The epoch in the same snapshot as the lowest pending id: if it
    -- moved, the relay discards the floor instead of advancing it.
    SELECT m.floor_epoch,
           CASE WHEN v_resolved THEN
               (SELECT o.id FROM {{.Table}} o
                WHERE o.status = 0 AND o.id >= p_floor AND o.partition_key = ANY(p_parts)
                ORDER BY o.id LIMIT 1)
           END
    INTO v_epoch, v_min
    FROM {{.Meta}} m WHERE m.id = 1;
    IF p_want THEN
        SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END INTO v_last FROM {{.Sequence}} s;
        v_xid := txid_current();
        -- The transaction ID makes this claim's transaction write a commit
        -- record; it carries nothing worth a WAL flush (10 ms on the
        -- benchmark machine), so the commit does not wait for one.
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN QUERY SELECT 0::smallint, 0::bigint, ''::text, ''::text, ''::text, ''::text, ''::text, 0, ''::text,
           ''::bytea, ''::text, 0, 0::bigint,
           v_epoch, v_resolved, COALESCE(v_min, -1), COALESCE(v_last, -1), COALESCE(v_xid, -1);
END
$$;
