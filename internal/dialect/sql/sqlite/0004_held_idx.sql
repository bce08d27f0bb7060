-- outbox schema version 4: the hold index keeps only rows that can hold
-- their aggregate, those with a next_retry_at (waiting for a retry, or dead
-- with "never"); version 1's hold_idx held every unsent row, and every
-- event INSERT paid for its entry. The new index is empty in normal
-- operation.
CREATE INDEX IF NOT EXISTS {{.Index "held_idx"}} ON {{.IndexTable}} (aggregate_type, aggregate_id, next_retry_at)
    WHERE status <> 1 AND next_retry_at IS NOT NULL;
DROP INDEX IF EXISTS {{.QualifiedIndex "hold_idx"}};
