-- inbox schema version 1 (MySQL 8.0+, MariaDB 10.6+).
-- status: 1 processed, 2 parked, 3 held, 4 skipped.
-- Identifiers are VARBINARY: compared byte for byte, so message IDs that
-- differ only in case are different messages (a _ci collation would dedupe
-- them). Key, headers and payload are BLOBs (not JSON: MySQL's JSON type
-- reorders keys). DATETIME(6) keeps microseconds; all times are
-- UTC_TIMESTAMP(6), independent of the session time zone. Processed rows keep
-- no key, headers or payload (NULL); parked and held rows keep them for Retry.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id              BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    consumer        VARBINARY(128) NOT NULL,
    message_id      VARBINARY(255) NOT NULL,
    status          TINYINT        NOT NULL,
    aggregate_type  VARBINARY(255) NOT NULL DEFAULT '',
    aggregate_id    VARBINARY(255) NOT NULL DEFAULT '',
    topic           VARBINARY(255) NOT NULL DEFAULT '',
    kafka_partition INT            NOT NULL DEFAULT 0,
    kafka_offset    BIGINT         NOT NULL DEFAULT 0,
    msg_key         MEDIUMBLOB     NULL,
    headers         MEDIUMBLOB     NULL,
    payload         LONGBLOB       NULL,
    cause           TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    attempts        INT            NOT NULL DEFAULT 0,
    created_at      DATETIME(6)    NOT NULL,
    updated_at      DATETIME(6)    NOT NULL,
    processed_at    DATETIME(6)    NULL,
    PRIMARY KEY (id),
    UNIQUE KEY {{.Index "consumer_message_key"}} (consumer, message_id),
    -- "Is this aggregate held?": one probe (status IN (2, 3) is a range on
    -- the last column, so an aggregate's processed history is not scanned).
    KEY {{.Index "hold_idx"}} (consumer, aggregate_type, aggregate_id, status, id),
    KEY {{.Index "retention_idx"}} (consumer, processed_at)
) ENGINE = InnoDB;
