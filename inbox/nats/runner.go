package inboxnats

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/consume"
)

// fpAfterStore is the runner's failpoint (the root module's
// internal/failpoint, OUTBOX_FAILPOINTS=inboxnats/after-store=kill@N): a
// delivery's or a batch's outcome is stored, its acknowledgement not yet
// sent.
const fpAfterStore = "inboxnats/after-store"

// Defaults and minimums of Config.
const (
	// DefaultMaxAttempts is how many times a message's handler is tried
	// before the message is parked.
	DefaultMaxAttempts = consume.DefaultMaxAttempts
	// DefaultRetryInitial is the backoff before the second attempt; each
	// further one doubles, up to DefaultRetryMax, with ±20 % jitter.
	DefaultRetryInitial = consume.DefaultRetryInitial
	// DefaultRetryMax caps the backoff between attempts.
	DefaultRetryMax = consume.DefaultRetryMax
	// DefaultAttemptTimeout bounds one handler attempt (its context's
	// deadline).
	DefaultAttemptTimeout = consume.DefaultAttemptTimeout
	// DefaultBatchLinger is how long a worker waits for more messages
	// when BatchSize is set and fewer than BatchSize are waiting.
	DefaultBatchLinger = consume.DefaultBatchLinger
	// DefaultRequestInterval is how often the runner serves retry
	// requests (inbox.Inbox.ServeRequests: `outbox inbox parked skip` and
	// `retry`).
	DefaultRequestInterval = consume.DefaultRequestInterval
	// DefaultWorkers is how many aggregate shards are applied in
	// parallel.
	DefaultWorkers = 8
	// DefaultMaxAckPending is how many delivered, unacknowledged messages
	// the consumer may have at once (JetStream's MaxAckPending) without
	// BatchSize; with it the default is 2 × Workers × BatchSize if that is
	// more (1,024 at 8 workers and BatchSize 64), which batches of 64 need
	// (1,415-1,430 events/s at 256 against 3,932-4,387 at 1,000 on
	// PostgreSQL), while one message per transaction kept its throughput
	// at 256 (486-590 against 473-632). It bounds what a handover under a
	// backlog delivers again (the messages after the ack floor): see the
	// package documentation.
	DefaultMaxAckPending = 256
	// DefaultAckWait is the consumer's AckWait: after it, JetStream
	// delivers an unacknowledged message again. Generous, since with one
	// fetching process a redelivery within a session only costs a
	// duplicate (see the package documentation).
	DefaultAckWait = 5 * time.Minute
	// DefaultFetchMaxWait is how long one pull request waits at the
	// server for messages (its expiry; heartbeats every half of it).
	DefaultFetchMaxWait = 5 * time.Second
	// MinFetchMaxWait is the shortest FetchMaxWait accepted.
	MinFetchMaxWait = time.Second
	// DefaultLeaseBucket is the NATS KV bucket holding the leases.
	DefaultLeaseBucket = "outbox_inbox_leases"
	// DefaultLeaseTTL is how long a lease outlives its last renewal: the
	// longest a dead holder keeps the durable from being consumed.
	DefaultLeaseTTL = 10 * time.Second
	// MinLeaseTTL is the shortest LeaseTTL accepted.
	MinLeaseTTL = time.Second
	// pullMessages is how many messages one pull request asks for (at
	// most MaxAckPending).
	pullMessages = 256
)

// Errors.
var (
	// ErrInvalidConfig is returned (wrapped) by NewRunner for a missing or
	// out-of-range setting.
	ErrInvalidConfig = errors.New("inboxnats: invalid config")
	// ErrStarted is returned by Run when the runner already ran.
	ErrStarted = errors.New("inboxnats: Run already called")
	// ErrUnsupportedStream is returned (wrapped) by Run for a stream whose
	// retention is not LimitsPolicy: the runner deletes and recreates its
	// durable consumer at every lease handover, which on an interest or
	// work-queue stream could remove messages no consumer acknowledged.
	ErrUnsupportedStream = errors.New("inboxnats: unsupported stream")
	// ErrLeaseBucket is returned (wrapped) by Run when the lease bucket
	// exists with a TTL below LeaseTTL, or none.
	ErrLeaseBucket = errors.New("inboxnats: unusable lease bucket")
	// ErrStreamNotFound is wrapped by Run (with Config.FailFast) and by
	// Ready when Config.Stream does not exist on the server; the error
	// names the stream and the command that creates it (`outbox nats
	// stream create --stream NAME`). It is inbox.ErrSourceMissing.
	ErrStreamNotFound = inbox.ErrSourceMissing
	// ErrNotReady is wrapped by Ready while the runner is not consuming
	// (inbox.ErrNotReady).
	ErrNotReady = inbox.ErrNotReady
	// ErrPermanent marks a handler error that retrying cannot fix: a
	// handler error wrapping it (errors.Is) parks the message after the
	// first attempt. It is inbox.ErrPermanent, shared by every broker's
	// runner.
	ErrPermanent = inbox.ErrPermanent
	// ErrHandlerPanic wraps the value of a recovered handler panic; it
	// counts as a handler error (retried, then parked). It is
	// inbox.ErrHandlerPanic: the inbox recovers the panic.
	ErrHandlerPanic = inbox.ErrHandlerPanic
)

// Handler applies one message to the consumer's database inside tx, the
// inbox's transaction (the dedupe row commits with it). It must not
// commit or roll back tx. An error rolls the transaction back and the
// message is retried, then parked. ctx carries the values of Run's
// context (and what Config.ContextFor adds) and the deadline
// Config.AttemptTimeout; it is not cancelled at shutdown or when the
// lease is lost: the runner waits for a handler in progress, so a handler
// must honour ctx (database/sql calls do).
type Handler func(ctx context.Context, tx *sql.Tx, msg inbox.Message) error

// FailurePolicy says what happens to a message whose handler failed every
// attempt (or failed with ErrPermanent): inbox.FailurePolicy, shared by
// every broker's runner.
type FailurePolicy = inbox.FailurePolicy

const (
	// ParkAndHold parks the message (inbox.Inbox.Park) and so holds its
	// aggregate: the aggregate's later messages are stored as Held, not
	// applied, until the parked message is retried or skipped. The
	// default; it keeps the order of every aggregate.
	ParkAndHold = inbox.ParkAndHold
	// SkipAfterPark parks the message, for the record of it, and skips it
	// at once (inbox.Inbox.Skip), so its aggregate is not held and later
	// messages are applied: order is given up for that message.
	SkipAfterPark = inbox.SkipAfterPark
)

// Config configures a Runner. Conn, Stream, Durable, Inbox, DB and
// Handler are required; every other field has a default.
type Config struct {
	// Conn is the NATS connection (JetStream enabled). Its options (URLs,
	// TLS, credentials, reconnects) are the caller's, and so is closing
	// it, after Run returned: Run returns an error wrapping
	// nats.ErrConnectionClosed if it is closed under it.
	Conn *nats.Conn
	// Stream is the stream the relay publishes into (natspub's
	// DefaultStreamName, "OUTBOX", unless you named it). Its retention
	// must be LimitsPolicy (the default, and what the relay's
	// `outbox nats stream create` makes). While it does not exist the
	// runner logs one WARN naming it and the command that creates it,
	// Ready fails (ErrStreamNotFound), and it looks again with backoff (up
	// to 5 s); see FailFast.
	Stream string
	// FailFast makes Run return an error wrapping ErrStreamNotFound at
	// start, before competing for the lease, when Stream does not exist,
	// instead of waiting for it to appear. Default false.
	FailFast bool
	// Durable names the runner's durable pull consumers on Stream
	// (letters, digits, "-" and "_"). They belong to the runner: each
	// session (lease acquired) creates one, named Durable, "_" and 12 hex
	// digits (Runner.ConsumerName), from its predecessors' ack floor, and
	// then deletes them. Give every runner of one application the same
	// Durable (and the same inbox consumer name), and no other consumer a
	// name of that form.
	Durable string
	// FilterSubject, if set, restricts the consumer to a subject
	// (wildcards allowed, e.g. "outbox.event.order.>"). Default: the whole
	// stream.
	FilterSubject string
	// Inbox stores dedupe rows and parked messages.
	Inbox *inbox.Inbox
	// DB is the consumer's database, where Inbox's table and the
	// handler's business tables live. Size its pool for Workers
	// connections (each worker holds one during a handler).
	DB *sql.DB
	// Handler applies one message in the inbox's transaction.
	Handler Handler

	// MaxAttempts is how many times a handler is tried before the message
	// is parked (1: park on the first failure). Default DefaultMaxAttempts.
	MaxAttempts int
	// Backoff returns a fresh backoff for one message's retries; it is
	// also used, without an attempt limit, while the inbox itself fails
	// (the database unreachable). backoff.Stop means "the default cap".
	// Default: exponential from DefaultRetryInitial to DefaultRetryMax,
	// ±20 % jitter, no elapsed-time limit.
	Backoff func() backoff.BackOff
	// AttemptTimeout is the deadline of one handler attempt's context
	// (inbox.Handle's transaction included); an attempt that runs out is a
	// failed attempt. Default DefaultAttemptTimeout; negative: no deadline.
	AttemptTimeout time.Duration
	// OnFailure is the policy for a message that failed every attempt.
	// Default ParkAndHold.
	OnFailure FailurePolicy
	// ContextFor derives a handler's context from the message, e.g. to
	// continue the trace whose context the relay put in the headers (see
	// the package documentation for outboxotel.Extract). The message must
	// not be modified (nor acknowledged). Default: ctx unchanged.
	ContextFor func(ctx context.Context, msg jetstream.Msg) context.Context
	// Observer is told about every delivery's outcome and every failed
	// attempt. Its methods are called from the workers concurrently and
	// must not block. Default none.
	Observer Observer
	// Logger receives the runner's logs. Default slog.Default().
	Logger *slog.Logger
	// BatchSize, from 2 to inbox.MaxBatch (64), applies up to that many
	// messages of a worker in one transaction (inbox.Inbox.HandleBatch),
	// which multiplies a worker's throughput. A message whose handler
	// fails in a batch, and the later messages of its aggregate in it,
	// are then handled one at a time with the usual retries and parking.
	// Default 0 (or 1): one message per transaction.
	BatchSize int
	// BatchLinger is how long a worker waits for more messages when fewer
	// than BatchSize are waiting. Default DefaultBatchLinger; ignored
	// without BatchSize.
	BatchLinger time.Duration
	// RequestInterval is how often the runner serves the inbox's retry
	// requests with its Handler (inbox.Inbox.ServeRequests). Default
	// DefaultRequestInterval; negative: never (call Retry yourself).
	RequestInterval time.Duration
	// Workers is how many workers apply messages in parallel; an
	// aggregate's messages always go to the same worker (a hash of its
	// type and ID), in stream order. Default DefaultWorkers.
	Workers int
	// MaxAckPending is the consumer's MaxAckPending: how many delivered
	// messages may await their acknowledgement, the most work in flight
	// (a stuck worker's queue fills up to it, then deliveries pause until
	// it moves), and what a handover under a backlog delivers again (the
	// messages after the ack floor, the inbox skipping those applied).
	// Default DefaultMaxAckPending (256), or 2 × Workers × BatchSize if
	// that is more.
	MaxAckPending int
	// AckWait is the consumer's AckWait: JetStream delivers a message
	// again when it was not acknowledged within it. Default
	// DefaultAckWait; see the package documentation for why it matters
	// little here.
	AckWait time.Duration
	// FetchMaxWait is how long one pull request waits at the server
	// (expiry; the server sends heartbeats every half of it, and two
	// missed ones make the runner pull again). Default
	// DefaultFetchMaxWait; minimum MinFetchMaxWait.
	FetchMaxWait time.Duration
	// LeaseBucket is the NATS KV bucket holding the consumer leases (one
	// key per stream and durable, LeaseKey). Created if missing, with
	// TTL LeaseTTL and file storage; an existing one must have a TTL of at
	// least LeaseTTL. Default DefaultLeaseBucket.
	LeaseBucket string
	// LeaseTTL is how long the lease outlives its last renewal (the
	// bucket's TTL): the runner renews it every LeaseTTL/3 and stops
	// consuming when no renewal succeeded for LeaseTTL·4/5. It is the
	// longest a crashed holder keeps the durable from being consumed.
	// Default DefaultLeaseTTL; minimum MinLeaseTTL.
	LeaseTTL time.Duration
}

var (
	// nameRE: JetStream stream and consumer names the runner accepts.
	nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
	// bucketRE: valid KV bucket names.
	bucketRE = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)
)

func (c Config) withDefaults() Config {
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = max(DefaultMaxAckPending, 2*c.Workers*c.BatchSize)
	}
	if c.AckWait == 0 {
		c.AckWait = DefaultAckWait
	}
	if c.FetchMaxWait == 0 {
		c.FetchMaxWait = DefaultFetchMaxWait
	}
	if c.LeaseBucket == "" {
		c.LeaseBucket = DefaultLeaseBucket
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	return c
}

// Stats are a runner's counters since NewRunner (deliveries, not
// messages: a redelivered message counts again).
type Stats struct {
	// Applied: handlers whose transaction committed.
	Applied int64
	// Duplicates: deliveries the inbox recognised; no handler ran.
	Duplicates int64
	// Held: deliveries stored behind a parked message of their aggregate.
	Held int64
	// Parked: deliveries parked after failing (with SkipAfterPark, also
	// skipped).
	Parked int64
	// HandlerErrors: failed handler attempts (retries included).
	HandlerErrors int64
	// StoreErrors: failed inbox operations (the database, not the
	// handler).
	StoreErrors int64
	// Invalid: deliveries the inbox refused to store
	// (inbox.ErrInvalidMessage), logged at ERROR and passed over.
	Invalid int64
	// Batches: transactions of several messages committed with BatchSize;
	// Applied counts their messages too.
	Batches int64
	// Acks: acknowledgements sent.
	Acks int64
	// Redelivered: deliveries JetStream marked as redelivered (AckWait
	// ran out within a session).
	Redelivered int64
	// Sessions: leases acquired (each starts a session that recreates the
	// consumer from its ack floor).
	Sessions int64
	// Restarts: consumer recreations within a session, after a fetch
	// error or a lost delivery (a gap in the consumer's delivery
	// sequence).
	Restarts int64
	// Leading: this runner holds the lease and consumes now.
	Leading bool
}

// Runner consumes Config.Durable on Config.Stream while it holds the
// durable's lease and applies each message through the inbox. Create it
// with NewRunner; Run it once.
type Runner struct {
	cfg Config
	log *slog.Logger
	eng *consume.Engine
	js  jetstream.JetStream

	started atomic.Bool
	leading atomic.Bool

	acks, redelivered, sessions, restarts atomic.Int64
	consumer                              atomic.Pointer[string] // the consumer of the current or last session

	fatalOnce sync.Once
	fatalErr  error
	stop      context.CancelFunc // ends Run's lease loop after a fatal error

	health *consume.Health
}

// NewRunner validates cfg and returns a Runner. It returns an error
// wrapping ErrInvalidConfig for a missing Conn, Stream, Durable, Inbox,
// DB or Handler, a Stream or Durable of other characters than letters,
// digits, "-" and "_", an invalid LeaseBucket name, a MaxAttempts below
// 1, an unknown OnFailure, a BatchSize outside 0..inbox.MaxBatch, a
// negative BatchLinger, Workers, MaxAckPending or AckWait, a FetchMaxWait
// below MinFetchMaxWait or a LeaseTTL below MinLeaseTTL. It does not
// contact the server: Run does.
func NewRunner(cfg Config) (*Runner, error) {
	cfg = cfg.withDefaults()
	switch {
	case cfg.Conn == nil || cfg.Stream == "" || cfg.Durable == "":
		return nil, fmt.Errorf("%w: Conn, Stream and Durable are required", ErrInvalidConfig)
	case !nameRE.MatchString(cfg.Stream):
		return nil, fmt.Errorf("%w: Stream %q: want letters, digits, - and _", ErrInvalidConfig, cfg.Stream)
	case !nameRE.MatchString(cfg.Durable):
		return nil, fmt.Errorf("%w: Durable %q: want letters, digits, - and _", ErrInvalidConfig, cfg.Durable)
	case !bucketRE.MatchString(cfg.LeaseBucket):
		return nil, fmt.Errorf("%w: LeaseBucket %q: want letters, digits, - and _", ErrInvalidConfig, cfg.LeaseBucket)
	case strings.ContainsAny(cfg.FilterSubject, " \t\r\n"):
		return nil, fmt.Errorf("%w: FilterSubject %q has white space", ErrInvalidConfig, cfg.FilterSubject)
	case cfg.Workers < 1:
		return nil, fmt.Errorf("%w: Workers %d is below 1", ErrInvalidConfig, cfg.Workers)
	case cfg.MaxAckPending < 1:
		return nil, fmt.Errorf("%w: MaxAckPending %d is below 1", ErrInvalidConfig, cfg.MaxAckPending)
	case cfg.AckWait < 0:
		return nil, fmt.Errorf("%w: negative AckWait %s", ErrInvalidConfig, cfg.AckWait)
	case cfg.FetchMaxWait < MinFetchMaxWait:
		return nil, fmt.Errorf("%w: FetchMaxWait %s is below %s", ErrInvalidConfig, cfg.FetchMaxWait, MinFetchMaxWait)
	case cfg.LeaseTTL < MinLeaseTTL:
		return nil, fmt.Errorf("%w: LeaseTTL %s is below %s", ErrInvalidConfig, cfg.LeaseTTL, MinLeaseTTL)
	}
	r := &Runner{cfg: cfg, log: cfg.Logger.With("component", "inboxnats", "stream", cfg.Stream, "durable", cfg.Durable)}
	s := consume.Settings{Inbox: cfg.Inbox, DB: cfg.DB, Handler: cfg.Handler, MaxAttempts: cfg.MaxAttempts, Backoff: cfg.Backoff,
		AttemptTimeout: cfg.AttemptTimeout, OnFailure: cfg.OnFailure, BatchSize: cfg.BatchSize, BatchLinger: cfg.BatchLinger,
		RequestInterval: cfg.RequestInterval, Logger: r.log, AfterStore: fpAfterStore}.WithDefaults()
	if err := s.Validate(ErrInvalidConfig); err != nil {
		return nil, err
	}
	r.eng = consume.NewEngine(s, r.log, observer{cfg.Observer})
	r.health = consume.NewHealth(r.log)
	return r, nil
}

// Ready reports whether the runner is healthy: nil while it consumes,
// and while it stands by for the lease another runner holds; an error
// wrapping ErrNotReady otherwise: before Run started, after it returned,
// and while its session cannot consume (the cause wrapped too: e.g.
// ErrStreamNotFound while the stream does not exist, or the server's
// error). A readiness probe serves it (HealthHandler). Safe for
// concurrent use.
func (r *Runner) Ready() error { return r.health.Ready() }

// HealthHandler returns an http.Handler for a readiness probe (mount it
// at /readyz, say): 200 "ready" while Ready returns nil, else 503 with
// "not ready: " and Ready's error on one line; any method and path.
func (r *Runner) HealthHandler() http.Handler { return consume.Handler(r.Ready) }

// Stats returns the runner's counters so far. Safe for concurrent use.
func (r *Runner) Stats() Stats {
	c := r.eng.Counters()
	return Stats{Applied: c.Applied, Duplicates: c.Duplicates, Held: c.Held, Parked: c.Parked,
		HandlerErrors: c.HandlerErrors, StoreErrors: c.StoreErrors, Invalid: c.Invalid, Batches: c.Batches,
		Acks: r.acks.Load(), Redelivered: r.redelivered.Load(), Sessions: r.sessions.Load(), Restarts: r.restarts.Load(),
		Leading: r.leading.Load()}
}

// Retry runs the parked and held messages that f selects through the
// runner's Handler, with inbox.Inbox.Retry (an aggregate's in the order
// they were stored, each in its own transaction; an aggregate stops at its
// first failure, which stays parked). It returns how many were applied and
// Retry's errors (inbox.ErrInvalidFilter, inbox.ErrNothingMatched, handler
// failures wrapping inbox.ErrHandler). A handler panic is an error
// wrapping ErrHandlerPanic. It may be called whether or not Run runs, on
// any instance, lease holder or not (an admin endpoint of the consumer).
func (r *Runner) Retry(ctx context.Context, f inbox.ParkedFilter) (int, error) {
	return r.eng.Retry(ctx, f)
}

// Run checks the inbox schema (inbox.Inbox.Check), then, until ctx is
// cancelled, competes for the durable's lease and consumes while it holds
// it (see the package documentation), serving retry requests every
// RequestInterval meanwhile. When ctx is cancelled it stops fetching,
// waits for the handlers in progress (their outcomes are stored and
// acknowledged; what was fetched and not started is left unacknowledged
// for the next holder), releases the lease and returns nil.
//
// Broker and database errors during the run are logged and retried; they
// do not end Run. It returns ErrStarted if called twice; the schema's
// error (inbox.ErrSchemaMissing, ErrSchemaOutdated or ErrSchemaTooNew,
// wrapped) without starting (a database that cannot be reached at start
// is logged, and retried like any outage); an error wrapping
// ErrUnsupportedStream for a stream without LimitsPolicy retention,
// ErrLeaseBucket for a lease bucket whose TTL is below LeaseTTL, or
// nats.ErrConnectionClosed if Conn was closed: each after stopping
// cleanly; with Config.FailFast, an error wrapping ErrStreamNotFound
// before competing for the lease when the stream does not exist (without
// it, the runner logs one WARN, Ready fails, and it waits for the stream).
// A Runner is not reusable.
func (r *Runner) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return ErrStarted
	}
	r.eng.SetBase(ctx)
	if err := r.eng.Check(ctx, "inboxnats"); err != nil {
		return err
	}
	js, err := jetstream.New(r.cfg.Conn)
	if err != nil {
		return fmt.Errorf("inboxnats: %w", err)
	}
	r.js = js
	if r.cfg.FailFast {
		if err := r.streamExists(ctx); err != nil {
			r.health.Stopped(err)
			return err
		}
	}
	r.health.OK("inbox consumer starting")
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	r.stop = stop
	lease := &kvLease{js: js, bucket: r.cfg.LeaseBucket, key: LeaseKey(r.cfg.Stream, r.cfg.Durable), ttl: r.cfg.LeaseTTL,
		id: holderID(), fatal: r.fail, warn: r.log.Warn, closed: r.cfg.Conn.IsClosed}
	r.log.Info("inbox consumer starting", "lease_bucket", r.cfg.LeaseBucket, "lease_key", lease.key, "holder", string(lease.id))

	requestsDone := make(chan struct{})
	go func() {
		defer close(requestsDone)
		r.eng.ServeRequests(runCtx)
	}()
	consume.Lead(runCtx, lease, r.cfg.LeaseTTL, r.log, r.session)
	stop()
	<-requestsDone
	r.log.Info("inbox consumer stopped")
	r.fatalOnce.Do(func() {}) // no fatal error from now on
	r.health.Stopped(r.fatalErr)
	return r.fatalErr
}

// streamExists returns nil if the stream exists, an error wrapping
// ErrStreamNotFound if it does not, the server's error otherwise.
func (r *Runner) streamExists(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err := r.js.Stream(ctx, r.cfg.Stream)
	return r.streamErr(err)
}

// streamErr maps jetstream.ErrStreamNotFound to an error wrapping
// ErrStreamNotFound that says what to create.
func (r *Runner) streamErr(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("%w: inboxnats: stream %q does not exist on the server: create it with `outbox nats stream create --stream %s` "+
			"(the stream the relay publishes into), or set Config.Stream to that stream's name (%w)", ErrStreamNotFound, r.cfg.Stream, r.cfg.Stream, err)
	}
	return fmt.Errorf("inboxnats: stream %s: %w", r.cfg.Stream, err)
}

// fail records a fatal error and ends Run.
func (r *Runner) fail(err error) {
	r.fatalOnce.Do(func() {
		r.fatalErr = err
		r.log.Error("inbox consumer stopping", "err", err)
		r.stop()
	})
}

// session runs while this runner holds the lease: it consumes, and
// after a fetch error or a lost delivery consumes again from the ack
// floor, until ctx ends.
func (r *Runner) session(ctx context.Context) error {
	r.sessions.Add(1)
	r.leading.Store(true)
	defer r.leading.Store(false)
	wait := backoff.NewExponentialBackOff(backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second), backoff.WithMaxElapsedTime(0))
	for {
		progressed, err := r.consume(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrUnsupportedStream) {
			r.fail(err)
			return nil
		}
		if r.cfg.Conn.IsClosed() {
			r.fail(fmt.Errorf("inboxnats: %w (last error: %w)", nats.ErrConnectionClosed, err))
			return nil
		}
		if progressed {
			wait.Reset()
		}
		d := wait.NextBackOff()
		if errors.Is(err, ErrStreamNotFound) {
			// Nothing was consumed: not a restart. One WARN until the
			// stream appears.
			if !r.health.Problem("stream not found", err, "the stream does not exist: nothing is consumed until it is created; looking again with backoff", "retry_max", 5*time.Second) {
				r.log.Debug("the stream still does not exist", "retry_in", d)
			}
		} else {
			r.restarts.Add(1)
			if !r.health.Problem(err.Error(), err, "consuming interrupted; the consumer is recreated from its ack floor", "retry_in", d) {
				r.log.Debug("consuming interrupted again", "err", err, "retry_in", d)
			}
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// errGap: a delivery did not arrive (the core NATS hop dropped it).
var errGap = errors.New("inboxnats: a delivery was lost on its way")

// consume recreates the durable consumer from its ack floor and submits
// every message it delivers to a pool, in order, until ctx ends (nil) or
// fetching fails (the error). progressed: something was delivered.
func (r *Runner) consume(ctx context.Context) (progressed bool, err error) {
	cons, name, err := r.recreate(ctx)
	if err != nil {
		return false, err
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(min(r.cfg.MaxAckPending, pullMessages)),
		jetstream.PullExpiry(r.cfg.FetchMaxWait))
	if err != nil {
		return false, fmt.Errorf("inboxnats: pulling from consumer %s: %w", name, err)
	}
	pool := r.eng.NewPool(r.cfg.Workers, r.cfg.MaxAckPending)
	defer func() {
		it.Stop()
		pool.Stop()
		// The acknowledgements are on their way before the next
		// recreation reads the ack floor.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		_ = r.cfg.Conn.FlushWithContext(fctx)
		cancel()
	}()
	next := uint64(1)
	for {
		msg, err := it.Next(jetstream.NextContext(ctx))
		if ctx.Err() != nil {
			return progressed, nil
		}
		if errors.Is(err, jetstream.ErrNoHeartbeat) {
			r.log.Warn("no heartbeat from the server; pulling again", "err", err)
			continue
		}
		if err != nil {
			return progressed, fmt.Errorf("inboxnats: pulling from consumer %s: %w", name, err)
		}
		meta, err := msg.Metadata()
		if err != nil {
			return progressed, fmt.Errorf("inboxnats: message on %s without JetStream metadata: %w", msg.Subject(), err)
		}
		if meta.Sequence.Consumer != next {
			// A later message of an aggregate must not be applied while an
			// earlier one is missing: consume again from the ack floor.
			return progressed, fmt.Errorf("%w: delivery %d, expected %d", errGap, meta.Sequence.Consumer, next)
		}
		next++
		progressed = true
		if meta.NumDelivered > 1 {
			r.redelivered.Add(1)
		}
		if err := pool.Submit(ctx, r.delivery(msg, meta)); err != nil {
			return progressed, nil // ctx ended
		}
	}
}

// ConsumerName returns the name of the durable consumer of this
// runner's current (or last) session, "" before the first: Durable, "_"
// and 12 hex digits.
func (r *Runner) ConsumerName() string {
	if p := r.consumer.Load(); p != nil {
		return *p
	}
	return ""
}

// ownedName reports whether name is one of this runner's consumers:
// Durable itself (as earlier versions named it) or Durable, "_" and 12
// hex digits.
func (r *Runner) ownedName(name string) bool {
	if name == r.cfg.Durable {
		return true
	}
	rest, ok := strings.CutPrefix(name, r.cfg.Durable+"_")
	return ok && sessionSuffix.MatchString(rest)
}

var sessionSuffix = regexp.MustCompile(`^[0-9a-f]{12}$`)

// floorOf is the stream sequence below which consumer info has
// everything acknowledged: its ack floor, or, before its first ack, the
// sequence before its start (JetStream reports an ack floor of 0 then).
func floorOf(info *jetstream.ConsumerInfo) uint64 {
	if info.AckFloor.Consumer > 0 {
		return info.AckFloor.Stream
	}
	if info.Config.DeliverPolicy == jetstream.DeliverByStartSequencePolicy && info.Config.OptStartSeq > 0 {
		return info.Config.OptStartSeq - 1
	}
	return 0
}

// recreate starts the session's consumer: a new durable consumer
// starting after the ack floor of the runner's existing consumers (the
// highest: a later one starts after an earlier one's floor), from the
// stream's start if there is none; then it deletes those. So everything
// not acknowledged is delivered again, in stream order, before anything
// later; the consumer is created before the old ones go, so that no
// crash between the two loses the floor; and acknowledgements a previous
// holder still sends go to a consumer that no longer exists. The calls
// are not cut short by ctx (a lease lost meanwhile): they have their own
// timeout.
func (r *Runner) recreate(ctx context.Context) (jetstream.Consumer, string, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	s, err := r.js.Stream(ctx, r.cfg.Stream)
	if err != nil {
		return nil, "", r.streamErr(err)
	}
	if ret := s.CachedInfo().Config.Retention; ret != jetstream.LimitsPolicy {
		return nil, "", fmt.Errorf("%w: stream %s has %s retention; the runner needs limits retention", ErrUnsupportedStream, r.cfg.Stream, ret)
	}
	var olds []string
	var floor uint64
	names := s.ConsumerNames(ctx)
	for name := range names.Name() {
		if !r.ownedName(name) {
			continue
		}
		c, err := s.Consumer(ctx, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return nil, "", fmt.Errorf("inboxnats: reading consumer %s: %w", name, err)
		}
		olds = append(olds, name)
		floor = max(floor, floorOf(c.CachedInfo()))
	}
	if err := names.Err(); err != nil {
		return nil, "", fmt.Errorf("inboxnats: listing the consumers of %s: %w", r.cfg.Stream, err)
	}
	name := r.cfg.Durable + "_" + randomHex(6)
	cfg := jetstream.ConsumerConfig{Durable: name, Description: "inboxnats runner (github.com/sqloutbox/outbox/inbox/nats)",
		DeliverPolicy: jetstream.DeliverAllPolicy, AckPolicy: jetstream.AckExplicitPolicy, AckWait: r.cfg.AckWait,
		MaxDeliver: -1, MaxAckPending: r.cfg.MaxAckPending, FilterSubject: r.cfg.FilterSubject}
	if len(olds) > 0 && floor > 0 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = floor + 1
	}
	c, err := s.CreateConsumer(ctx, cfg)
	if err != nil {
		return nil, "", fmt.Errorf("inboxnats: creating consumer %s: %w", name, err)
	}
	r.consumer.Store(&name)
	r.health.OK("consuming", "consumer", name)
	for _, old := range olds {
		if err := s.DeleteConsumer(ctx, old); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			r.log.Warn("deleting the previous session's consumer; the next session tries again", "consumer", old, "err", err)
		}
	}
	if len(olds) > 0 {
		r.log.Info("consumer created after its predecessors' ack floor", "consumer", name, "ack_floor", floor, "replaced", olds)
	} else {
		r.log.Info("consumer created from the stream's start", "consumer", name)
	}
	return c, name, nil
}

// ref is a delivery's broker side, for the observer.
type ref struct {
	msg  jetstream.Msg
	meta *jetstream.MsgMetadata
}

// delivery adapts msg for the engine.
func (r *Runner) delivery(msg jetstream.Msg, meta *jetstream.MsgMetadata) *consume.Delivery {
	h := make(map[string]string, len(msg.Headers()))
	for k, vs := range msg.Headers() {
		if len(vs) > 0 {
			h[k] = vs[0]
		}
	}
	d := &consume.Delivery{Msg: message(msg, meta, h), Ref: ref{msg, meta},
		Where: []any{"sequence", meta.Sequence.Stream, "subject", msg.Subject(), "delivered", meta.NumDelivered}}
	d.Ack = func() {
		if err := msg.Ack(); err != nil {
			r.log.Warn("acknowledgement not sent; the message comes again and the inbox dedupes it",
				"sequence", meta.Sequence.Stream, "err", err)
			return
		}
		r.acks.Add(1)
	}
	if r.cfg.ContextFor != nil {
		d.Ctx = r.cfg.ContextFor(r.eng.Base(), msg)
	}
	return d
}

// observer reports the engine's results to the Config's Observer.
type observer struct{ o Observer }

func (o observer) Processed(d *consume.Delivery, res consume.Result) {
	rf := d.Ref.(ref)
	o.o.Processed(Result{Stream: rf.meta.Stream, Sequence: rf.meta.Sequence.Stream, Subject: rf.msg.Subject(),
		Delivered: rf.meta.NumDelivered, Outcome: res.Outcome, Parked: res.Parked, Invalid: res.Invalid,
		Attempts: res.Attempts, Duration: res.Duration})
}

func (o observer) AttemptFailed(d *consume.Delivery, attempt int, err error) {
	rf := d.Ref.(ref)
	o.o.AttemptFailed(rf.meta.Stream, rf.meta.Sequence.Stream, attempt, err)
}
