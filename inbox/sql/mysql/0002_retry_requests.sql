-- inbox schema version 2: retry requests (see the PostgreSQL migration).
CREATE TABLE IF NOT EXISTS {{.Requests}} (
    consumer       VARBINARY(128) NOT NULL,
    aggregate_type VARBINARY(255) NOT NULL DEFAULT '',
    aggregate_id   VARBINARY(255) NOT NULL DEFAULT '',
    message_id     VARBINARY(255) NOT NULL DEFAULT '',
    requested_at   DATETIME(6)    NOT NULL,
    PRIMARY KEY (consumer, aggregate_type, aggregate_id, message_id)
) ENGINE = InnoDB;
