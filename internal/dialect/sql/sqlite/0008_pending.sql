-- outbox schema version 8 (SQLite): the pending set. Marking an event
-- sent no longer updates its row (PostgreSQL's version 9 explains the
-- design). The events waiting to be published are listed in
-- <table>_pending (id, partition_key) and marking an event sent deletes
-- its row there; the outbox row stays the history and keeps the message
-- ID unique. A row's state: pending = its id is in <table>_pending; sent
-- = status 0 or 1 and not pending; dead = status 2. Triggers keep the
-- pending set for every writer and every status change (each body on one
-- line: the migration runner splits statements at a semicolon that ends a
-- line). SQLite has one writer at a time, and the migration runs under
-- BEGIN IMMEDIATE: no row is written between the triggers' creation and
-- the copy of the pending rows.
CREATE TABLE IF NOT EXISTS {{.Pending}} (
    id            INTEGER PRIMARY KEY,
    partition_key INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS {{.Trigger "pending_ai"}} AFTER INSERT ON {{.TableLocal}} WHEN NEW.status = 0 BEGIN INSERT INTO {{.PendingLocal}} (id, partition_key) VALUES (NEW.id, NEW.partition_key); END;
CREATE TRIGGER IF NOT EXISTS {{.Trigger "pending_au_out"}} AFTER UPDATE OF status ON {{.TableLocal}} WHEN OLD.status = 0 AND NEW.status <> 0 BEGIN DELETE FROM {{.PendingLocal}} WHERE id = OLD.id; END;
CREATE TRIGGER IF NOT EXISTS {{.Trigger "pending_au_in"}} AFTER UPDATE OF status ON {{.TableLocal}} WHEN NEW.status = 0 AND OLD.status <> 0 BEGIN INSERT OR IGNORE INTO {{.PendingLocal}} (id, partition_key) VALUES (NEW.id, NEW.partition_key); END;
CREATE TRIGGER IF NOT EXISTS {{.Trigger "pending_au_part"}} AFTER UPDATE OF partition_key ON {{.TableLocal}} WHEN NEW.partition_key <> OLD.partition_key BEGIN UPDATE {{.PendingLocal}} SET partition_key = NEW.partition_key WHERE id = NEW.id; END;
CREATE TRIGGER IF NOT EXISTS {{.Trigger "pending_ad"}} AFTER DELETE ON {{.TableLocal}} WHEN OLD.status = 0 BEGIN DELETE FROM {{.PendingLocal}} WHERE id = OLD.id; END;
INSERT OR IGNORE INTO {{.Pending}} (id, partition_key)
SELECT id, partition_key FROM {{.Table}} WHERE status = 0;
DROP INDEX IF EXISTS {{.QualifiedIndex "pending_idx"}};
