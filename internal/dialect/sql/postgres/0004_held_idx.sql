-- outbox schema version 4: the hold index keeps only rows that can hold
-- their aggregate, those with a next_retry_at (waiting for a retry, or dead
-- with "never"); version 1's hold_idx held every unsent row. With a large
-- backlog and nothing held, the planner scanned that whole index once per
-- claim (about 1,000 pages per million pending rows), and every event
-- INSERT paid for one more index entry. The new index is empty in normal
-- operation. Building it reads the table once and blocks outbox writes
-- meanwhile; on a large table, run the CREATE INDEX below with
-- CONCURRENTLY first: IF NOT EXISTS then makes this migration quick.
CREATE INDEX IF NOT EXISTS {{.Index "held_idx"}} ON {{.IndexTable}} (aggregate_type, aggregate_id, next_retry_at)
    WHERE status <> 1 AND next_retry_at IS NOT NULL;
DROP INDEX IF EXISTS {{.QualifiedIndex "hold_idx"}};
