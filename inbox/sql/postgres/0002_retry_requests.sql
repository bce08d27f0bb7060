-- inbox schema version 2: retry requests. An operator (outbox inbox parked
-- skip or retry, or inbox.Inbox.RequestRetry) records one row per aggregate
-- (or per message without an aggregate, message_id set) whose parked and
-- held messages the running consumer should retry with its own handler;
-- the consumer's runner serves and deletes them (inbox.Inbox.ServeRequests).
-- A small table of its own, so that the consumer's poll reads only pending
-- requests, never the inbox's history.
CREATE TABLE IF NOT EXISTS {{.Requests}} (
    consumer       TEXT        NOT NULL,
    aggregate_type TEXT        NOT NULL DEFAULT '',
    aggregate_id   TEXT        NOT NULL DEFAULT '',
    message_id     TEXT        NOT NULL DEFAULT '',
    requested_at   TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (consumer, aggregate_type, aggregate_id, message_id)
);
