-- inbox schema version 1 (SQLite 3.42+).
-- status: 1 processed, 2 parked, 3 held, 4 skipped.
-- AUTOINCREMENT keeps ids increasing even after rows are deleted (Retry runs
-- an aggregate's rows in id order). Timestamps are INTEGER microseconds since
-- the Unix epoch (UTC). Processed rows keep no key, headers or payload
-- (NULL); parked and held rows keep them for Retry.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer        TEXT    NOT NULL,
    message_id      TEXT    NOT NULL,
    status          INTEGER NOT NULL,
    aggregate_type  TEXT    NOT NULL DEFAULT '',
    aggregate_id    TEXT    NOT NULL DEFAULT '',
    topic           TEXT    NOT NULL DEFAULT '',
    kafka_partition INTEGER NOT NULL DEFAULT 0,
    kafka_offset    INTEGER NOT NULL DEFAULT 0,
    msg_key         BLOB,
    headers         BLOB,
    payload         BLOB,
    cause           TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,
    processed_at    INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS {{.Index "consumer_message_key"}} ON {{.IndexTable}} (consumer, message_id);
CREATE INDEX IF NOT EXISTS {{.Index "hold_idx"}} ON {{.IndexTable}} (consumer, aggregate_type, aggregate_id, id) WHERE status IN (2, 3);
CREATE INDEX IF NOT EXISTS {{.Index "retention_idx"}} ON {{.IndexTable}} (consumer, processed_at) WHERE processed_at IS NOT NULL;
