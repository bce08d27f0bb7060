-- outbox schema version 1 (SQLite 3.38+).
-- AUTOINCREMENT keeps ids increasing even after rows are deleted.
-- Timestamps are INTEGER milliseconds since the Unix epoch (UTC).
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id     TEXT    NOT NULL,
    aggregate_type TEXT    NOT NULL,
    aggregate_id   TEXT    NOT NULL,
    event_type     TEXT    NOT NULL,
    topic          TEXT,
    partition_key  INTEGER NOT NULL,
    content_type   TEXT    NOT NULL,
    payload        BLOB    NOT NULL,
    headers        TEXT,
    status         INTEGER NOT NULL DEFAULT 0,
    attempts       INTEGER NOT NULL DEFAULT 0,
    next_retry_at  INTEGER,
    last_error     TEXT,
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    sent_at        INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS {{.Index "message_id_key"}} ON {{.IndexTable}} (message_id);
CREATE INDEX IF NOT EXISTS {{.Index "pending_idx"}} ON {{.IndexTable}} (id) WHERE status = 0;
-- The claim's hold probe: does an earlier event of this aggregate wait for a
-- retry (next_retry_at in the future), or is it dead (next_retry_at is
-- "never", the largest timestamp)? Unsent rows only: history does not grow it.
CREATE INDEX IF NOT EXISTS {{.Index "hold_idx"}} ON {{.IndexTable}} (aggregate_type, aggregate_id, next_retry_at) WHERE status <> 1;
