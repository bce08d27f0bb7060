-- outbox schema version 2: partition leases for several relay instances.
-- One row per relay partition: its owner, the fencing token (epoch, raised
-- at every acquisition) and when the lease expires by the database clock.
CREATE TABLE IF NOT EXISTS {{.Lease}} (
    partition_key INTEGER NOT NULL PRIMARY KEY,
    owner         TEXT NULL,
    epoch         INTEGER NOT NULL DEFAULT 0,
    expires_at    INTEGER NULL
);
-- Live relay instances, for balancing: each renews its row by heartbeat.
CREATE TABLE IF NOT EXISTS {{.Members}} (
    instance_id   TEXT NOT NULL PRIMARY KEY,
    expires_at    INTEGER NOT NULL
);
