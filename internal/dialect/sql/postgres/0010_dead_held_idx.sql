-- optional
-- outbox schema version 10: the held dead letters' own index. The admin
-- page's overview counts the dead letters that still hold their aggregate
-- (status 2 with a next_retry_at) and groups them per partition. dead_idx
-- holds only the id, so each of those rows was read from the heap: with
-- dead letters spread through the sent history (200,000 sent rows, 20,000
-- dead), every overview reading read the whole heap (8,271 pages for the
-- counts, 4,129 for the held dead letters per partition). This partial
-- index holds exactly those rows' partition and id, so both are
-- index-only scans (after VACUUM has set the visibility map); like
-- dead_idx it is empty in normal operation and costs writers nothing.
-- Building it reads the table once and blocks outbox writes meanwhile; on
-- a large table, run the CREATE INDEX below with CONCURRENTLY first: IF NOT
-- EXISTS then makes this migration quick. Optional: writers and relays run
-- without it; the admin page needs it (`outbox admin` refuses an older
-- table), `outbox migrate apply` adds it.
CREATE INDEX IF NOT EXISTS {{.Index "dead_held_idx"}} ON {{.IndexTable}} (partition_key, id)
    WHERE status = 2 AND next_retry_at IS NOT NULL;
