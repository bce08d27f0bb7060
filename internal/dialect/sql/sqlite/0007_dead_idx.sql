-- optional
-- outbox schema version 7: the dead letters' own index. Listing dead
-- letters (the admin page, `outbox dead list`) walked the primary key
-- through the whole sent history to find a few rows with status 2; this
-- partial index holds only dead rows, so it is empty in normal operation
-- and costs writers nothing (a row enters it only when the relay marks it
-- dead). MySQL/MariaDB have had (status, id) since version 1.
-- Optional: writers and relays run without it; the admin page needs it
-- (`outbox admin` refuses an older table), `outbox migrate apply` adds it.
CREATE INDEX IF NOT EXISTS {{.Index "dead_idx"}} ON {{.IndexTable}} (id) WHERE status = 2;
