-- outbox schema version 3: the archive table retention may move sent rows to
-- (same columns as the outbox table).
CREATE TABLE IF NOT EXISTS {{.Archive}} AS SELECT * FROM {{.Table}} WHERE 0;
