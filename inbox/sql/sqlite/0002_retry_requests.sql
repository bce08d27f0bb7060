-- inbox schema version 2: retry requests (see the PostgreSQL migration).
CREATE TABLE IF NOT EXISTS {{.Requests}} (
    consumer       TEXT    NOT NULL,
    aggregate_type TEXT    NOT NULL DEFAULT '',
    aggregate_id   TEXT    NOT NULL DEFAULT '',
    message_id     TEXT    NOT NULL DEFAULT '',
    requested_at   INTEGER NOT NULL,
    PRIMARY KEY (consumer, aggregate_type, aggregate_id, message_id)
);
