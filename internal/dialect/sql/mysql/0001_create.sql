-- outbox schema version 1 (MySQL 8.0+, MariaDB 10.6+).
-- payload is LONGBLOB and headers MEDIUMTEXT, not JSON: MySQL's JSON type
-- reorders keys. Text columns compare in binary so aggregate IDs that differ
-- only in case are different aggregates. DATETIME(6) keeps microseconds; all
-- times are UTC_TIMESTAMP(6), independent of the session time zone.
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id             BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,
    message_id     VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    aggregate_type VARCHAR(200) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    aggregate_id   VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    event_type     VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    topic          VARCHAR(249) CHARACTER SET ascii COLLATE ascii_bin NULL,
    partition_key  INT NOT NULL,
    content_type   VARCHAR(127) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    payload        LONGBLOB NOT NULL,
    headers        MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    status         TINYINT NOT NULL DEFAULT 0,
    attempts       INT NOT NULL DEFAULT 0,
    next_retry_at  DATETIME(6) NULL,
    last_error     TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    created_at     DATETIME(6) NOT NULL,
    updated_at     DATETIME(6) NOT NULL,
    sent_at        DATETIME(6) NULL,
    PRIMARY KEY (id),
    UNIQUE KEY {{.Index "message_id_key"}} (message_id),
    KEY {{.Index "status_id_idx"}} (status, id),
    KEY {{.Index "status_retry_idx"}} (status, next_retry_at),
    KEY {{.Index "aggregate_idx"}} (aggregate_type, aggregate_id, id)
) ENGINE = InnoDB;
