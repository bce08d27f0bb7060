-- outbox schema version 6 (MySQL/MariaDB): the pending set. Marking an
-- event sent no longer updates its row (PostgreSQL's version 9 explains
-- the design; BENCHMARKS.md, "Issue 34", the costs).
--
-- Until version 5 the relay marked each published row sent with an
-- UPDATE of status, which InnoDB carries out as a delete-mark and an
-- insert in each of the two secondary indexes that hold status
-- (status_id_idx, status_retry_idx), with their undo records. Now the
-- events waiting to be published are listed in <table>_pending (id,
-- partition_key) and marking an event sent deletes its row there: one
-- clustered-index record. The outbox row stays the history and keeps the
-- message ID unique.
--
-- A row's state: pending = its id is in <table>_pending; sent = status 0
-- or 1 and not pending; dead = status 2. Triggers keep the pending set for
-- every writer and every status change: an INSERT with status 0 adds the
-- row, status leaving 0 removes it, returning to 0 adds it, a new
-- partition_key follows it, a DELETE removes it. Each trigger is one
-- statement (no BEGIN ... END), so the script below runs as it is in any
-- client or migration tool without a DELIMITER. Creating triggers needs
-- the TRIGGER privilege (and, with binary logging on in MySQL, SUPER or
-- log_bin_trust_function_creators = 1).
--
-- A trigger is created after a metadata lock that waits for every open
-- transaction that wrote to the table: once the five exist, every row
-- written before is committed or rolled back, and the copy below takes
-- the committed pending ones (INSERT IGNORE: rows the triggers already
-- added stay). A migration run again after a failure drops and creates
-- the triggers again, then copies again: a row written between a DROP and
-- its CREATE is still pending (status 0) and the copy takes it.
CREATE TABLE IF NOT EXISTS {{.Pending}} (
    id            BIGINT UNSIGNED NOT NULL PRIMARY KEY,
    partition_key INT NOT NULL
) ENGINE = InnoDB;
DROP TRIGGER IF EXISTS {{.QualifiedTrigger "pending_ai"}};
CREATE TRIGGER {{.QualifiedTrigger "pending_ai"}} AFTER INSERT ON {{.Table}} FOR EACH ROW
    INSERT INTO {{.Pending}} (id, partition_key) SELECT NEW.id, NEW.partition_key FROM DUAL WHERE NEW.status = 0;
DROP TRIGGER IF EXISTS {{.QualifiedTrigger "pending_au_out"}};
CREATE TRIGGER {{.QualifiedTrigger "pending_au_out"}} AFTER UPDATE ON {{.Table}} FOR EACH ROW
    DELETE FROM {{.Pending}} WHERE id = OLD.id AND OLD.status = 0 AND NEW.status <> 0;
DROP TRIGGER IF EXISTS {{.QualifiedTrigger "pending_au_in"}};
CREATE TRIGGER {{.QualifiedTrigger "pending_au_in"}} AFTER UPDATE ON {{.Table}} FOR EACH ROW
    INSERT IGNORE INTO {{.Pending}} (id, partition_key) SELECT NEW.id, NEW.partition_key FROM DUAL WHERE NEW.status = 0 AND OLD.status <> 0;
DROP TRIGGER IF EXISTS {{.QualifiedTrigger "pending_au_part"}};
CREATE TRIGGER {{.QualifiedTrigger "pending_au_part"}} AFTER UPDATE ON {{.Table}} FOR EACH ROW
    UPDATE {{.Pending}} SET partition_key = NEW.partition_key WHERE id = NEW.id AND NEW.partition_key <> OLD.partition_key;
DROP TRIGGER IF EXISTS {{.QualifiedTrigger "pending_ad"}};
CREATE TRIGGER {{.QualifiedTrigger "pending_ad"}} AFTER DELETE ON {{.Table}} FOR EACH ROW
    DELETE FROM {{.Pending}} WHERE id = OLD.id AND OLD.status = 0;
-- The rows pending now, through status_id_idx (the backlog, not the
-- history).
INSERT IGNORE INTO {{.Pending}} (id, partition_key)
SELECT id, partition_key FROM {{.Table}} FORCE INDEX ({{.Index "status_id_idx"}}) WHERE status = 0;
