// Package inboxredis is the inbox's Redis package: [Runner] consumes the
// Redis streams the outbox relay publishes to (relay/redis, package
// redispub) and applies every entry through an inbox
// ([inbox.Inbox.Handle]), so that at-least-once delivery becomes
// exactly-once effects in the consumer's database; [Filter] is a Redis
// pre-filter in front of the inbox table. It lives in its own module
// (github.com/sqloutbox/outbox/inbox/redis) so that inbox users without
// Redis do not download go-redis (github.com/redis/go-redis/v9).
//
//	in, _ := inbox.New(inbox.Config{Dialect: driver.Postgres, Consumer: "billing"})
//	r, _ := inboxredis.NewRunner(inboxredis.Config{
//		Client:  redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}),
//		Streams: []string{"outbox.event.order"}, Group: "billing",
//		Inbox:   in, DB: db,
//		Handler: func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
//			_, err := tx.ExecContext(ctx, "UPDATE accounts SET ...", m.AggregateID)
//			return err
//		},
//	})
//	err := r.Run(ctx) // until ctx is cancelled
//
// # One consumer at a time: the lease
//
// The relay publisher appends each aggregate's entries to one stream in
// order, interleaved with other aggregates'. A consumer group hands a
// stream's entries to whichever of its consumers asks, with no regard for
// aggregates, so two consumers of one group would apply an aggregate's
// entries at once and out of order. So exactly one runner of a group
// consumes at a time: the holder of the group's lease, a Redis key
// (Config.LeaseKey, DefaultLeaseKeyPrefix + Group) whose value is a random
// ID, new at every acquisition. A runner acquires it with SET NX PX
// LeaseTTL, renews it every LeaseTTL/3 with a script that extends the
// expiry (PEXPIRE) only if the key still holds its ID, and releases it at
// shutdown with one that deletes it only then. The others try to acquire
// it every LeaseTTL/3 and take over at most about LeaseTTL after the
// holder died. A holder that could not renew for LeaseTTL·4/5 (Redis
// unreachable, the process stalled) stops consuming before the key can
// expire. Within the holder, a pool of Config.Workers workers applies the
// aggregates in parallel: an entry goes to the worker of its aggregate,
// which applies that aggregate's entries one after another in the order
// they were read.
//
// # Reads are fenced
//
// Every command that gives this consumer entries (XREADGROUP, XAUTOCLAIM)
// runs in a Lua script that first checks that the lease still holds this
// session's ID, and refuses otherwise. So a holder that lost the lease and
// does not know it yet (paused, cut off, its read in flight) cannot take
// an entry once another holder may be consuming: no entry is left with an
// old holder, unhandled, while the new one applies its aggregate's later
// entries. The runner waits for new entries with a plain XREAD BLOCK
// (Config.Block), which takes nothing, and then reads with the fenced
// script.
//
// The fenced read returns this consumer's own pending entries past the
// last one handed to the workers, if there are any, before new ones
// (">"). So an entry delivered by a read whose reply was lost (a timeout,
// a broken connection, a read go-redis retried) is handed over before
// any later one, and the client's retries (MaxRetries) are harmless.
//
// # Order at a handover
//
// A session starts with XGROUP CREATE ... MKSTREAM on each stream (an
// existing group is kept; a new one starts at Config.StartID, by default
// "0", the whole stream). Then XAUTOCLAIM (min-idle 0, over the whole
// pending list) moves every pending entry of the group to this consumer:
// the entries a dead or fenced holder read and did not acknowledge
// (Stats.Claimed, Result.Claimed); the entries it reports deleted from
// the stream are acknowledged (Stats.Deleted). Then the other consumers,
// left with no pending entry, are deleted from the group (XGROUP
// DELCONSUMER), so that XINFO CONSUMERS lists the runners that consume.
// Then the session hands over its pending entries in ID order, then new
// ones. Everything a group delivered has an ID below everything it has
// not delivered yet, so each aggregate's entries reach the workers in
// stream order across any number of handovers. A holder that lost the
// lease finishes the handler in progress; should the next holder get the
// same entry meanwhile, the inbox's unique key stores it once (the second
// sees a Duplicate) and the aggregate's next entry waits for it.
//
// # What an acknowledgement means
//
// An entry is acknowledged (XACK) only after its outcome is stored in the
// consumer's database: the handler's transaction committed (Applied), the
// inbox recognised it (Duplicate), stored it behind a parked message of
// its aggregate (Held), or parked it. The XACKs go out in pipelined
// batches right after the stores. An entry not acknowledged stays in the
// group's pending entries list; Redis Streams have no acknowledgement
// timeout (NATS's AckWait, RabbitMQ's redelivery on close): a pending
// entry is delivered again only when a new session claims it, after the
// holder stopped, died or lost the lease. A crash between the commit and
// the XACK thus redelivers entries whose effects are applied; the inbox
// reports them as Duplicate and runs no handler. An entry is never
// acknowledged with its outcome not stored (exceptions: an entry the
// inbox can never store, and an entry deleted from the stream; see
// Failures).
//
// # Batches
//
// With Config.BatchSize (2 to inbox.MaxBatch, opt-in) a worker takes up
// to that many queued entries (waiting up to BatchLinger for more) and
// applies them in one transaction with inbox.Inbox.HandleBatch; an entry
// whose handler failed in the batch, and its aggregate's later entries in
// it, are then handled one at a time with the usual retries and parking.
// The batch's entries are acknowledged once every one has its outcome
// stored.
//
// # Shutdown
//
// When Run's context is cancelled the runner stops reading (a wait in
// progress ends within Config.Block), lets each worker finish the entry
// or batch in progress (a handler is never interrupted; a backoff wait
// between attempts is cut short), acknowledges what was stored, releases
// the lease and returns nil. What the workers had queued and not started
// stays pending, for the next holder. The same happens when the lease is
// lost, except that the lease is not released (it is not this runner's)
// and the runner keeps trying to acquire it again.
//
// # Failures
//
// A handler error rolls the transaction back; the entry is tried again
// after an exponential backoff with jitter
// ([github.com/cenkalti/backoff/v4]) up to Config.MaxAttempts attempts (a
// handler error wrapping [ErrPermanent] is not retried), then parked with
// [inbox.Inbox.ParkAfter]: its aggregate is held, so the aggregate's later
// entries are stored as Held as they arrive (and acknowledged) until the
// parked message is retried or skipped. [Runner.Retry] runs parked and
// held messages through the runner's handler in order; an operator's
// `outbox inbox parked skip` and `retry` record retry requests, which the
// runner serves every Config.RequestInterval. Policy [SkipAfterPark]
// parks and then skips the message at once, so its aggregate is not
// held. A handler panic is recovered (by the inbox) and counts as a
// handler error wrapping [ErrHandlerPanic].
//
// Errors of the inbox itself (the database unreachable) are retried with
// backoff without limit and park nothing. An entry the inbox can never
// store (inbox.ErrInvalidMessage: a field that is not UTF-8, from a
// producer other than the relay) is logged at ERROR, counted
// (Stats.Invalid), passed over and acknowledged. A pending entry found
// deleted from its stream before its outcome was stored (trimmed by
// MAXLEN or MINID, XDEL) is lost: logged at ERROR, counted
// (Stats.Deleted) and acknowledged. Trim only streams whose consumers keep
// up.
//
// A stream key that does not exist is created empty with the group
// (MKSTREAM), one WARN per key saying so (a mistyped key receives
// nothing); Config.FailFast makes Run refuse it instead
// ([ErrStreamNotFound]). [Runner.Ready] is nil while the runner consumes
// or stands by, and [Runner.HealthHandler] serves it to a readiness
// probe.
//
// Redis errors are logged (once per distinct error) and retried: a failed read after a backoff,
// a failed XACK by the next session's claim (a redelivery the inbox
// recognises). Redis unreachable for LeaseTTL·4/5 ends the session (the
// renewals fail); the runner consumes again once it acquires the lease.
// A group deleted while the runner consumes (NOGROUP) ends the session;
// the next one creates it again at StartID. Run checks the inbox schema
// before anything else and returns inbox.ErrSchemaMissing (or
// ErrSchemaOutdated, ErrSchemaTooNew) rather than retrying every entry
// against a table that is not there.
//
// # Redis version, ACLs, Cluster
//
// The runner needs Redis 6.2 or later (XAUTOCLAIM; it is tested on 7.0)
// and a user allowed EVAL and EVALSHA, the stream commands XREADGROUP,
// XAUTOCLAIM, XREAD, XACK, XPENDING, XGROUP and XINFO, and SET, GET,
// PEXPIRE and DEL on the lease key.
//
// The fenced scripts take the lease key and the streams together, and an
// XREADGROUP of several streams needs them in one slot anyway: on a
// Cluster give the streams one hash tag (the publisher's Config.Stream)
// and LeaseKey the same one, or run one runner (with its own Group or
// LeaseKey) per stream with LeaseKey "{<stream>}:lease", which hashes
// like the stream.
//
// # Trace context
//
// The relay writes the W3C trace headers (traceparent, tracestate,
// baggage) captured at Emit as entry fields. Config.ContextFor derives
// each handler's context from the entry; with the otel module
// (github.com/sqloutbox/outbox/otel) it is a field lookup:
//
//	ContextFor: func(ctx context.Context, stream string, e redis.XMessage) context.Context {
//		return outboxotel.Extract(ctx, func(k string) string { s, _ := e.Values[k].(string); return s })
//	},
//
// # The pre-filter
//
// [Filter] is the seed article's "Redis SETNX" method, as a front for the
// inbox table rather than a replacement: inbox.Handle asks it before
// beginning a transaction, and a key that exists skips the message
// without touching the database.
//
//	f, err := inboxredis.New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"}))
//	in, err := inbox.New(inbox.Config{Dialect: driver.Postgres, Consumer: "shipping", Filter: f})
//
// Seen is one EXISTS; Mark, called by the inbox only after the database
// commit, is one SET with an expiry (a key written before a handler that
// then failed would drop the message). The inbox table stays the
// authority: a Redis error in Seen means "unknown" and the table decides,
// and a key that is missing (expired, evicted, lost with a Redis restart,
// deleted by hand) costs one database transaction that finds the
// duplicate, never a second effect. Redis never decides that a message is
// new.
//
// # Outages: a circuit breaker
//
// Without a guard an outage costs every message what the client's timeouts
// and retries allow: Handle waits for Seen (and, after the commit, Mark) to
// fail before it goes on, and go-redis v9's defaults retry a refused dial
// (DialerRetries 5, MaxRetries 3): up to 1.65 s per Handle against a
// closed port. So the Filter runs every call through a circuit breaker
// (github.com/sony/gobreaker/v2): after DefaultTripAfter consecutive
// failures it opens, and for DefaultCooldown every Seen and Mark fails at
// once with ErrUnavailable, without touching the network (the table
// decides, as for any filter error); then one call probes Redis, and a
// success closes the breaker. An outage thus costs the tripping calls,
// then one probe per cooldown. WithBreaker changes both numbers. Short
// client timeouts (say 50-200 ms) still bound the tripping calls and the
// probes.
package inboxredis
