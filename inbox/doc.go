// Package inbox is the consumer side of the outbox: it turns at-least-once
// delivery into exactly-once effects by recording each message's ID in an
// inbox table, under a unique key, in the same database transaction as the
// message's business effect (the seed article's "unique-key table", its
// recommended default).
//
//	in, err := inbox.New(inbox.Config{Dialect: driver.Postgres, Consumer: "shipping"})
//	// once: in.Migrate(ctx, db), or apply in.DDL() with your migration tool
//	out, err := in.Handle(ctx, db, msg, func(ctx context.Context, tx *sql.Tx) error {
//		_, err := tx.ExecContext(ctx, "UPDATE orders SET shipped = true WHERE id = $1", id)
//		return err // an error rolls back the effect and the inbox row
//	})
//	// out: inbox.Applied, inbox.Duplicate (skipped, handler not run) or inbox.Held
//
// # Dedupe
//
// The dedupe key is (Config.Consumer, Message.ID): several consumers may
// share one table and each applies a message once. Handle checks whether
// the message's aggregate is held (PostgreSQL: inside the INSERT; MySQL and
// SQLite: one SELECT just before the transaction), begins a transaction,
// inserts the row (an INSERT that skips a duplicate key: ON CONFLICT DO
// NOTHING, INSERT IGNORE), runs the handler only if the insert added a row, and
// commits. Deliveries of one message at once meet on the unique key: the
// others wait for the first's commit and then find the duplicate, or, if
// it rolled back, one of them applies. On MySQL/MariaDB three or more
// waiters released by such a rollback can deadlock each other on the key
// (InnoDB error 1213 rolls the loser back before its handler ran): Handle
// runs that transaction again (DeadlockRetries), so the caller sees
// Duplicate or Applied. A handler panic is recovered into an error
// wrapping ErrHandler and ErrHandlerPanic, after the rollback, like a
// handler error; a missing table is ErrSchemaMissing. The handler's transaction carries a
// fresh outbox emit scope, so a handler may call outbox.Emit through an
// outbox-wrapped *sql.DB: consume, change state and emit the next event in
// one commit.
//
// # Batches
//
// HandleBatch applies up to MaxBatch (64) messages of a partition in one
// transaction, the way Kafka consumers, MassTransit and Wolverine batch:
// the held aggregates are found in one query before it (one index probe
// per aggregate, joined with UNION ALL), the dedupe rows are written in
// one multi-row INSERT (RETURNING tells the new ones on PostgreSQL and
// SQLite; MySQL reads the recorded ones first), the handlers run in order,
// and one commit ends it. A handler failure rolls the transaction back and
// the batch runs again with a savepoint around each handler, so that the
// failure rolls back only its own message (its dedupe row is deleted) and
// the others commit; the later messages of a failed (or held, or in
// flight) message's aggregate are left to the caller, who handles them
// alone, in order (the runners do, with their retries and parking). A
// savepoint costs a round trip, as much as a one-statement handler, which
// is why the first run has none. MaxBatch is PostgreSQL's per-backend
// subtransaction cache: more savepoints that wrote would overflow it and
// slow every session's snapshots.
//
// # Pre-filter
//
// An optional Filter (package github.com/sqloutbox/outbox/inbox/redis: a
// Redis key per message, with an expiry) is asked before the transaction:
// a certain "seen" skips the message without touching the database; "not
// seen" or an error falls back to the table. The key is written only after
// the commit. The table stays the authority, so a Redis outage or a lost
// key costs a transaction, never a double effect.
//
// # Business state machines
//
// The seed's third method, a business state machine ("an order that is
// already paid ignores another paid event"), needs no helper: it is a
// guarded UPDATE inside the handler, and it is the only method that also
// catches a repeated event with a different message ID (a producer that
// retried at the business level):
//
//	res, err := tx.ExecContext(ctx, "UPDATE orders SET status = 'paid' WHERE id = $1 AND status = 'created'", id)
//	if n, _ := res.RowsAffected(); n == 0 {
//		return nil // already paid (or not payable): ignore; the inbox row still records the message
//	}
//
// (TestStateMachine shows it.) Use it beside the inbox, not instead of it.
//
// # Parking and holding
//
// A consumer that gives up on a message (its handler keeps failing) calls
// Park: the message is stored with its bytes, the cause and the attempts,
// in the parked state. While a message is parked, Handle stores the later
// messages of the same consumer and aggregate (Message.AggregateType and
// AggregateID) as held, without running them, so the aggregate's order is
// kept although the broker's offsets move on. ListParked shows parked and
// held messages; Retry runs an aggregate's stored messages in order through
// a handler (stopping at the first failure); Skip marks parked messages
// skipped.
//
// An operator's tool has no handler, so it cannot run Retry. It records a
// retry request instead, in <table>_requests: RequestRetry for the
// aggregates of the parked and held messages it selects (`outbox inbox
// parked retry`), and Skip, in its own transaction, for the aggregates
// whose parked message it skipped (`outbox inbox parked skip`), since the
// held messages behind it still wait. The consumer serves the requests
// with its handler: ServeRequests runs Retry for each and deletes it once
// served; the runners call it every RequestInterval (5 s by default).
//
// # Runners
//
// Each broker has a runner in a module of its own that consumes the
// relay's messages and calls Handle (or HandleBatch) for each, with the
// same contract: in order per aggregate, acknowledged only after the
// outcome is stored, retries then park (FailurePolicy, ErrPermanent), a
// panic as an error, Check at start, retry requests served, a clean
// shutdown. What keeps one aggregate on one consumer at a time is the
// broker's own mechanism where it has one:
//   - inbox/kafka (inboxkafka): a consumer group, one worker per
//     partition;
//   - inbox/rabbitmq (inboxrabbitmq): a queue with
//     x-single-active-consumer;
//   - inbox/nats (inboxnats): a durable pull consumer and a lease in a
//     NATS KV bucket (the server here, 2.9, has no pinned consumers);
//   - inbox/redis (inboxredis): a consumer group and a lease in Redis
//     (a group spreads entries over its consumers whatever their
//     aggregate).
//
// Inside a runner a message goes to the worker of its aggregate, so
// different aggregates run in parallel. inbox/inboxmetrics is a
// Prometheus Observer for any of them.
//
// # Retention
//
// Processed rows are the dedupe window: Retention deletes the consumer's
// processed and skipped rows older than RetentionConfig.Window (default 7
// days), in batches. A message redelivered or replayed after its row was
// deleted (a consumer group reset to an offset older than the window) is
// applied twice: keep the window longer than any replay you may run, or
// make such handlers state machines too. Parked and held rows are never
// deleted. Processed rows keep no key, headers or payload (NULL), so the
// window costs about 100-200 bytes a message plus the indexes.
//
// # Schema
//
// One table (default inbox_message) with an identity primary key, a unique
// key (consumer, message_id), a status (1 processed, 2 parked, 3 held, 4
// skipped), the aggregate, topic, partition and offset, key, headers and
// payload (parked and held rows only), cause, attempts, and created,
// updated and processed times with microseconds (PostgreSQL TIMESTAMPTZ,
// MySQL DATETIME(6) in UTC, SQLite INTEGER microseconds), and two indexes:
// hold_idx makes "is this aggregate held?" one probe (a partial index of
// parked and held rows on PostgreSQL and SQLite; on MySQL
// (consumer, aggregate, status, id)), retention_idx serves Retention.
// Identifiers are VARBINARY on MySQL (byte comparison: IDs differing only
// in case are different), headers are stored in a length-prefixed binary
// encoding (not JSON: jsonb rejects NUL, MySQL's JSON reorders keys), and
// every text field is validated (UTF-8 without NUL, bounded lengths)
// before anything is written. Migrate creates it (idempotent, safe from
// several processes at once), Check verifies it without changing anything,
// DDL prints it for other tools. Schema version 2 adds <table>_requests
// (consumer, aggregate type and ID, message ID for a message without an
// aggregate, request time): a table of its own, so that a consumer's poll
// for requests reads only pending requests, never the inbox's history.
// The SQL is in sql/ (embedded): numbered
// migrations per dialect and one queries.sql. The package has its own
// small migrator (a <table>_migrations table, the outbox's locking scheme)
// rather than the root module's internal/dialect, whose runner is bound to
// the outbox table's SQL files and its server checks.
package inbox
