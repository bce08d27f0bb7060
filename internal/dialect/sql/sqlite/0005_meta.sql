-- outbox schema version 5: the table's settings, stored once so that every
-- writer and relay reads them instead of being told them. One row (id 1).
-- partitions is the relay partition count (partition.Of) every row's
-- partition_key is computed with; only relay.Repartition changes it. An
-- existing install takes it from the lease table (one row per partition)
-- if relays ever ran, else the count Migrate was configured with
-- (driver.Config.Partitions, default 32).
CREATE TABLE IF NOT EXISTS {{.Meta}} (
    id          INTEGER     NOT NULL PRIMARY KEY CHECK (id = 1),
    partitions  INTEGER     NOT NULL CHECK (partitions >= 1),
    updated_at  INTEGER     NOT NULL
);
INSERT OR IGNORE INTO {{.Meta}} (id, partitions, updated_at)
SELECT 1, CASE WHEN COUNT(*) > 0 THEN COUNT(*) ELSE {{.Partitions}} END, CAST(unixepoch('subsec') * 1000 AS INTEGER) FROM {{.Lease}};
