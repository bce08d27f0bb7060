-- outbox schema version 6: each live relay instance records its delivery
-- mode ('at-least-once', or 'exactly-once ' followed by where its
-- publisher records its publishes), so that a relay in another mode than
-- the live ones is refused at start (relay.ErrModeMismatch). Rows written
-- by earlier builds were at least once. (The migration runs in one
-- BEGIN IMMEDIATE transaction, so the ALTER needs no IF NOT EXISTS.)
ALTER TABLE {{.Members}} ADD COLUMN mode VARCHAR(255) NOT NULL DEFAULT 'at-least-once';
