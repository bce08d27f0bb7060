-- outbox schema version 5: each live relay instance records its delivery
-- mode ('at-least-once', or 'exactly-once ' followed by where its
-- publisher records its publishes), so that a relay in another mode than
-- the live ones is refused at start (relay.ErrModeMismatch). Rows written
-- by earlier builds were at least once.
-- DDL commits implicitly here, so the statement must be idempotent, and
-- MySQL 8.0 has no ADD COLUMN IF NOT EXISTS: the ALTER is prepared only if
-- information_schema lacks the column.
SET @outbox_ddl = IF((SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = {{.SchemaExpr}} AND TABLE_NAME = '{{.MembersName}}' AND COLUMN_NAME = 'mode') = 0, 'ALTER TABLE {{.Members}} ADD COLUMN mode VARCHAR(255) NOT NULL DEFAULT ''at-least-once''', 'DO 0');
PREPARE outbox_ddl FROM @outbox_ddl;
EXECUTE outbox_ddl;
DEALLOCATE PREPARE outbox_ddl;
