-- inbox schema version 1 (PostgreSQL 12+).
-- status: 1 processed, 2 parked, 3 held, 4 skipped.
-- Text columns are TEXT (the inbox validates: valid UTF-8, no NUL); key,
-- headers and payload are BYTEA (headers in the inbox's own length-prefixed
-- encoding, not jsonb: jsonb rejects NUL and reorders keys). Processed rows
-- keep no key, headers or payload (NULL); parked and held rows keep them for
-- Retry.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer        TEXT        NOT NULL,
    message_id      TEXT        NOT NULL,
    status          SMALLINT    NOT NULL,
    aggregate_type  TEXT        NOT NULL DEFAULT '',
    aggregate_id    TEXT        NOT NULL DEFAULT '',
    topic           TEXT        NOT NULL DEFAULT '',
    kafka_partition INTEGER     NOT NULL DEFAULT 0,
    kafka_offset    BIGINT      NOT NULL DEFAULT 0,
    msg_key         BYTEA,
    headers         BYTEA,
    payload         BYTEA,
    cause           TEXT,
    attempts        INTEGER     NOT NULL DEFAULT 0,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    processed_at    TIMESTAMPTZ,
    CONSTRAINT {{.Index "consumer_message_key"}} UNIQUE (consumer, message_id)
);
-- "Is this aggregate held?": one probe of a small index (parked and held
-- rows only; processed history does not grow it). Retry walks it in id order.
CREATE INDEX IF NOT EXISTS {{.Index "hold_idx"}} ON {{.IndexTable}} (consumer, aggregate_type, aggregate_id, id) WHERE status IN (2, 3);
-- Retention: processed and skipped rows by age.
CREATE INDEX IF NOT EXISTS {{.Index "retention_idx"}} ON {{.IndexTable}} (consumer, processed_at) WHERE processed_at IS NOT NULL;
