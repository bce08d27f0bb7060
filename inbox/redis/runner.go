package inboxredis

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/consume"
)

// fpAfterStore is the runner's failpoint (the root module's
// internal/failpoint: OUTBOX_FAILPOINTS=inboxredis/after-store=kill@N): an
// entry's (or a batch's) outcome is stored, its XACK not yet sent.
const fpAfterStore = "inboxredis/after-store"

// PayloadField is the entry field that holds a message's payload, the
// relay publisher's (relay/redis redispub.PayloadField); every other field
// is a header.
const PayloadField = "outbox-payload"

// Defaults and minimums of Config.
const (
	// DefaultMaxAttempts is how many times an entry's handler is tried
	// before the entry is parked.
	DefaultMaxAttempts = consume.DefaultMaxAttempts
	// DefaultRetryInitial is the backoff before the second attempt; each
	// further one doubles, up to DefaultRetryMax, with ±20 % jitter.
	DefaultRetryInitial = consume.DefaultRetryInitial
	// DefaultRetryMax caps the backoff between attempts.
	DefaultRetryMax = consume.DefaultRetryMax
	// DefaultAttemptTimeout bounds one handler attempt (its context's
	// deadline).
	DefaultAttemptTimeout = consume.DefaultAttemptTimeout
	// DefaultBatchLinger is how long a worker waits for more entries when
	// BatchSize is set and fewer than BatchSize are waiting.
	DefaultBatchLinger = consume.DefaultBatchLinger
	// DefaultRequestInterval is how often the runner serves the inbox's
	// retry requests (`outbox inbox parked skip` and `retry`).
	DefaultRequestInterval = consume.DefaultRequestInterval
	// DefaultWorkers is how many aggregates are applied in parallel.
	DefaultWorkers = 8
	// DefaultCount is how many entries one read takes per stream (the
	// COUNT of XREADGROUP).
	DefaultCount = 100
	// DefaultBlock is how long one wait for new entries blocks (the BLOCK
	// of XREAD), and so bounds how long a stop waits for a read.
	DefaultBlock = time.Second
	// DefaultStartID is where a group the runner creates starts: "0", the
	// whole stream.
	DefaultStartID = "0"
	// DefaultLeaseKeyPrefix is the lease key's prefix; the group's name
	// follows it.
	DefaultLeaseKeyPrefix = "outbox:inbox:lease:"
	// DefaultLeaseTTL is how long the consumer lease lasts after its last
	// renewal (renewed every third of it).
	DefaultLeaseTTL = 10 * time.Second
	// MinLeaseTTL is the shortest LeaseTTL accepted.
	MinLeaseTTL = 500 * time.Millisecond
)

// Errors.
var (
	// ErrStarted is returned by Run when the runner already ran.
	ErrStarted = errors.New("inboxredis: Run already called")
	// ErrPermanent is inbox.ErrPermanent: a handler error wrapping it
	// parks the entry after the first attempt.
	ErrPermanent = inbox.ErrPermanent
	// ErrHandlerPanic is inbox.ErrHandlerPanic: a recovered handler
	// panic, a handler error like any other (retried, then parked).
	ErrHandlerPanic = inbox.ErrHandlerPanic
	// ErrStreamNotFound is returned (wrapped) by Run with Config.FailFast
	// when a key of Config.Streams does not exist (or is not a stream);
	// the error names the key. It is inbox.ErrSourceMissing.
	ErrStreamNotFound = inbox.ErrSourceMissing
	// ErrNotReady is wrapped by Ready while the runner is not consuming
	// (inbox.ErrNotReady).
	ErrNotReady = inbox.ErrNotReady
)

// notHolder starts the error reply of the runner's scripts when the lease
// is not (or no longer) this session's.
const notHolder = "NOTHOLDER"

// FailurePolicy is inbox.FailurePolicy: what happens to an entry whose
// handler failed every attempt (or failed with ErrPermanent).
type FailurePolicy = inbox.FailurePolicy

const (
	// ParkAndHold parks the entry's message and so holds its aggregate:
	// the aggregate's later entries are stored as Held, not applied,
	// until the parked message is retried or skipped. The default; it
	// keeps the order of every aggregate.
	ParkAndHold = inbox.ParkAndHold
	// SkipAfterPark parks the message, for the record of it, and skips it
	// at once, so its aggregate is not held and later entries are
	// applied: order is given up for that message.
	SkipAfterPark = inbox.SkipAfterPark
)

// Handler applies one message to the consumer's database inside tx, the
// inbox's transaction (the dedupe row commits with it). It must not commit
// or roll back tx. An error rolls the transaction back and the entry is
// retried, then parked. ctx carries the values of Run's context (and what
// Config.ContextFor adds) and the deadline Config.AttemptTimeout; it is
// not cancelled at shutdown or when the lease is lost: the runner waits
// for a handler in progress, so a handler must honour ctx (database/sql
// calls do).
type Handler func(ctx context.Context, tx *sql.Tx, msg inbox.Message) error

// Config configures a Runner. Client, Streams, Group, Inbox, DB and
// Handler are required; every other field has a default.
type Config struct {
	// Client is the Redis client (a *redis.Client, *redis.ClusterClient
	// or *redis.Ring). Its options (address, credentials, TLS, timeouts,
	// pool size) are the caller's, and so is closing it. On a Cluster,
	// the streams and LeaseKey must hash to one slot (hash tags): the
	// runner's scripts take them together. A read is never lost to
	// go-redis's retries (MaxRetries): see the package documentation.
	Client redis.UniversalClient
	// Streams are the stream keys consumed ("outbox.event.order": the
	// relay publisher's DefaultStream of aggregate type order). An
	// aggregate's entries must all be in one stream (the publisher's
	// Config.Stream must map an aggregate to one stream).
	Streams []string
	// Group is the consumer group on every stream. Give every runner of
	// one application the same Group (and the same inbox consumer name):
	// one of them, the lease holder, consumes at a time.
	Group string
	// Consumer is this runner's consumer name in the group. Default
	// "<host>-<pid>-<random>": unique per runner, which the group's
	// pending lists need to tell the runners apart.
	Consumer string
	// Inbox stores dedupe rows and parked messages.
	Inbox *inbox.Inbox
	// DB is the consumer's database, where Inbox's table and the
	// handler's business tables live. Size its pool for Workers
	// connections (each worker holds one during a handler).
	DB *sql.DB
	// Handler applies one message in the inbox's transaction.
	Handler Handler

	// MaxAttempts is how many times a handler is tried before the entry
	// is parked (1: park on the first failure). Default
	// DefaultMaxAttempts.
	MaxAttempts int
	// Backoff returns a fresh backoff for one entry's retries; it is also
	// used, without an attempt limit, while the inbox itself fails (the
	// database unreachable), and between failed reads. backoff.Stop means
	// "the default cap". Default: exponential from DefaultRetryInitial to
	// DefaultRetryMax, ±20 % jitter, no elapsed-time limit.
	Backoff func() backoff.BackOff
	// AttemptTimeout is the deadline of one handler attempt's context
	// (inbox.Handle's transaction included); an attempt that runs out is
	// a failed attempt. A stop, or the loss of the lease, waits for the
	// attempt in progress. Default DefaultAttemptTimeout; negative: no
	// deadline.
	AttemptTimeout time.Duration
	// OnFailure is the policy for an entry that failed every attempt.
	// Default ParkAndHold.
	OnFailure FailurePolicy
	// ContextFor derives a handler's context from the entry, e.g. to
	// continue the trace whose context the relay put in its fields (see
	// the package documentation for outboxotel.Extract). The entry must
	// not be modified. Default: ctx unchanged.
	ContextFor func(ctx context.Context, stream string, entry redis.XMessage) context.Context
	// Observer is told about every entry's outcome. Its methods are
	// called from the workers concurrently and must not block. Default
	// none.
	Observer Observer
	// Logger receives the runner's logs. Default slog.Default().
	Logger *slog.Logger
	// BatchSize, from 2 to inbox.MaxBatch (64), applies up to that many
	// entries of one worker in one transaction (inbox.Inbox.HandleBatch:
	// one dedupe INSERT, the handlers in order, one commit). An entry
	// whose handler fails in a batch, and the later entries of its
	// aggregate in it, are then handled one at a time with the usual
	// retries and parking. Default 0 (or 1): one entry per transaction.
	BatchSize int
	// BatchLinger is how long a worker waits for more entries when fewer
	// than BatchSize are waiting. Default DefaultBatchLinger; ignored
	// without BatchSize.
	BatchLinger time.Duration
	// RequestInterval is how often the runner serves the inbox's retry
	// requests with its Handler (inbox.Inbox.ServeRequests). Default
	// DefaultRequestInterval; negative: never (call Retry yourself).
	RequestInterval time.Duration
	// Workers is how many aggregates are applied in parallel (an entry
	// goes to the worker of its aggregate). Default DefaultWorkers.
	Workers int
	// Count is how many entries one read takes per stream (XREADGROUP
	// COUNT); it is also each worker's queue length. Default
	// DefaultCount.
	Count int
	// Block is how long one wait for new entries blocks at the server
	// (XREAD BLOCK): a stop, or the loss of the lease, waits for the read
	// in progress up to this long. Default DefaultBlock; at least 1 ms.
	Block time.Duration
	// StartID is where a group the runner creates (XGROUP CREATE ...
	// MKSTREAM) starts: "0" the whole stream, "$" only entries added
	// later, or an entry ID ("1700000000000-0"). An existing group is
	// left as it is. Default DefaultStartID.
	StartID string
	// LeaseKey is the key of the consumer lease. Default
	// DefaultLeaseKeyPrefix + Group. Runners of one Group must share it.
	LeaseKey string
	// LeaseTTL is how long the lease lasts after its last renewal; the
	// holder renews it every LeaseTTL/3 and stops consuming when no
	// renewal succeeded for LeaseTTL·4/5. A holder that dies is replaced
	// after at most about LeaseTTL. Default DefaultLeaseTTL; minimum
	// MinLeaseTTL.
	LeaseTTL time.Duration
	// FailFast makes Run return an error wrapping ErrStreamNotFound at
	// start, before competing for the lease, when a key of Streams does
	// not exist or holds no stream (a mistyped key, or a relay that has
	// not published yet), instead of creating it empty (XGROUP CREATE ...
	// MKSTREAM), which it does otherwise, logging one WARN per key it
	// created. Default false.
	FailFast bool
}

// startIDPattern is what StartID may be besides "$".
var startIDPattern = regexp.MustCompile(`^[0-9]+(-[0-9]+)?$`)

func (c Config) withDefaults() Config {
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.Backoff == nil {
		c.Backoff = consume.DefaultBackoff
	}
	if c.AttemptTimeout == 0 {
		c.AttemptTimeout = DefaultAttemptTimeout
	}
	if c.BatchLinger == 0 {
		c.BatchLinger = DefaultBatchLinger
	}
	if c.RequestInterval == 0 {
		c.RequestInterval = DefaultRequestInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	if c.Consumer == "" {
		c.Consumer = defaultConsumer()
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.Count == 0 {
		c.Count = DefaultCount
	}
	if c.Block == 0 {
		c.Block = DefaultBlock
	}
	if c.StartID == "" {
		c.StartID = DefaultStartID
	}
	if c.LeaseKey == "" {
		c.LeaseKey = DefaultLeaseKeyPrefix + c.Group
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	return c
}

// defaultConsumer is "<host>-<pid>-<8 hex digits>".
func defaultConsumer() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "inboxredis"
	}
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + randomHex(4)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// Stats are a runner's counters since NewRunner (entries, not messages: a
// redelivered entry counts again).
type Stats struct {
	// Applied: handlers whose transaction committed.
	Applied int64
	// Duplicates: entries the inbox recognised; no handler ran.
	Duplicates int64
	// Held: entries stored behind a parked message of their aggregate.
	Held int64
	// Parked: entries parked after failing (with SkipAfterPark, also
	// skipped).
	Parked int64
	// HandlerErrors: failed handler attempts (retries included).
	HandlerErrors int64
	// StoreErrors: failed inbox operations (the database, not the
	// handler).
	StoreErrors int64
	// Invalid: entries the inbox refused to store (inbox.ErrInvalidMessage),
	// logged at ERROR and passed over.
	Invalid int64
	// Batches: transactions of several entries committed with BatchSize;
	// Applied counts their entries too.
	Batches int64
	// Sessions: times this runner acquired the lease and started
	// consuming.
	Sessions int64
	// Claimed: pending entries a session took over with XAUTOCLAIM when it
	// started: read by a holder that died or lost the lease (or by this
	// runner in an earlier session) and not acknowledged.
	Claimed int64
	// Deleted: pending entries found deleted from their stream (trimmed,
	// XDEL) before their outcome was stored: lost, logged at ERROR and
	// acknowledged to clear them.
	Deleted int64
}

// Observer is told what the runner does with entries, for metrics and
// tests. Its methods are called from the workers concurrently and must
// not block. (What the inbox does with messages, Retry's included, is
// told to the inbox's own inbox.Observer.)
type Observer interface {
	// Processed is called once per entry whose outcome is stored (or
	// that was passed over as invalid), before its XACK.
	Processed(Result)
	// AttemptFailed is called for every failed handler attempt (attempt
	// counts from 1), before the retry or the park.
	AttemptFailed(stream, id string, attempt int, err error)
}

// Result is one entry's stored outcome.
type Result struct {
	// Stream and ID locate the entry ("1700000000000-0"); the pair names
	// it the same way in every consumer.
	Stream string
	ID     string
	// Outcome is the inbox's (Applied, Duplicate or Held); 0 when Parked
	// or Invalid.
	Outcome inbox.Outcome
	// Parked: every attempt failed and the entry was parked (with
	// SkipAfterPark, also skipped).
	Parked bool
	// Invalid: the inbox refused to store the entry (ErrInvalidMessage);
	// it was passed over.
	Invalid bool
	// Attempts is the number of handler attempts (1 for a success at the
	// first try; counting those that failed).
	Attempts int
	// Duration is the last attempt's inbox call, transaction included (0
	// for a parked entry).
	Duration time.Duration
	// Claimed: the entry was pending when this runner's session started
	// (taken over with XAUTOCLAIM): a redelivery, which the inbox
	// usually reports as Duplicate.
	Claimed bool
}

type nopObserver struct{}

func (nopObserver) Processed(Result)                         {}
func (nopObserver) AttemptFailed(string, string, int, error) {}

// Runner consumes Config.Streams as a consumer of Config.Group while it
// holds the group's lease, and applies each entry through the inbox.
// Create it with NewRunner; Run it once.
type Runner struct {
	cfg   Config
	log   *slog.Logger
	eng   *consume.Engine
	lease *lease

	started atomic.Bool
	runCtx  context.Context // values of Run's ctx, never cancelled

	sessions, claimed, deleted atomic.Int64

	health  *consume.Health
	created sync.Map // stream keys this runner created, warned about once
}

// Ready reports whether the runner is healthy: nil while it consumes,
// and while it stands by for the lease another runner holds; an error
// wrapping ErrNotReady otherwise: before Run started, after it returned,
// and while reading the streams or starting a session fails (the cause
// wrapped too). A readiness probe serves it (HealthHandler). Safe for
// concurrent use.
func (r *Runner) Ready() error { return r.health.Ready() }

// HealthHandler returns an http.Handler for a readiness probe (mount it
// at /readyz, say): 200 "ready" while Ready returns nil, else 503 with
// "not ready: " and Ready's error on one line; any method and path.
func (r *Runner) HealthHandler() http.Handler { return consume.Handler(r.Ready) }

// checkStreams returns an error wrapping ErrStreamNotFound naming the
// keys of Streams that do not exist or hold no stream.
func (r *Runner) checkStreams(ctx context.Context) error {
	var bad []string
	for _, st := range r.cfg.Streams {
		typ, err := r.cfg.Client.Type(ctx, st).Result()
		if err != nil {
			return fmt.Errorf("inboxredis: TYPE %s: %w", st, err)
		}
		if typ != "stream" {
			bad = append(bad, fmt.Sprintf("%q (%s)", st, typ))
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: inboxredis: stream key %s: not a stream: check Config.Streams against the relay's stream keys "+
			"(the relay creates a key at its first publish to it), or create it empty with XGROUP CREATE KEY %s $ MKSTREAM",
			ErrStreamNotFound, strings.Join(bad, ", "), r.cfg.Group)
	}
	return nil
}

// NewRunner validates cfg and returns a Runner. It returns an error
// wrapping ErrInvalidConfig for a missing Client, Streams, Group, Inbox,
// DB or Handler, an empty or repeated stream, a negative MaxAttempts,
// Workers or Count, an unknown OnFailure, a BatchSize above
// inbox.MaxBatch, a negative BatchLinger or Block, a StartID that is
// neither "$" nor an entry ID, or a LeaseTTL below MinLeaseTTL. It does
// not contact Redis: Run does.
func NewRunner(cfg Config) (*Runner, error) {
	cfg = cfg.withDefaults()
	switch {
	case cfg.Client == nil || len(cfg.Streams) == 0 || cfg.Group == "":
		return nil, fmt.Errorf("%w: Client, Streams and Group are required", ErrInvalidConfig)
	case cfg.Workers < 1:
		return nil, fmt.Errorf("%w: Workers %d is below 1", ErrInvalidConfig, cfg.Workers)
	case cfg.Count < 1:
		return nil, fmt.Errorf("%w: Count %d is below 1", ErrInvalidConfig, cfg.Count)
	case cfg.Block < time.Millisecond:
		return nil, fmt.Errorf("%w: Block %s is below 1ms", ErrInvalidConfig, cfg.Block)
	case cfg.StartID != "$" && !startIDPattern.MatchString(cfg.StartID):
		return nil, fmt.Errorf("%w: StartID %q is neither \"$\" nor an entry ID", ErrInvalidConfig, cfg.StartID)
	case cfg.LeaseTTL < MinLeaseTTL:
		return nil, fmt.Errorf("%w: LeaseTTL %s is below %s", ErrInvalidConfig, cfg.LeaseTTL, MinLeaseTTL)
	}
	seen := make(map[string]bool, len(cfg.Streams))
	for _, s := range cfg.Streams {
		if s == "" || seen[s] {
			return nil, fmt.Errorf("%w: stream %q is empty or repeated", ErrInvalidConfig, s)
		}
		seen[s] = true
	}
	cfg.Streams = append([]string(nil), cfg.Streams...)
	s := consume.Settings{Inbox: cfg.Inbox, DB: cfg.DB, MaxAttempts: cfg.MaxAttempts, Backoff: cfg.Backoff,
		AttemptTimeout: cfg.AttemptTimeout, OnFailure: cfg.OnFailure, BatchSize: cfg.BatchSize,
		BatchLinger: cfg.BatchLinger, RequestInterval: cfg.RequestInterval, Logger: cfg.Logger,
		AfterStore: fpAfterStore}
	if cfg.Handler != nil {
		s.Handler = cfg.Handler // a nil Handler stays a nil func for Validate
	}
	if err := s.Validate(ErrInvalidConfig); err != nil {
		return nil, err
	}
	log := cfg.Logger.With("component", "inboxredis", "group", cfg.Group, "consumer", cfg.Consumer)
	r := &Runner{cfg: cfg, log: log, health: consume.NewHealth(log), runCtx: context.Background(),
		lease: &lease{client: cfg.Client, key: cfg.LeaseKey, ttl: cfg.LeaseTTL}}
	r.eng = consume.NewEngine(s, log, observer{cfg.Observer})
	return r, nil
}

// Stats returns the runner's counters so far. Safe for concurrent use.
func (r *Runner) Stats() Stats {
	c := r.eng.Counters()
	return Stats{Applied: c.Applied, Duplicates: c.Duplicates, Held: c.Held, Parked: c.Parked,
		HandlerErrors: c.HandlerErrors, StoreErrors: c.StoreErrors, Invalid: c.Invalid, Batches: c.Batches,
		Sessions: r.sessions.Load(), Claimed: r.claimed.Load(), Deleted: r.deleted.Load()}
}

// Consumer returns the runner's consumer name in the group
// (Config.Consumer or its default).
func (r *Runner) Consumer() string { return r.cfg.Consumer }

// Retry runs the parked and held messages that f selects through the
// runner's Handler, with inbox.Inbox.Retry (an aggregate's in the order
// they were stored, each in its own transaction; an aggregate stops at
// its first failure, which stays parked). It returns how many were
// applied and Retry's errors (inbox.ErrInvalidFilter,
// inbox.ErrNothingMatched, handler failures wrapping inbox.ErrHandler; a
// handler panic wraps ErrHandlerPanic). It may be called whether or not
// Run runs, and whether or not this runner holds the lease.
func (r *Runner) Retry(ctx context.Context, f inbox.ParkedFilter) (int, error) {
	return r.eng.Retry(ctx, f)
}

// Run checks the inbox schema (inbox.Inbox.Check), then, until ctx is
// cancelled, tries to acquire the group's lease and, while it holds it,
// consumes the streams (see the package documentation). When ctx is
// cancelled it stops reading (a read in progress ends within
// Config.Block), lets the handler in progress finish, acknowledges what
// was stored, releases the lease and returns nil. Redis and database
// errors during the run are logged and retried; they do not end Run. It
// returns ErrStarted if called twice, and the schema's error
// (inbox.ErrSchemaMissing, ErrSchemaOutdated or ErrSchemaTooNew,
// wrapped) without starting, so that a consumer deployed before its
// migration fails at once (a database that cannot be reached at start is
// logged, and retried like any outage); with Config.FailFast, an error
// wrapping ErrStreamNotFound when a key of Streams does not exist or is
// not a stream. A Runner is not reusable.
func (r *Runner) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return ErrStarted
	}
	r.runCtx = context.WithoutCancel(ctx)
	r.eng.SetBase(ctx)
	if err := r.eng.Check(ctx, "inboxredis"); err != nil {
		return err
	}
	if r.cfg.FailFast {
		if err := r.checkStreams(ctx); err != nil {
			r.health.Stopped(err)
			return err
		}
	}
	r.health.OK("inbox consumer starting")
	r.log.Info("inbox consumer starting", "streams", r.cfg.Streams, "lease_key", r.cfg.LeaseKey)
	var wg sync.WaitGroup
	wg.Go(func() { r.eng.ServeRequests(ctx) })
	consume.Lead(ctx, r.lease, r.cfg.LeaseTTL, r.log, r.session)
	wg.Wait()
	r.health.Stopped(nil)
	r.log.Info("inbox consumer stopped")
	return nil
}

// session consumes while this runner holds the lease: until ctx ends, the
// lease is found lost, or Redis fails at the start.
func (r *Runner) session(ctx context.Context) error {
	s := &session{r: r, holder: r.lease.current(), n: len(r.cfg.Streams),
		claimedTo: make([]string, len(r.cfg.Streams)), cursor: make([]string, len(r.cfg.Streams)),
		last: make([]string, len(r.cfg.Streams)), index: make(map[string]int, len(r.cfg.Streams))}
	for i, st := range r.cfg.Streams {
		s.index[st] = i
		s.cursor[i] = "0"
		s.last[i] = "0"
	}
	r.sessions.Add(1)
	if err := s.prepare(ctx); err != nil {
		if errors.Is(err, errNotHolder) || ctx.Err() != nil {
			return nil
		}
		r.health.Problem("prepare: "+err.Error(), err, "starting a consumer session failed; the lease is released and taken again")
		return err
	}
	r.health.OK("consuming")
	s.acks = make(chan ackReq, r.cfg.Workers*r.cfg.Count)
	ackDone := make(chan struct{})
	go func() {
		defer close(ackDone)
		s.acker()
	}()
	s.pool = r.eng.NewPool(r.cfg.Workers, max(r.cfg.Count, r.cfg.BatchSize))
	// The workers stop taking deliveries as soon as the session ends (the
	// lease may be lost), not only once a blocked read returns.
	stopPool := context.AfterFunc(ctx, s.pool.Stop)
	err := s.consume(ctx)
	stopPool()
	s.pool.Stop()
	close(s.acks)
	<-ackDone
	if errors.Is(err, errNotHolder) {
		return nil
	}
	return err
}

// loaded returns LoadOrStore's second result.
func loaded(_ any, ok bool) bool { return ok }

// errNotHolder: a fenced command found the lease held by someone else (or
// by nobody).
var errNotHolder = errors.New("inboxredis: the consumer lease is not held by this session")

// session is one tenure of the lease.
type session struct {
	r      *Runner
	holder string // the lease value of this session
	n      int    // streams
	index  map[string]int
	// claimedTo[i]: the highest pending ID of stream i when the session
	// started ("" none): entries up to it were taken over.
	claimedTo []string
	// cursor[i]: the ID of the last entry of stream i handed to the pool
	// (or acknowledged as deleted); "0" at the start.
	cursor []string
	// last[i]: the group's last delivered ID of stream i as known; what a
	// wait waits past.
	last []string
	pool *consume.Pool
	acks chan ackReq
}

type ackReq struct {
	stream int
	id     string
}

// entry is a delivery's Ref.
type entry struct {
	stream  string
	msg     redis.XMessage
	claimed bool
}

// prepare creates the groups, takes every pending entry over and tidies
// the group's consumers.
func (s *session) prepare(ctx context.Context) error {
	r := s.r
	c := r.cfg.Client
	for _, st := range r.cfg.Streams {
		existed, err := c.Exists(ctx, st).Result()
		if err != nil {
			return fmt.Errorf("inboxredis: EXISTS %s: %w", st, err)
		}
		err = c.XGroupCreateMkStream(ctx, st, r.cfg.Group, r.cfg.StartID).Err()
		if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
			return fmt.Errorf("inboxredis: XGROUP CREATE %s %s: %w", st, r.cfg.Group, err)
		}
		if err == nil && existed == 0 && !loaded(r.created.LoadOrStore(st, true)) {
			r.log.Warn("the stream key did not exist: created it empty with the group; if the relay publishes to another key, nothing arrives here "+
				"(check Config.Streams; Config.FailFast refuses a missing key instead)", "stream", st, "group", r.cfg.Group)
		}
	}
	for i, st := range r.cfg.Streams {
		if err := s.claim(ctx, i, st); err != nil {
			return err
		}
	}
	for _, st := range r.cfg.Streams {
		if err := s.tidy(ctx, st); err != nil {
			if errors.Is(err, errNotHolder) {
				return err
			}
			r.log.Debug("removing idle consumers", "stream", st, "err", err)
		}
	}
	s.refresh(ctx)
	return nil
}

// claim moves every pending entry of the group on stream i to this
// consumer (XAUTOCLAIM, min-idle 0, over the whole pending list) and
// acknowledges those reported deleted.
func (s *session) claim(ctx context.Context, i int, st string) error {
	r := s.r
	start := "0-0"
	for {
		cmd := runScript(ctx, r.cfg.Client, fenceScript, redis.NewXAutoClaimWithDeletedCmd, []string{r.cfg.LeaseKey, st},
			s.holder, "XAUTOCLAIM", st, r.cfg.Group, r.cfg.Consumer, "0", start, "COUNT", strconv.Itoa(r.cfg.Count))
		msgs, next, deleted, err := cmd.Result()
		if err != nil {
			return fenceErr(fmt.Sprintf("XAUTOCLAIM %s", st), err)
		}
		for _, m := range msgs {
			if s.claimedTo[i] == "" || idLess(s.claimedTo[i], m.ID) {
				s.claimedTo[i] = m.ID
			}
		}
		r.claimed.Add(int64(len(msgs)))
		if len(deleted) > 0 {
			r.deleted.Add(int64(len(deleted)))
			r.log.Error("pending entries were deleted from the stream before their outcome was stored: lost",
				"stream", st, "entries", deleted)
			if err := r.cfg.Client.XAck(ctx, st, r.cfg.Group, deleted...).Err(); err != nil {
				return fmt.Errorf("inboxredis: XACK %s: %w", st, err)
			}
		}
		if next == "" || next == "0-0" {
			break
		}
		start = next
	}
	if s.claimedTo[i] != "" {
		r.log.Info("pending entries taken over", "stream", st, "up_to", s.claimedTo[i])
	}
	return nil
}

// tidy removes the group's other consumers of stream st that have no
// pending entry (after claim, all of them), so that XINFO CONSUMERS lists
// the runners that consume.
func (s *session) tidy(ctx context.Context, st string) error {
	r := s.r
	cs, err := r.cfg.Client.XInfoConsumers(ctx, st, r.cfg.Group).Result()
	if err != nil {
		return fmt.Errorf("inboxredis: XINFO CONSUMERS %s: %w", st, err)
	}
	for _, c := range cs {
		if c.Name == r.cfg.Consumer || c.Pending > 0 {
			continue
		}
		cmd := runScript(ctx, r.cfg.Client, tidyScript, redis.NewIntCmd, []string{r.cfg.LeaseKey, st},
			s.holder, r.cfg.Group, c.Name)
		if err := cmd.Err(); err != nil {
			return fenceErr("XGROUP DELCONSUMER", err)
		}
	}
	return nil
}

// refresh sets last from the group's last delivered IDs ("$" where they
// cannot be read).
func (s *session) refresh(ctx context.Context) {
	r := s.r
	for i, st := range r.cfg.Streams {
		gs, err := r.cfg.Client.XInfoGroups(ctx, st).Result()
		if err != nil {
			// Wait for entries added after the wait starts: one arriving
			// just before waits up to Block, but no wait returns at once
			// for good.
			r.log.Debug("reading the group's last delivered ID", "stream", st, "err", err)
			s.last[i] = "$"
			continue
		}
		for _, g := range gs {
			if g.Name == r.cfg.Group {
				s.last[i] = g.LastDeliveredID
			}
		}
	}
}

// consume reads and submits entries until ctx ends or the lease is found
// lost (errNotHolder). Each read (fenced by the lease) returns this
// consumer's own pending entries after the cursors if there are any, else
// new ones (">"): so entries delivered to this consumer by a read whose
// reply was lost are submitted before any later one.
func (s *session) consume(ctx context.Context) error {
	r := s.r
	keys := append([]string{r.cfg.LeaseKey}, r.cfg.Streams...)
	var retry backoff.BackOff
	woke := false
	for ctx.Err() == nil {
		args := make([]any, 0, 4+s.n)
		args = append(args, s.holder, r.cfg.Group, r.cfg.Consumer, strconv.Itoa(r.cfg.Count))
		for _, c := range s.cursor {
			args = append(args, c)
		}
		xs, err := runScript(ctx, r.cfg.Client, readScript, redis.NewXStreamSliceCmd, keys, args...).Result()
		if errors.Is(err, redis.Nil) {
			err = nil
		}
		if err != nil {
			err = fenceErr("XREADGROUP", err)
			switch {
			case ctx.Err() != nil:
				return nil
			case errors.Is(err, errNotHolder):
				r.log.Warn("the consumer lease is held by another session: stopping", "err", err)
				return err
			case redis.HasErrorPrefix(err, "NOGROUP"):
				return err // a new session creates the group again
			}
			if retry == nil {
				retry = r.cfg.Backoff()
			}
			if !r.health.Problem("read: "+err.Error(), err, "reading the streams failed; retrying") {
				r.log.Debug("reading the streams failed again; retrying", "err", err)
			}
			if !consume.Sleep(ctx, retry.NextBackOff()) {
				return nil
			}
			continue
		}
		if retry != nil {
			r.health.OK("reading the streams again")
		}
		retry = nil
		got, err := s.submit(ctx, xs)
		if err != nil {
			return nil // ctx ended or the pool stopped
		}
		if got > 0 {
			woke = false
			continue
		}
		if woke {
			// Woken by an entry the group had delivered already: the
			// known last delivered IDs were behind.
			s.refresh(ctx)
		}
		woke = s.wait(ctx)
	}
	return nil
}

// submit hands the entries of a read to the pool, in order per stream; it
// returns how many it handled.
func (s *session) submit(ctx context.Context, xs []redis.XStream) (int, error) {
	r := s.r
	got := 0
	for _, x := range xs {
		i, ok := s.index[x.Stream]
		if !ok {
			continue
		}
		for _, m := range x.Messages {
			if err := ctx.Err(); err != nil {
				return got, err // read after the session ended: left pending
			}
			got++
			if idLess(s.last[i], m.ID) {
				s.last[i] = m.ID
			}
			if m.Values == nil {
				// Pending but deleted (trimmed, XDEL) before it was
				// handled.
				r.deleted.Add(1)
				r.log.Error("a pending entry was deleted from the stream before its outcome was stored: lost", "stream", x.Stream, "entry", m.ID)
				s.cursor[i] = m.ID
				s.acks <- ackReq{i, m.ID}
				continue
			}
			claimed := s.claimedTo[i] != "" && !idLess(s.claimedTo[i], m.ID)
			d := &consume.Delivery{Msg: Message(x.Stream, m), Ref: &entry{stream: x.Stream, msg: m, claimed: claimed},
				Where: []any{"stream", x.Stream, "entry", m.ID}}
			req := ackReq{i, m.ID}
			d.Ack = func() { s.acks <- req }
			if r.cfg.ContextFor != nil {
				d.Ctx = r.cfg.ContextFor(r.runCtx, x.Stream, m)
			}
			if err := s.pool.Submit(ctx, d); err != nil {
				return got, err
			}
			s.cursor[i] = m.ID
		}
	}
	return got, nil
}

// wait blocks until an entry newer than last arrives on a stream, Block
// passes or ctx ends (the read in progress finishes first); true if an
// entry arrived.
func (s *session) wait(ctx context.Context) bool {
	r := s.r
	streams := make([]string, 0, 2*s.n)
	streams = append(streams, r.cfg.Streams...)
	streams = append(streams, s.last...)
	xs, err := r.cfg.Client.XRead(ctx, &redis.XReadArgs{Streams: streams, Count: 1, Block: r.cfg.Block}).Result()
	if err != nil {
		if !errors.Is(err, redis.Nil) && ctx.Err() == nil {
			r.log.Warn("waiting for entries failed", "err", err)
			consume.Sleep(ctx, r.cfg.Block)
		}
		return false
	}
	return len(xs) > 0
}

// acker sends the XACKs the workers queue, several per command, until the
// queue is closed and drained.
func (s *session) acker() {
	r := s.r
	for req := range s.acks {
		batch := make([][]string, s.n)
		batch[req.stream] = append(batch[req.stream], req.id)
	more:
		for range 1023 {
			select {
			case q, ok := <-s.acks:
				if !ok {
					break more
				}
				batch[q.stream] = append(batch[q.stream], q.id)
			default:
				break more
			}
		}
		ctx, cancel := context.WithTimeout(r.runCtx, 10*time.Second)
		_, err := r.cfg.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, ids := range batch {
				if len(ids) > 0 {
					p.XAck(ctx, r.cfg.Streams[i], r.cfg.Group, ids...)
				}
			}
			return nil
		})
		cancel()
		if err != nil {
			r.log.Warn("XACK failed: the entries stay pending and come again, the inbox recognises them", "err", err)
		}
	}
}

// idLess reports whether entry ID a is below b ("ms-seq", compared as the
// two numbers; a missing seq is 0; "" is below everything).
func idLess(a, b string) bool {
	am, as := splitID(a)
	bm, bs := splitID(b)
	if am != bm {
		return am < bm
	}
	return as < bs
}

func splitID(id string) (uint64, uint64) {
	ms, seq, _ := strings.Cut(id, "-")
	m, _ := strconv.ParseUint(ms, 10, 64)
	q, _ := strconv.ParseUint(seq, 10, 64)
	return m, q
}

// Message converts a stream entry to the inbox's message: ID from the
// outbox-message-id field, AggregateType and AggregateID from
// outbox-aggregate-type and outbox-aggregate-id (the fields the relay
// publisher writes, emit.Header*), Headers every field but PayloadField,
// Payload the PayloadField's value, Topic the stream
// (inbox.MessageFromHeaders, with Topic set).
//
// An entry that did not come from the outbox relay may lack the fields:
// then the ID is "<stream>/<entry ID>" (a redelivery of the same entry is
// recognised; the same event added twice is not) and the aggregate type
// the stream, so such entries are held per stream. An entry the inbox
// cannot store (a field that is not UTF-8, too long) is refused by the
// inbox (inbox.ErrInvalidMessage) and passed over by the runner.
func Message(stream string, x redis.XMessage) inbox.Message {
	h := make(map[string]string, len(x.Values))
	var payload []byte
	for k, v := range x.Values {
		s, ok := v.(string)
		if !ok {
			s = fmt.Sprint(v)
		}
		if k == PayloadField {
			payload = []byte(s)
			continue
		}
		h[k] = s
	}
	if m, err := inbox.MessageFromHeaders(h, payload); err == nil {
		m.Topic = stream
		return m
	}
	m := inbox.Message{ID: h[emit.HeaderMessageID], AggregateType: h[emit.HeaderAggregateType],
		AggregateID: h[emit.HeaderAggregateID], Topic: stream, Headers: h, Payload: payload}
	if m.ID == "" {
		m.ID = stream + "/" + x.ID
	}
	if m.AggregateType == "" {
		m.AggregateType = stream
	}
	return m
}

// observer reports the engine's results to the Config's Observer.
type observer struct{ o Observer }

func (o observer) Processed(d *consume.Delivery, res consume.Result) {
	e := d.Ref.(*entry)
	o.o.Processed(Result{Stream: e.stream, ID: e.msg.ID, Outcome: res.Outcome, Parked: res.Parked,
		Invalid: res.Invalid, Attempts: res.Attempts, Duration: res.Duration, Claimed: e.claimed})
}

func (o observer) AttemptFailed(d *consume.Delivery, attempt int, err error) {
	e := d.Ref.(*entry)
	o.o.AttemptFailed(e.stream, e.msg.ID, attempt, err)
}

// The runner's scripts. Each checks first that the lease holds this
// session's value, and fails with a NOTHOLDER error reply otherwise: a
// command of a holder that lost the lease (paused, cut off, slow) cannot
// take an entry once another holder may be consuming.
var (
	// fenceScript runs ARGV[2..] as a command. KEYS: the lease, then the
	// command's keys.
	fenceScript = newScript(`if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('NOTHOLDER the consumer lease is not held by this session')
end
return redis.call(unpack(ARGV, 2))`)

	// readScript returns this consumer's pending entries after the
	// cursors if there are any, else reads new ones (">"). KEYS: the
	// lease, the streams; ARGV: holder, group, consumer, count, one cursor
	// per stream.
	readScript = newScript(`if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('NOTHOLDER the consumer lease is not held by this session')
end
local head = {'XREADGROUP', 'GROUP', ARGV[2], ARGV[3], 'COUNT', ARGV[4], 'STREAMS'}
for i = 2, #KEYS do head[#head + 1] = KEYS[i] end
local own = {}
for i, v in ipairs(head) do own[i] = v end
for i = 5, #ARGV do own[#own + 1] = ARGV[i] end
local r = redis.call(unpack(own))
if r then
  for _, s in ipairs(r) do
    if #s[2] > 0 then return r end
  end
end
for i = 2, #KEYS do head[#head + 1] = '>' end
return redis.call(unpack(head))`)

	// tidyScript deletes a consumer of the group that has no pending
	// entry. KEYS: the lease, the stream; ARGV: holder, group, consumer.
	tidyScript = newScript(`if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return redis.error_reply('NOTHOLDER the consumer lease is not held by this session')
end
if #redis.call('XPENDING', KEYS[2], ARGV[2], '-', '+', 1, ARGV[3]) > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', KEYS[2], ARGV[2], ARGV[3])
return 1`)

	// renewScript extends the lease if it holds ARGV[1]: PEXPIRE ARGV[2].
	renewScript = newScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0`)

	// releaseScript deletes the lease if it holds ARGV[1].
	releaseScript = newScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0`)
)

type script struct{ src, sha string }

func newScript(src string) script { return script{src: src, sha: redis.NewScript(src).Hash()} }

// runScript runs s with EVALSHA (EVAL if the server does not have it
// cached), its reply read by the command mk makes: the script's reply has
// the shape of the command it runs.
func runScript[C redis.Cmder](ctx context.Context, c redis.UniversalClient, s script, mk func(context.Context, ...any) C,
	keys []string, args ...any) C {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, "evalsha", s.sha, strconv.Itoa(len(keys)))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	cmd := mk(ctx, a...)
	_ = c.Process(ctx, cmd)
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		a[0], a[1] = "eval", s.src
		cmd = mk(ctx, a...)
		_ = c.Process(ctx, cmd)
	}
	return cmd
}

// fenceErr wraps a script's error: errNotHolder for NOTHOLDER.
func fenceErr(what string, err error) error {
	if redis.HasErrorPrefix(err, notHolder) {
		return fmt.Errorf("%w (%s)", errNotHolder, what)
	}
	return fmt.Errorf("inboxredis: %s: %w", what, err)
}

// lease is the group's consumer lease (consume.Lease): a key whose value
// is the holder's random ID, a new one at every Acquire, so that the
// commands of an earlier session of this runner are fenced out too.
type lease struct {
	client redis.UniversalClient
	key    string
	ttl    time.Duration

	mu     sync.Mutex
	holder string // the ID of the last acquisition
	tried  string // the ID of the last attempt that did not acquire ("" none)
}

var _ consume.Lease = (*lease)(nil)

func (l *lease) current() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.holder
}

// Acquire sets the key to a new holder ID if it does not exist (SET NX PX
// ttl). If the key holds the ID of this lease's previous attempt, which
// set it but whose reply was lost (a timeout), it takes the lease with
// that ID by renewing it (no session used it).
func (l *lease) Acquire(ctx context.Context) (bool, error) {
	id := randomHex(16)
	l.mu.Lock()
	prev := l.tried
	l.tried = id
	l.mu.Unlock()
	ok, err := l.client.SetNX(ctx, l.key, id, l.ttl).Result()
	if err != nil {
		return false, fmt.Errorf("inboxredis: SET %s NX: %w", l.key, err)
	}
	if !ok && prev != "" {
		n, err := runScript(ctx, l.client, renewScript, redis.NewIntCmd, []string{l.key}, prev,
			strconv.FormatInt(l.ttl.Milliseconds(), 10)).Result()
		if err != nil {
			return false, fmt.Errorf("inboxredis: renewing the lease %s: %w", l.key, err)
		}
		id, ok = prev, n == 1
	}
	if ok {
		l.mu.Lock()
		l.holder, l.tried = id, ""
		l.mu.Unlock()
	}
	return ok, nil
}

// Renew extends the key's expiry to ttl if it still holds this holder's
// ID.
func (l *lease) Renew(ctx context.Context) (bool, error) {
	n, err := runScript(ctx, l.client, renewScript, redis.NewIntCmd, []string{l.key}, l.current(),
		strconv.FormatInt(l.ttl.Milliseconds(), 10)).Result()
	if err != nil {
		return false, fmt.Errorf("inboxredis: renewing the lease %s: %w", l.key, err)
	}
	return n == 1, nil
}

// Release deletes the key if it holds this holder's ID.
func (l *lease) Release(ctx context.Context) error {
	if err := runScript(ctx, l.client, releaseScript, redis.NewIntCmd, []string{l.key}, l.current()).Err(); err != nil {
		return fmt.Errorf("inboxredis: releasing the lease %s: %w", l.key, err)
	}
	return nil
}
