// Package admin is the outbox's web admin page: what is stuck, since
// when, which aggregate, what error, who owns which partition; then retry
// or skip with care. It is an http.Handler (New) that an application can
// mount, and the outbox command serves it (`outbox admin`, or beside a
// relay with `outbox relay --admin-listen`).
//
// # What it shows
//
//   - Overview: pending rows, the oldest pending row's age, sent (an
//     estimate), dead letters and how many hold their aggregate, stuck
//     partitions, the schema version, the relays' heartbeats (and, when
//     mounted in a relay, its broker and readiness as /readyz reports
//     it), and a throughput chart drawn from the page's own readings.
//   - Partitions: owner, epoch, lease left, backlog, oldest pending age,
//     held dead letters; stuck ones highlighted.
//   - Dead letters: filters (aggregate, event type, error text, age),
//     keyset pages, a detail view (attempts, last error, headers, payload
//     as text, pretty JSON or hex), and retry or skip for one, an
//     aggregate or a selection.
//   - Lookup by message ID or aggregate: every event with its status, in
//     order (the outbox table only: archived rows are not searched), and
//     dead-lettering of pending events (one whose route does not exist
//     stays pending for ever): relay.DeadLetters.DeadLetterPending on the
//     confirmed ids, holding the aggregate or releasing it.
//   - Consumers: the inbox's parked and held messages per consumer, skip,
//     and retry requests that the consumer's runner serves.
//
// # What it costs the database
//
// A listing is a keyset page (Config.PageSize rows, at most
// MaxPageSize). Counts are capped (Config.CountCap) and read through the
// partial indexes that hold only pending or dead rows (PostgreSQL and
// SQLite: pending_idx and dead_idx, schema version 8 and 7;
// MySQL/MariaDB: status_id_idx), never through the sent history; "sent"
// is the primary key's range less pending and dead rows. Readings are
// cached for Config.CacheFor, so any number of open pages costs one
// reading per CacheFor. Lookups by aggregate need an index on
// (aggregate_type, aggregate_id, id): MySQL/MariaDB tables have it; on
// PostgreSQL and SQLite it is optional (every writer would pay for it),
// and the page prints the CREATE INDEX to run when it is missing instead
// of reading the whole table. The tests check every statement's plan with
// EXPLAIN on the three dialects, with and without statistics.
//
// # Security
//
// The page changes production data, so:
//   - every page needs a session: an operator types a name (for the audit
//     log) and the token (Config.Token), and gets an HttpOnly,
//     SameSite=Strict cookie; sessions live in memory for SessionTTL;
//   - every POST needs that session, the session's CSRF token in the form,
//     and a same-origin request (Sec-Fetch-Site and Origin): a cross-site
//     form post is refused even with the cookie;
//   - every mutation and every refused request is written to the audit
//     log (Config.Audit): who, what, which rows, how many changed;
//   - a confirmation lists the exact rows, and the mutation acts on those
//     ids only (relay.Selector.IDs, inbox skip by message ID): never on
//     what a filter matches later;
//   - ReadOnly removes every mutation; HidePayloads never shows payloads
//     or headers;
//   - every value from the table is rendered by html/template, escaped
//     for its context, under a Content-Security-Policy that allows no
//     inline script; no DSN or password is known to the handler.
//
// The outbox command binds the page's own listener to 127.0.0.1 by
// default, apart from the relay's metrics address.
package admin
