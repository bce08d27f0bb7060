// Package relay moves committed outbox rows to a broker: in order per
// aggregate, at least once.
//
// # The loop
//
// A Relay runs one cycle at a time: claim up to BatchSize rows, hand them
// to the Publisher as one batch, record the outcomes, repeat. It waits
// between cycles until whichever comes first: the post-commit wake-up
// (driver.Outbox.Wakeup, or Notify), or the fallback poll (PollInterval,
// default 1 s), which also finds rows written by other processes and
// retries that came due. A full batch starts the next cycle at once. An
// idle relay runs one claim query per PollInterval and nothing else.
//
// # Claiming
//
// The claim reads pending rows (status 0) in id order whose retry is due
// by the database's clock (clock_timestamp(), UTC_TIMESTAMP(6), or SQLite's
// unixepoch), and only those whose aggregate has no earlier row waiting for
// a retry or dead-lettered. So while event k of an aggregate waits, k+1 is
// not handed out (the seed article's query, "status=0 AND due ORDER BY id",
// would send it first), and other aggregates flow on. It reads by status,
// never "id greater than the last seen", so a transaction that got a lower
// id but committed late is still published.
//
// # Outcomes
//
//   - Acknowledged: marked sent (status 1) with one statement per batch.
//   - A per-message failure (PublishErrors): the aggregate's first failed
//     message counts an attempt and gets next_retry_at = database now +
//     backoff (RetryInitial x 2^(attempt-1), jittered, capped at RetryMax;
//     defaults 2, 4, 8, 16, 32 s from the seed). Later messages of the same
//     aggregate in the batch stay pending without an attempt.
//   - After MaxAttempts (default 6: the first try plus 5 retries), or at
//     once for errors wrapping ErrPermanent: dead-lettered (status 2, last
//     error kept, next_retry_at "never"), OnDeadLetter is called, and with
//     HoldAggregate (the default) the aggregate stays held until an operator
//     retries or skips it (DeadLetters); with SkipDead it moves on.
//   - Errors wrapping ErrUnavailable (misconfiguration: authorization,
//     unknown topic): no attempt is counted, OnUnavailable is called, and
//     the relay backs off as a whole. A configuration mistake never
//     dead-letters the backlog.
//   - The whole batch failed (broker unreachable, timeout): nothing is
//     recorded; the relay backs off as a whole (exponential, 100 ms to
//     30 s) and re-sends later. No attempt is burned by an outage.
//
// # Crashes
//
// Claiming writes nothing: there is no "in flight" state in the table that
// a crash could leave behind. A relay killed between the broker's
// acknowledgement and mark-sent re-sends what it had not marked: at most
// two batches, because marking one batch sent overlaps publishing the
// next. Duplicates carry the same message ID.
//
// # Stopping
//
// Cancelling Run's context or calling Stop stops claiming; the in-flight
// batch finishes (bounded by PublishTimeout) and its outcomes are recorded,
// including the background mark-sent of the batch before; Run then returns
// nil. A graceful stop therefore causes no duplicates. Stop's own context bounds the wait: when it ends,
// in-flight work is cancelled and its rows stay pending.
//
// # Limits of this version
//
// Run one relay per outbox table: several relays on one table would
// publish rows twice and could interleave an aggregate's events. Leased,
// fenced partition ownership for several instances is planned.
package relay
