// Package inboxnats consumes the NATS JetStream stream the outbox relay
// publishes into (relay/nats, package natspub) and applies every message
// through an inbox ([inbox.Inbox.Handle]): the dedupe row and the
// handler's changes commit in one transaction of the consumer's database,
// so at-least-once delivery becomes exactly-once effects, in order per
// aggregate.
//
//	in, _ := inbox.New(inbox.Config{Dialect: driver.Postgres, Consumer: "billing"})
//	r, _ := inboxnats.NewRunner(inboxnats.Config{
//		Conn: nc, Stream: "OUTBOX", Durable: "billing", FilterSubject: "outbox.event.order.>",
//		Inbox: in, DB: db,
//		Handler: func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
//			_, err := tx.ExecContext(ctx, "UPDATE accounts SET ...", m.AggregateID)
//			return err
//		},
//	})
//	err := r.Run(ctx) // until ctx is cancelled
//
// Run as many instances as you like with the same Stream, Durable and
// inbox consumer name: one consumes, the others stand by and take over
// when it stops or dies.
//
// # One consumer at a time: the lease
//
// The relay publishes an aggregate's messages in order, each to the
// aggregate's own subject, so the stream stores them in order. A durable
// pull consumer shared by several processes would hand an aggregate's
// consecutive messages to different processes, which would apply them in
// whatever order their handlers finish (and the server this targets,
// nats-server 2.9, has neither pinned clients nor priority groups to
// prevent it). So exactly one process consumes a durable at a time: the
// one holding its lease, a key of a NATS KV bucket (Config.LeaseBucket,
// created if missing, key [LeaseKey] of stream and durable, value the
// holder's "<host>/<pid>/<random>"). A runner takes the lease by creating
// the key (kv.Create: only if absent), renews it every LeaseTTL/3 by
// updating it at the revision it last wrote (an update fails if anyone
// else wrote since), and releases it by deleting it at that revision. The
// bucket's TTL (LeaseTTL) expires the key of a holder that died: another
// instance takes over within LeaseTTL (default 10 s) plus LeaseTTL/3. A
// holder whose renewals fail stops consuming LeaseTTL·4/5 after the start
// of its last successful renewal, before the server can expire its key,
// whatever the clocks say; a handler it has in progress finishes, and the
// inbox's unique key keeps that message's effect single should the next
// holder get it meanwhile.
//
// # Order at a handover: a new consumer from the ack floor
//
// Every time a runner acquires the lease it creates a durable consumer of
// its own for the session, named Durable, "_" and 12 hex digits
// (Runner.ConsumerName), starting at the message after the ack floor of
// the runner's existing consumers (the stream sequence up to which every
// message is acknowledged; the highest of them, since each starts after
// its predecessor's; from the stream's start when there is none), with
// explicit acks, MaxAckPending, AckWait, FilterSubject and no delivery
// limit, and only then deletes the old ones. Without this, the messages
// the previous holder had received and not acknowledged (it died, or was
// still working on them) would come back only after their AckWait, while
// the same aggregate's later messages are delivered at once: the later
// ones would be applied first. Started from the floor, the new consumer
// delivers everything unacknowledged again in stream order, before
// anything later; what was applied already (acknowledged above the floor,
// or applied but not acknowledged) is recognised by the inbox as
// Duplicate and not applied again. A handover therefore costs duplicate
// deliveries, never a reordering: as many as were acknowledged after the
// oldest unacknowledged message. Under a backlog the workers run ahead of
// the slowest one, so that is about Config.MaxAckPending (256 by default;
// the former 1,000 cost 480-600 per SIGKILL), and more while one
// aggregate is stuck, its handler retrying, and the others go on.
//
// Creating before deleting means no crash between the two loses the
// floor (a consumer left over is deleted by the next session), and
// acknowledgements a partitioned previous holder sends late go to a
// consumer that no longer exists. A consumer that has acknowledged
// nothing yet reports an ack floor of 0 (nats-server 2.9); its floor is
// then the sequence before its start, so a session that ends before its
// first acknowledgement does not send the next one back to the stream's
// start. The consumers belong to the runner: give no other consumer a
// name of their form, and do not delete them by hand: with the last one
// goes the floor, and the next session starts from the stream's start,
// where the inbox recognises only the messages whose rows its retention
// window still keeps (keep the stream's MaxAge below that window and this
// is harmless).
// The stream's retention must be limits (the default, and what `outbox
// nats stream create` makes): on an interest or work-queue stream,
// deleting the consumer could remove messages nobody acknowledged, so Run
// refuses one (ErrUnsupportedStream).
//
// # Within a session: one fetcher, sharded workers
//
// The holder pulls from the consumer with one fetch loop (the jetstream
// package's Messages iterator: pull requests of up to 256 messages that
// wait Config.FetchMaxWait at the server), so it receives the messages in
// stream order, and hands each to the worker of its aggregate (a hash of
// aggregate type and ID, Config.Workers workers): an aggregate's messages
// are applied one after another in stream order, different aggregates in
// parallel. A message whose delivery sequence shows that an earlier
// delivery never arrived (core NATS may drop a message on its way, say at
// a reconnect) makes the runner stop, wait for its workers and recreate
// the consumer from its ack floor as at a handover, rather than apply a
// later message of an aggregate before an earlier one (Stats.Restarts).
// MaxAckPending bounds the delivered, unacknowledged messages: when a
// worker is stuck (a handler retrying, the database down), its queue
// fills with up to that many while the other workers go on, and then
// deliveries pause until it moves.
//
// # Acknowledgements and AckWait
//
// A message is acknowledged only after its outcome is stored in the
// consumer's database: the handler's transaction committed (Applied),
// the inbox recognised it (Duplicate), stored it behind a parked message
// of its aggregate (Held), or parked it. A crash between the commit and
// the acknowledgement redelivers it to the next holder, which finds it
// Duplicate. AckWait (Config.AckWait, default 5 minutes) is when
// JetStream delivers an unacknowledged message again. With a single
// fetcher it matters little: a message delivered again within a session
// is queued behind its first delivery (on the same worker), so by the
// time the copy is handled the first one's outcome is stored, and the
// copy is a Duplicate; a short AckWait only costs duplicate work when
// handlers (or the database) are slow. At a handover nothing waits for
// AckWait, since the consumer is recreated. Keep it well above your
// slowest handler with its retries.
//
// # Batches
//
// With Config.BatchSize (2 to inbox.MaxBatch, opt-in) a worker takes up
// to that many queued messages (waiting up to BatchLinger for more when
// fewer are queued) and applies them in one transaction with
// inbox.Inbox.HandleBatch: one commit per batch instead of one per
// message. A message whose handler failed in the batch, and the later
// messages of its aggregate in it, are then handled one at a time with
// the usual retries and parking; the batch's messages are acknowledged
// once every one of them has an outcome stored.
//
// # Failures
//
// A handler error rolls the transaction back; the message is tried again
// after an exponential backoff with jitter
// ([github.com/cenkalti/backoff/v4]) up to Config.MaxAttempts attempts (a
// handler error wrapping [ErrPermanent] is not retried), then parked with
// [inbox.Inbox.ParkAfter]: its aggregate is held, so the aggregate's later
// messages are stored as Held (and acknowledged) until the parked message
// is retried or skipped. [Runner.Retry] runs parked and held messages
// through the runner's handler, in order; `outbox inbox parked skip` and
// `outbox inbox parked retry` record requests the runner serves every
// Config.RequestInterval. Policy [SkipAfterPark] parks and then skips the
// message at once, so its aggregate is not held. A handler panic is
// recovered (by the inbox) and counts as a handler error wrapping
// [ErrHandlerPanic].
//
// Errors of the inbox itself (the database unreachable) are retried with
// backoff, without limit, and never park anything; the lease is renewed
// meanwhile, and the unacknowledged messages wait. A message the inbox
// can never store (inbox.ErrInvalidMessage) is logged at ERROR, counted
// (Stats.Invalid), acknowledged and passed over. Broker errors (the
// server unreachable, the stream missing, a fetch failing) are logged,
// once per distinct problem, and retried: a fetch error recreates the
// consumer from its ack floor; a missing stream is one WARN naming it and
// `outbox nats stream create --stream NAME`, looked for again with
// backoff; a holder that cannot renew its lease stops consuming.
// [Runner.Ready] fails meanwhile ([ErrNotReady], the cause wrapped), and
// [Runner.HealthHandler] serves it to a readiness probe. Run returns an
// error only for what retrying cannot fix: the inbox schema missing or
// of another version (checked before anything else), a stream without
// limits retention (ErrUnsupportedStream), a lease bucket whose TTL is
// below LeaseTTL (ErrLeaseBucket: a live holder's key would expire),
// Config.Conn closed (nats.ErrConnectionClosed), and, with
// Config.FailFast, a stream that does not exist at start
// (ErrStreamNotFound).
//
// # Shutdown
//
// When Run's context is cancelled the runner stops fetching, waits for
// the handlers in progress (not cancelled: their context carries only
// AttemptTimeout's deadline), acknowledges what they stored, leaves what
// was fetched and not started unacknowledged (the next holder gets it
// again at once, since it recreates the consumer), releases the lease so
// that a standby takes over without waiting for the TTL, and returns nil.
//
// # Trace context
//
// The relay writes the W3C trace headers captured at Emit into every
// message. Config.ContextFor derives each handler's context from the
// message; with the otel module (github.com/sqloutbox/outbox/otel):
//
//	ContextFor: func(ctx context.Context, msg jetstream.Msg) context.Context {
//		return outboxotel.Extract(ctx, msg.Headers().Get)
//	},
package inboxnats
