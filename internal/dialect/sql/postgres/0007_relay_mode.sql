-- outbox schema version 7: each live relay instance records its delivery
-- mode ('at-least-once', or 'exactly-once ' followed by where its
-- publisher records its publishes), so that a relay in another mode than
-- the live ones is refused at start (relay.ErrModeMismatch). Rows written
-- by earlier builds were at least once.
ALTER TABLE {{.Members}} ADD COLUMN IF NOT EXISTS mode VARCHAR(255) NOT NULL DEFAULT 'at-least-once';
