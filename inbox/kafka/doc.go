// Package inboxkafka consumes the Kafka topics the outbox relay publishes to
// and applies every record through an inbox ([inbox.Inbox.Handle]): the
// dedupe row and the handler's changes commit in one transaction of the
// consumer's database, so at-least-once delivery becomes exactly-once
// effects.
//
//	in, _ := inbox.New(inbox.Config{Dialect: driver.Postgres, Consumer: "billing"})
//	r, _ := inboxkafka.NewRunner(inboxkafka.Config{
//		Brokers: []string{"127.0.0.1:9092"}, Group: "billing", Topics: []string{"outbox.event.order"},
//		Inbox: in, DB: db,
//		Handler: func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
//			_, err := tx.ExecContext(ctx, "UPDATE accounts SET ...", m.AggregateID)
//			return err
//		},
//	})
//	err := r.Run(ctx) // until ctx is cancelled
//
// # Client: franz-go, cooperative-sticky balancing
//
// The runner uses franz-go (github.com/twmb/franz-go/pkg/kgo): its consumer
// group calls back on every assignment, revocation and loss with exactly the
// partitions concerned, it can block a rebalance between a poll and the
// hand-over of the polled records ([kgo.BlockRebalanceOnPoll]), it pauses
// and resumes single partitions without losing buffered records, and it
// talks to the in-process kfake broker the project's tests use. The
// balancer is cooperative-sticky ([kgo.CooperativeStickyBalancer]): a
// member joining or leaving moves only the partitions that must move, and
// every other partition keeps being processed through the rebalance (an
// eager balancer stops every worker of every member at each rebalance).
// Config.Kgo may set another balancer.
//
// # One goroutine per partition
//
// Each assigned partition has one worker goroutine that handles its records
// one at a time, in offset order, so the records of one aggregate (one key,
// one partition) are applied in the order the relay published them. The
// poll loop only hands records over (it never waits for a handler); a
// partition whose worker has more than Config.MaxBufferedRecords waiting is
// paused at the client and resumed when its worker has caught up, so a slow
// or failing partition neither blocks the others nor fills memory.
//
// # Batches
//
// With Config.BatchSize (2 to inbox.MaxBatch, opt-in) a worker takes up to
// that many queued records of its partition (waiting up to BatchLinger for
// more when fewer are queued) and applies them in one transaction with
// inbox.Inbox.HandleBatch: one commit per batch instead of one per record,
// which is what bounds a partition's rate (BENCHMARKS.md "Batched inbox").
// A record whose handler failed in the batch, and the later records of its
// aggregate in it, are then handled one at a time with the usual retries
// and parking (the batch's try counts as the first attempt); the batch's
// last offset becomes committable only once every record of it has an
// outcome stored.
//
// # Offsets follow the database
//
// Auto-commit is off. A record's offset becomes committable only after its
// outcome is stored in the consumer's database: the handler's transaction
// committed (Applied), the inbox recognised it (Duplicate), stored it behind
// a parked message of its aggregate (Held), or parked it. A committer
// commits the offsets of finished records every Config.CommitInterval, and
// on every revocation and on shutdown. A crash between the database commit
// and the offset commit redelivers records whose effects are already
// applied; the inbox reports them as Duplicate and runs no handler. An
// offset is never committed for a record whose outcome is not stored (one
// exception, a record the inbox can never store: see Failures).
//
// # Rebalances
//
// With [kgo.BlockRebalanceOnPoll] the group's callbacks run only between
// hand-overs, never while the poll loop distributes records, so records of a
// partition never reach a worker after it was revoked. On revocation the
// runner stops the partition's worker (a handler in progress finishes; a
// backoff wait between attempts is cut short) and waits for it before the
// callback returns, then commits what the worker finished, so the next
// owner starts after it and no partition's handler ever runs twice at
// once. A partition lost (a fatal group error: the member was kicked) is
// stopped and waited for the same way, without a commit (it would fail);
// its next owner redelivers from the last commit and the inbox dedupes.
// A handler attempt has a deadline, Config.AttemptTimeout (default 30 s,
// below franz-go's default rebalance timeout of 60 s); a handler that
// ignores its context and runs past the rebalance timeout delays the
// rebalance until the member is removed from the group.
//
// # Failures
//
// A handler error rolls the transaction back; the record is tried again
// after an exponential backoff with jitter ([github.com/cenkalti/backoff/v4])
// up to Config.MaxAttempts attempts (a handler error wrapping
// [ErrPermanent] is not retried), then parked with [inbox.Inbox.ParkAfter]
// (cause and attempts recorded): the message is stored in the inbox's
// dead-letter state and its aggregate is held, so the aggregate's later
// records are stored as Held as they arrive (their offsets move on) until
// the parked message is retried or skipped. [Runner.Retry] runs parked and
// held messages through the runner's handler, in order
// (inbox.Inbox.Retry); `outbox inbox parked list` lists them. An
// operator's `outbox inbox parked skip` (inbox.Inbox.Skip) and `outbox
// inbox parked retry` (inbox.Inbox.RequestRetry) record retry requests,
// which the runner serves with its handler every Config.RequestInterval
// (inbox.Inbox.ServeRequests): a skip releases the held records behind the
// skipped one, in order. Policy [SkipAfterPark] parks and then skips the
// message at once, so its aggregate is not held.
//
// Errors of the inbox itself (the database unreachable, a commit failing)
// are not the handler's fault: they are retried with backoff, without
// limit and without counting attempts, and never park anything. A record
// the inbox can never store (inbox.ErrInvalidMessage: say a message ID
// header that is not UTF-8, from a producer other than the relay) is
// logged at ERROR, counted (Stats.Invalid) and passed over, the only case
// of an offset committed without a stored outcome. A handler panic is
// recovered (by the inbox) and counts as a handler error wrapping
// [ErrHandlerPanic]. Run checks the inbox schema before it joins the
// group and returns inbox.ErrSchemaMissing (or ErrSchemaOutdated,
// ErrSchemaTooNew) rather than retrying every record against a table that
// is not there.
//
// # Trace context
//
// The relay writes the W3C trace headers (traceparent, tracestate, baggage)
// captured at Emit into every record. The runner does not import
// OpenTelemetry: Config.ContextFor derives each handler's context from the
// record, and with the otel module (github.com/sqloutbox/outbox/otel) it
// is a header lookup:
//
//	ContextFor: func(ctx context.Context, rec *kgo.Record) context.Context {
//		return outboxotel.Extract(ctx, func(k string) string {
//			for _, h := range rec.Headers {
//				if h.Key == k {
//					return string(h.Value)
//				}
//			}
//			return ""
//		})
//	},
//
// # Metrics
//
// [NewMetrics] registers Prometheus collectors (processed, duplicates, held,
// parked, handler errors, handler duration, lag per partition). It is an
// [inbox.Observer] (the outcomes, counted where the inbox decides them, so
// Retry's work counts too) and an [Observer] of the runner (the lag): give
// it to inbox.Config.Observer and to Config.Observer.
package inboxkafka
