-- outbox schema version 3: the archive table retention may move sent rows to
-- (same columns as the outbox table).
CREATE TABLE IF NOT EXISTS {{.Archive}} (LIKE {{.Table}} INCLUDING DEFAULTS);
