package relay

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/failpoint"
)

// Defaults, from the seed article unless noted.
const (
	// DefaultPollInterval is the fallback poll (seed: 1 s). The post-commit
	// wake-up carries latency; the poll finds rows written by other
	// processes and retries that came due.
	DefaultPollInterval = time.Second
	// DefaultMinPollInterval is the shortest adaptive poll wait.
	DefaultMinPollInterval = 10 * time.Millisecond
	// DefaultBatchSize is the most rows claimed and published per cycle.
	// The seed uses 100; larger batches amortize the claim and mark-sent
	// round trips (measured in BENCHMARKS.md).
	DefaultBatchSize = 500
	// DefaultMaxBatchFactor sets the default MaxBatchSize: 4 x BatchSize
	// (2,000 rows by default). Measured on a 1,000,000-row drain
	// (BENCHMARKS.md): each claim walks the pending index from its start,
	// including the entries of rows marked sent since the last VACUUM, so
	// fewer, larger claims under a backlog raise the drain rate.
	DefaultMaxBatchFactor = 4
	// DefaultMaxBatchBytes caps a grown batch's payload and header bytes
	// (16 MiB): a batch grows past BatchSize only while the previous
	// batch's average message size times the new size fits.
	DefaultMaxBatchBytes = 16 << 20
	// DefaultMaxAttempts is the first attempt plus the seed's 5 retries.
	DefaultMaxAttempts = 6
	// DefaultRetryInitial is the delay after the first failed attempt; it
	// doubles per attempt (seed: 1 s x 2^attempt = 2, 4, 8, 16, 32 s).
	DefaultRetryInitial = 2 * time.Second
	// DefaultRetryMax caps one retry delay.
	DefaultRetryMax = 5 * time.Minute
	// DefaultRetryJitter is the randomization factor of retry delays: a
	// delay d becomes uniform in [d(1-j), d(1+j)] (cenkalti/backoff).
	DefaultRetryJitter = 0.2
	// DefaultPublishTimeout bounds one Publish call (seed: send timeout 3 s,
	// per message; here per batch).
	DefaultPublishTimeout = 10 * time.Second
	// DefaultQueryTimeout bounds each relay SQL statement.
	DefaultQueryTimeout = 10 * time.Second
	// DefaultPartitionCheckInterval is how often a running relay counts
	// the pending rows in partitions no relay can own (a query that reads
	// every pending row once, like a stats scrape). The stored count and
	// the lease table are compared at every lease heartbeat.
	DefaultPartitionCheckInterval = 30 * time.Second
)

// Errors returned by New, Run and Ready.
var (
	// ErrInvalidConfig: New, NewRetention, NewDeadLetters, Repartition or
	// ListenPostgres got a nil Outbox or database, or an out-of-range
	// setting.
	ErrInvalidConfig = errors.New("outbox: invalid relay config")
	// ErrStopped: Run was called a second time.
	ErrStopped = errors.New("outbox: relay already ran")
	// ErrNotRunning: Ready before Run started relaying or after it returned.
	ErrNotRunning = errors.New("outbox: relay is not running")
)

// Config configures a Relay. Zero fields take the defaults above.
type Config struct {
	// Publisher sends batches to the broker. Required.
	Publisher Publisher
	// Wakeup tells the relay a transaction with events has committed.
	// Default: the post-commit signal of the Outbox given to New
	// (driver.Outbox.Wakeup, subscribed when Run starts), which fires for
	// commits through that Outbox in this process; a relay in another
	// process relies on the poll, Notify and ListenPostgres.
	Wakeup <-chan struct{}
	// PollInterval is the fallback poll. Default DefaultPollInterval.
	PollInterval time.Duration
	// MinPollInterval makes the poll adaptive, for relays that no wake-up
	// reaches (another process than the writers on MySQL/MariaDB or
	// SQLite): after a cycle that found work the next poll comes after
	// MinPollInterval, and each empty one doubles the wait up to
	// PollInterval, so an idle relay still costs one query per PollInterval.
	// Default DefaultMinPollInterval; set it equal to PollInterval for a
	// fixed poll.
	MinPollInterval time.Duration
	// BatchSize is the most messages per cycle when there is no backlog,
	// and the size every backlog starts from. Default DefaultBatchSize.
	BatchSize int
	// MaxBatchSize is the most messages per cycle under a backlog: after a
	// cycle that claimed a full batch, the next claim asks for twice as
	// many, up to MaxBatchSize and MaxBatchBytes; after a short, empty or
	// failed cycle it asks for BatchSize again. Default
	// DefaultMaxBatchFactor x BatchSize; set it equal to BatchSize for a
	// fixed batch. It must be at least BatchSize. A relay killed at the
	// worst moment re-sends at most two batches, so up to 2 x MaxBatchSize
	// duplicates.
	MaxBatchSize int
	// MaxBatchBytes bounds batch growth by size: a batch grows past
	// BatchSize only while the previous batch's average payload plus
	// headers size times the new size is at most MaxBatchBytes. It never
	// shrinks a batch below BatchSize. Default DefaultMaxBatchBytes.
	MaxBatchBytes int
	// MaxAttempts is how many times a message is tried before it is
	// dead-lettered (status failed). Default DefaultMaxAttempts.
	MaxAttempts int
	// RetryInitial, RetryMax and RetryJitter shape per-message retry
	// delays: RetryInitial x 2^(attempt-1), capped at RetryMax, jittered.
	RetryInitial time.Duration
	RetryMax     time.Duration
	RetryJitter  float64
	// PublishTimeout bounds one Publish call. Default DefaultPublishTimeout.
	PublishTimeout time.Duration
	// QueryTimeout bounds each SQL statement. Default DefaultQueryTimeout.
	QueryTimeout time.Duration
	// OnDeadLetter, if set, is called (synchronously; keep it short) after a
	// message was marked failed: the seed's alert hook.
	OnDeadLetter func(Message, error)
	// DeadLetterPolicy: HoldAggregate (default, strict order) or SkipDead.
	DeadLetterPolicy DeadLetterPolicy
	// OnUnavailable, if set, is called (synchronously; keep it short) when
	// a publish fails with ErrUnavailable (authorization, unknown topic,
	// TLS/SASL): the relay then counts no attempt and backs off as a whole.
	OnUnavailable func(error)
	// DeadLetterUnroutableAfter, if positive, dead-letters (as a permanent
	// error: at once, no further attempts; held per DeadLetterPolicy) a
	// message whose route has failed with ErrUnavailable for at least this
	// long, once the broker acknowledged a message of another route after
	// the route's first failure: a mistyped Topic, a subject no stream
	// binds, an exchange nobody declared. The route is the message's
	// Topic, or its aggregate type and event type when Topic is "". The
	// clock runs in this relay's memory from the first failure it saw and
	// starts again when the relay restarts or the route acknowledges a
	// message. The broker must have acknowledged a message of another
	// route after the route's first failure and within the last
	// DeadLetterUnroutableAfter: a refusal of every route (authorization
	// revoked, the broker misconfigured as a whole, an outage) that lasts
	// that long dead-letters nothing. Default 0: off, and such an event stays pending until
	// an operator dead-letters or skips it (DeadLetters.DeadLetterPending,
	// outbox pending dead). Negative is ErrInvalidConfig.
	DeadLetterUnroutableAfter time.Duration
	// Logger receives structured logs. Default slog.Default().
	Logger *slog.Logger
	// PartitionCheckInterval is how often the running relay looks for
	// pending rows in partitions no relay can own (see
	// ErrPartitionMismatch). Default DefaultPartitionCheckInterval.
	PartitionCheckInterval time.Duration
	// HealthInterval is how often the running relay pings the database
	// and, if Publisher implements HealthChecker, checks the broker.
	// Default DefaultHealthInterval.
	HealthInterval time.Duration
	// UnhealthyAfter is the readiness grace period: Ready fails (and an
	// Observer that is a ReadinessObserver hears of it) once the database
	// pings, the broker checks or the relay's cycles have failed without
	// a success in between for longer than this, and at once when the
	// failure wraps ErrUnavailable (a missing topic, stream or exchange,
	// refused authorization: waiting does not fix those). Default
	// DefaultUnhealthyAfter. Readiness returns with the first success of
	// the failing source (a probe, every HealthInterval, or a cycle).
	UnhealthyAfter time.Duration
	// StallTimeout is how long one cycle may run before Live reports the
	// loop stuck. Default DefaultStallTimeout, or 2 x PublishTimeout + 6 x
	// QueryTimeout if that is longer; it must exceed PublishTimeout.
	StallTimeout time.Duration
	// ProgressInterval is how often a relay that has work logs a progress
	// line at INFO ("relay progress": published since the last line, the
	// time spent claiming and publishing them ("publishing") and the rate
	// over that time, backlog, oldest pending age); an idle relay logs
	// nothing. Default
	// DefaultProgressInterval; negative disables the line.
	ProgressInterval time.Duration
	// LeaseTTL is how long a partition lease lasts without renewal, by the
	// database clock. Default DefaultLeaseTTL (10 s); at least MinLeaseTTL.
	// A crashed instance's partitions are taken over within LeaseTTL plus
	// one LeaseHeartbeat.
	LeaseTTL time.Duration
	// LeaseHeartbeat is how often leases are renewed and rebalanced.
	// Default LeaseTTL/4; at most LeaseTTL/2.
	LeaseHeartbeat time.Duration
	// InstanceID names this relay in the lease table (at most 128 bytes).
	// Default hostname-pid-random.
	InstanceID string
	// DeleteOnPublish deletes rows once the broker acknowledged them,
	// instead of marking them sent: no history to retain, at the price of
	// no record of what was sent (stats show no sent rows). New refuses it
	// (ErrInvalidConfig) with a Reconciler publisher (the exactly-once
	// mode) and a log-only Outbox (driver.Config.LogOnly): that mode tells
	// an event read again from the WAL by its row.
	DeleteOnPublish bool
	// Observer receives the relay's events, for metrics. Default none. If
	// it also implements PublishObserver, each Publish call is wrapped by
	// its StartPublish (tracing spans); if PartitionObserver, it hears
	// about partition mismatches.
	Observer Observer
	// Source is where the relay learns of committed events: SourceTable
	// (default) or SourceWAL (PostgreSQL only; WAL configures it; see
	// docs/wal.md). New returns ErrInvalidConfig for SourceWAL on another
	// dialect or without WAL.DSN.
	Source Source
	// WAL configures SourceWAL; ignored otherwise.
	WAL WALConfig
	// Clock is the host clock the relay's backoff computations read
	// (cenkalti/backoff's Clock). Default the system clock. No decision
	// about due retries compares host time with the database: due times are
	// computed and compared in SQL by the database's clock; Clock exists so
	// tests can skew the host clock and show nothing changes. The one
	// host-time decision is DeadLetterUnroutableAfter's, which measures how
	// long a route has been refused on this clock.
	Clock backoff.Clock

	tableName string // set by New before withDefaults: the default publication's name
}

func (c Config) withDefaults() Config {
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.MinPollInterval == 0 {
		c.MinPollInterval = min(DefaultMinPollInterval, c.PollInterval)
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.MaxBatchSize == 0 {
		c.MaxBatchSize = DefaultMaxBatchFactor * c.BatchSize
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.RetryInitial == 0 {
		c.RetryInitial = DefaultRetryInitial
	}
	if c.RetryMax == 0 {
		c.RetryMax = DefaultRetryMax
	}
	if c.RetryJitter == 0 {
		c.RetryJitter = DefaultRetryJitter
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.QueryTimeout == 0 {
		c.QueryTimeout = DefaultQueryTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = backoff.SystemClock
	}
	if c.PartitionCheckInterval == 0 {
		c.PartitionCheckInterval = DefaultPartitionCheckInterval
	}
	if c.Observer == nil {
		c.Observer = NopObserver{}
	}
	if c.HealthInterval == 0 {
		c.HealthInterval = DefaultHealthInterval
	}
	if c.UnhealthyAfter == 0 {
		c.UnhealthyAfter = DefaultUnhealthyAfter
	}
	if c.StallTimeout == 0 {
		c.StallTimeout = max(DefaultStallTimeout, 2*c.PublishTimeout+6*c.QueryTimeout)
	}
	if c.ProgressInterval == 0 {
		c.ProgressInterval = DefaultProgressInterval
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.LeaseHeartbeat == 0 {
		c.LeaseHeartbeat = c.LeaseTTL / 4
	}
	if c.InstanceID == "" {
		c.InstanceID = newInstanceID()
	}
	if c.Source == SourceWAL {
		if c.WAL.Publication == "" {
			c.WAL.Publication = PublicationName(c.tableName)
		}
		if c.WAL.Buffer == 0 {
			c.WAL.Buffer = 4 * c.MaxBatchSize
		}
		if c.WAL.StatusInterval == 0 {
			c.WAL.StatusInterval = time.Second
		}
		if c.WAL.SpillAfter == 0 {
			c.WAL.SpillAfter = DefaultWALSpillAfter
		}
		if c.WAL.ReceiveTimeout == 0 {
			c.WAL.ReceiveTimeout = DefaultWALReceiveTimeout
		}
	}
	return c
}

// Relay moves committed outbox rows to a Publisher. Create it with New,
// start it with Run, stop it by cancelling Run's context or with Stop.
type Relay struct {
	ob  *driver.Outbox
	db  *sql.DB
	cfg Config
	d   *dialect.Dialect
	log *slog.Logger
	// table is ob's table, as configured.
	table string
	// loopsStarted, if set (tests only, before Run), is called by Run once
	// its background loops (leases, partition check, health, progress)
	// have started, before the first cycle.
	loopsStarted func()

	notify   chan struct{}
	stopping chan struct{}
	stopOnce sync.Once
	done     chan struct{}
	started  chan struct{}
	runOnce  sync.Once

	mu   sync.Mutex
	hard context.CancelFunc // cancels in-flight work on a hard stop

	marking *markJob // owned by the Run goroutine
	// ahead is the batch claimed while the previous one was published
	// (lookahead.go), or nil; owned by the Run goroutine.
	ahead       *aheadBatch
	noLookahead bool         // tests: claim only after the publish (lookahead.go)
	aheadHook   func(int)    // tests: called with the rows of each claim ahead, on its goroutine
	claimedHook func()       // tests: called before each look of the MySQL claim (claimLate)
	lateRows    atomic.Int64 // rows the MySQL claims' late-rows statements added (claimLate)
	// tests: slotCheckHook runs before each check of a slot the WAL
	// source created (its error stands for the decoder's), and
	// unreadableAfter replaces the constant of that name (walslot.go).
	slotCheckHook   func(slot string) error
	unreadableAfter time.Duration
	recreateHook    func(slot string) // tests: called before the reader reads a slot it decided to recreate
	slotCreateSlow  time.Duration     // tests: replaces the constant of that name (wal.go)
	// wal is the WAL source's reader (Config.Source SourceWAL), set by
	// Run; tableDue and walEpoch are owned by the Run goroutine
	// (walclaim.go).
	wal            *walReader
	tableDue       bool
	onStream       atomic.Bool // the WAL source vouches for its stream (tableDue false): tests, and Ready's detail
	walEpoch       int64
	walLeases      map[int]int64 // the partitions (lease epochs) the last claim that caught up covered
	lastTableClaim time.Time
	// walPublished and walClaimed count the rows the WAL source's cycles
	// published from the stream and claimed from the table (tests, and
	// the progress line).
	walPublished, walClaimed atomic.Int64
	walSpilled               atomic.Int64 // log-only events written to the table (tests)
	// walChecked counts the rows the WAL source asked the database about
	// (wal_accept), walKnownSent those it left out unasked because this
	// relay had published them (being marked sent, or marked; tests).
	walChecked, walKnownSent atomic.Int64
	// walLoss is the log-only mode's recorded, unacknowledged loss window
	// (walstate.go), or nil.
	walLoss atomic.Pointer[WALLoss]
	// walDown is the log-only mode's current outage of its stream (the
	// reader reports it; nil while it streams or stands by), for Ready.
	walDown atomic.Pointer[walOutage]
	// logTaken is set by walClaim when it took events of logical decoding
	// messages (log-only mode), and logDone by the cycle once each of them
	// is published or written to the table: the cycle's end then settles
	// the slot's position, or rewinds the stream if they were not.
	logTaken, logDone bool
	logWarned         bool // the WARN about writers in log-only mode and a relay not
	// tableHeld lists the aggregates (of log-only events) whose event was
	// refused on its route (ErrUnavailable: no attempt, so no retry time
	// that log_held would see) and waits in the table: the stream's later
	// events of them go to the table behind it, while the other
	// aggregates keep flowing from the stream. The fallback poll retries
	// it. Cleared by a table claim that came back short and was published
	// without error (everything claimable was sent or now has a retry
	// time). keepStream is set by a cycle whose only failures are such
	// refusals (per message, or a table claim refused as a whole while the
	// broker acknowledged other events within two PollIntervals): the
	// loop stays on the stream instead of claiming the table at once.
	// All are owned by the Run goroutine.
	tableHeld  map[aggregateKey]bool
	keepStream bool
	claimedAll bool      // this cycle's table claim came back short (next)
	fromTable  bool      // this cycle's batch was claimed from the table (next)
	lastAcked  time.Time // the last cycle the broker acknowledged a message in
	// unroutable carries Config.DeadLetterUnroutableAfter (unroutable.go).
	unroutable *unroutable
	// pipe is rec if it is a Pipeliner: then the exactly-once mode marks
	// one batch sent while it publishes the next.
	pipe Pipeliner
	// claimConn is the connection the loop claims on (PostgreSQL,
	// claimconn.go); owned by the Run goroutine.
	claimConn   *sql.Conn
	claimStmt   *sql.Stmt // the claim prepared on claimConn
	claimNoPrep bool      // preparing it failed: run it unprepared
	walStmt     *sql.Stmt // wal_accept prepared on claimConn (or the pool: walclaim.go)
	walNoPrep   bool      // preparing it failed: run it unprepared
	// rec is cfg.Publisher if it is a Reconciler (reconcile.go), and
	// recon which partitions it reconciled; recon is owned by the Run
	// goroutine.
	rec    Reconciler
	recon  reconcileState
	floor  claimFloor // owned by the Run goroutine (PostgreSQL)
	batch  int        // the next claim's size; owned by the Run goroutine
	leases *leases    // set by Run

	cycleLog, unavailLog *repeatLog // the loop's failure lines, one per distinct cause

	running atomic.Bool // between start-up and the end of Run
	watch   partitionWatch

	sent sentRanges // ids this relay marked sent, for the MySQL claim (sentids.go)

	health    health        // readiness, liveness and progress (health.go)
	recovered chan struct{} // the database or broker answered again after failing
}

// New returns a relay of ob's table (ob is the writers' Outbox, or, in a
// process that only has a DSN, one built with driver.New from the dialect
// and table) over db, the outbox table's database. The relay runs
// at most two statements at a time (marking one batch sent while claiming
// the next), so it holds at most two of db's connections, plus one for a
// moment every HealthInterval to ping the database; give it its own
// small pool (db.SetMaxOpenConns(2)) so it can never starve business
// queries, nor be starved by them. On SQLite, which has one writer at a
// time, share the application's *sql.DB opened with SetMaxOpenConns(1). db need not be opened through
// the outbox driver. The relay partition count is not configured here: Run
// reads the count stored in the table (driver.Outbox.PartitionCount). New
// does not touch the database; it returns ErrInvalidConfig (wrapped) for a
// nil ob or db, a missing Publisher or an out-of-range setting.
//
// Any number of relays, in any processes, may run on one table: they share
// its relay partitions through leases (see the package documentation).
func New(ob *driver.Outbox, db *sql.DB, cfg Config) (*Relay, error) {
	if ob == nil || db == nil || cfg.Publisher == nil {
		return nil, fmt.Errorf("%w: a *driver.Outbox, a *sql.DB and a Publisher are required", ErrInvalidConfig)
	}
	cfg.tableName = ob.Config().Table
	cfg = cfg.withDefaults()
	if cfg.PollInterval < 0 || cfg.MinPollInterval < 0 || cfg.MinPollInterval > cfg.PollInterval || cfg.BatchSize < 1 || cfg.MaxBatchSize < cfg.BatchSize || cfg.MaxBatchBytes < 1 || cfg.MaxAttempts < 1 || cfg.RetryInitial < 0 ||
		cfg.RetryMax < cfg.RetryInitial || cfg.RetryJitter < 0 || cfg.RetryJitter >= 1 ||
		cfg.PublishTimeout < 0 || cfg.QueryTimeout < 0 || cfg.DeadLetterPolicy < HoldAggregate || cfg.DeadLetterPolicy > SkipDead || cfg.DeadLetterUnroutableAfter < 0 {
		return nil, fmt.Errorf("%w: out-of-range setting in %+v", ErrInvalidConfig, cfg)
	}
	if cfg.PartitionCheckInterval < 0 {
		return nil, fmt.Errorf("%w: PartitionCheckInterval %v is negative", ErrInvalidConfig, cfg.PartitionCheckInterval)
	}
	if cfg.HealthInterval < 0 || cfg.UnhealthyAfter < 0 || cfg.StallTimeout <= cfg.PublishTimeout {
		return nil, fmt.Errorf("%w: HealthInterval %s and UnhealthyAfter %s must be positive, StallTimeout %s must exceed PublishTimeout %s",
			ErrInvalidConfig, cfg.HealthInterval, cfg.UnhealthyAfter, cfg.StallTimeout, cfg.PublishTimeout)
	}
	if cfg.LeaseTTL < MinLeaseTTL || cfg.LeaseHeartbeat <= 0 || cfg.LeaseHeartbeat > cfg.LeaseTTL/2 || len(cfg.InstanceID) > 128 {
		return nil, fmt.Errorf("%w: LeaseTTL %v (min %v), LeaseHeartbeat %v (max LeaseTTL/2), InstanceID of %d bytes (max 128)",
			ErrInvalidConfig, cfg.LeaseTTL, MinLeaseTTL, cfg.LeaseHeartbeat, len(cfg.InstanceID))
	}
	d, err := dialectOf(ob)
	if err != nil {
		return nil, err
	}
	table := ob.Config().Table
	if err := checkSource(cfg, d); err != nil {
		return nil, err
	}
	rec := reconcilerOf(cfg.Publisher)
	if ob.Config().LogOnly && rec != nil && cfg.DeleteOnPublish {
		// The exactly-once mode with log-only writers recognises an event
		// read again from the stream by its row (walLogRows).
		return nil, fmt.Errorf("%w: DeleteOnPublish with the exactly-once mode (a Reconciler publisher) and the log-only mode (driver.Config.LogOnly): an event read again after a restart would be published twice", ErrInvalidConfig)
	}
	pipe, _ := rec.(Pipeliner)
	log := cfg.Logger.With("component", "outbox.relay", "table", table)
	return &Relay{
		ob: ob, db: db, cfg: cfg, d: d, batch: cfg.BatchSize, table: table, rec: rec, pipe: pipe,
		log:        log,
		unroutable: newUnroutable(cfg.DeadLetterUnroutableAfter, cfg.Clock.Now),
		cycleLog:   newRepeatLog(log, slog.LevelWarn, "relay cycle failed; backing off"),
		unavailLog: newRepeatLog(log, slog.LevelError, "the broker refuses the route (misconfigured, not authorized, or full); backing off without counting attempts"),
		notify:     make(chan struct{}, 1),
		recovered:  make(chan struct{}, 1),
		stopping:   make(chan struct{}),
		done:       make(chan struct{}),
		started:    make(chan struct{}),
	}, nil
}

// InstanceID returns the name this relay holds leases and its heartbeat
// row under: Config.InstanceID, or the one New generated.
func (r *Relay) InstanceID() string { return r.cfg.InstanceID }

// Notify wakes the relay for an immediate cycle; calls coalesce. Safe for
// concurrent use and cheap enough to call after every commit.
func (r *Relay) Notify() {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// Run checks the server version, the schema and the stored relay
// partition count, then relays until ctx is cancelled or Stop is called.
// Either way it stops claiming, lets the in-flight batch finish (Publish is
// bounded by PublishTimeout), records its outcomes, and returns nil; what
// was not published stays pending. It returns an error wrapping
// driver.ErrUnsupportedServer, driver.ErrSchemaMissing,
// driver.ErrSchemaOutdated, driver.ErrSchemaTooNew, ErrPartitionMismatch
// or ErrModeMismatch (a live relay of the table runs in another delivery
// mode) if the table cannot be relayed from with this configuration (at start,
// without retrying), and ErrStopped if Run was already called. Every error
// that ends Run is also logged (level ERROR) before Run returns, so a
// relay started with "go r.Run(ctx)" does not fail silently; still, check
// the error. Database errors during the run are logged and retried with
// backoff; they do not end Run. A partition mismatch that appears while
// running does not end Run either: it is logged, reported to an Observer
// that implements PartitionObserver, and returned by Ready, while the
// partitions the relay owns go on being relayed.
func (r *Relay) Run(ctx context.Context) (err error) {
	first := false
	r.runOnce.Do(func() { first = true })
	if !first {
		r.log.Error("relay not started: Run was already called", "error", ErrStopped)
		return ErrStopped
	}
	defer close(r.done)
	defer func() {
		if err != nil {
			r.log.Error("relay stopped with an error; nothing is published by it", "error", err)
		}
	}()
	hardCtx, hardCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer hardCancel()
	r.mu.Lock()
	r.hard = hardCancel
	r.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
			r.beginStop()
		case <-r.done:
		}
	}()

	if err := r.checkSchema(hardCtx); err != nil {
		return err
	}
	parts, err := r.readPartitions(hardCtx)
	if err != nil || parts == 0 { // 0: stopped while retrying
		return err
	}
	// The claim's own connection, its session prepared before the relay
	// takes partitions (claimconn.go); a failure here is retried by the
	// first claim.
	defer r.dropClaimSession()
	if _, err := r.claimSession(hardCtx); err != nil {
		r.log.Warn("preparing the claim connection failed; the first claim retries", "error", err)
	}
	r.openPool(hardCtx)
	r.leases = &leases{r: r, id: r.cfg.InstanceID, partitions: parts, ttl: r.cfg.LeaseTTL, beat: r.cfg.LeaseHeartbeat, mode: modeOf(r.rec),
		owned: map[int]int64{}, toRelease: map[int]bool{}, changed: make(chan struct{}, 1), kick: make(chan struct{}, 1)}
	defer r.leases.register(r.ob)()
	if err := r.startLeases(hardCtx); err != nil {
		return err
	}
	// Running before the health loop starts: its first probe must not
	// report ErrNotRunning (a spurious "relay not ready" at every start,
	// and outbox_relay_up 0 for a moment). Cleared after the loops below
	// have stopped (defers run last registered first).
	r.running.Store(true)
	defer r.running.Store(false)
	beatCtx, stopBeat := context.WithCancel(hardCtx)
	beatDone := make(chan struct{})
	go func() { defer close(beatDone); r.leases.run(beatCtx) }()
	checkDone := make(chan struct{})
	go func() { defer close(checkDone); r.checkPartitions(beatCtx, parts) }()
	healthDone := make(chan struct{})
	go func() { defer close(healthDone); r.runHealth(beatCtx) }()
	progressDone := make(chan struct{})
	go func() { defer close(progressDone); r.runProgress(beatCtx) }()
	if r.loopsStarted != nil {
		r.loopsStarted() // tests only: the background loops are running
	}
	defer func() {
		stopBeat()
		<-beatDone
		<-checkDone
		<-healthDone
		<-progressDone
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.QueryTimeout)
		defer cancel()
		r.leases.leave(lctx)
	}()
	close(r.started)
	r.cfg.Observer.Up(true)
	defer func() {
		// After Up(false), no readiness report (health.go).
		r.health.reportMu.Lock()
		r.health.down = true
		r.cfg.Observer.Up(false)
		r.health.reportMu.Unlock()
	}()
	r.log.Info("relay started", "dialect", r.ob.Config().Dialect, "instance", r.cfg.InstanceID, "poll_interval", r.cfg.PollInterval.String(),
		"batch_size", r.cfg.BatchSize, "max_batch_size", r.cfg.MaxBatchSize, "partitions", parts, "lease_ttl", r.cfg.LeaseTTL.String())

	wakeup := r.cfg.Wakeup
	if wakeup == nil {
		wakeup = r.ob.Wakeup() // subscribed here, not in New: a New that is never run subscribes nothing
	}
	walSignal, stopWAL := r.startWAL(hardCtx)
	defer stopWAL()
	bo := r.loopBackoff()
	poll := time.NewTimer(r.cfg.PollInterval)
	defer poll.Stop()
	idle := r.cfg.MinPollInterval // adaptive poll wait
	for {
		select {
		case <-r.stopping:
			r.ahead = nil // claimed, not published: its rows stay pending
			r.finishMark()
			r.log.Info("relay stopped")
			return nil
		default:
		}
		limit := r.batch
		n, err := r.runCycle(hardCtx)
		var wait time.Duration
		switch {
		case err != nil:
			r.ahead = nil // claimed before the failure was recorded
			r.batch = r.cfg.BatchSize
			if !r.keepStream {
				r.claimTable("cycle failed") // what failed is pending in the table (no-op without the WAL source)
			}
			wait = bo.NextBackOff()
			if !errors.Is(err, ErrUnavailable) { // logged at ERROR by unavailable
				r.cycleLog.failed(err, "retry_in", wait.String())
			}
		case n == limit || r.ahead != nil:
			bo.Reset()
			idle = r.cfg.MinPollInterval
			continue // more may be waiting
		case n > 0:
			bo.Reset()
			idle = r.cfg.MinPollInterval
			wait = idle
		default:
			bo.Reset()
			wait = idle
			idle = min(idle*2, r.cfg.PollInterval)
		}
		if err == nil {
			r.cycleLog.ok()
			r.unavailLog.ok()
			if r.claimedAll && len(r.tableHeld) > 0 {
				clear(r.tableHeld)
			}
		}
		if !poll.Stop() {
			select {
			case <-poll.C:
			default:
			}
		}
		poll.Reset(wait)
		if err != nil {
			// After a failure wait out the backoff even if woken, except
			// to stop: a broker or database outage must not spin.
			select {
			case <-r.stopping:
			case <-poll.C:
			case <-r.recovered: // retry at once after an outage ended
				bo.Reset()
			}
			continue
		}
		select {
		case <-r.stopping:
		case <-poll.C:
			r.pollDue() // the fallback poll: retries that came due, rows no stream carries
		case <-r.notify:
		case <-wakeup:
		case <-walSignal: // rows read from the WAL (nil without the WAL source)
		case <-r.leases.changed: // partitions acquired (they may hold a backlog), or trusted again
			r.claimTable("partitions acquired") // (no-op without the WAL source)
		}
	}
}

// startLeases creates the lease rows, joins the relay group and takes a
// first share, retrying transient database errors until stopped; a
// partition count that disagrees with the table (ErrPartitionMismatch) or
// a live relay in another delivery mode (ErrModeMismatch) is returned at
// once.
func (r *Relay) startLeases(ctx context.Context) error {
	bo := r.loopBackoff()
	for {
		err := r.leases.start(ctx)
		if err == nil {
			err = r.leases.join(ctx)
		}
		if err == nil {
			err = r.leases.heartbeat(ctx)
		}
		if err == nil && r.leases.isShort() {
			// Joined a group whose relays own the partitions this one
			// needs: they give its share up at their next heartbeat,
			// which this wakes now (peers.go).
			r.leases.announce(ctx)
		}
		if err == nil || errors.Is(err, ErrPartitionMismatch) || errors.Is(err, ErrModeMismatch) {
			if errors.Is(err, ErrPartitionMismatch) {
				r.watch.set(r, err)
			}
			return err
		}
		wait := bo.NextBackOff()
		r.log.Warn("relay cannot set up partition leases; retrying", "error", err, "retry_in", wait.String())
		select {
		case <-r.stopping:
			return nil
		case <-time.After(wait):
		}
	}
}

// checkSchema retries transient failures (database unreachable) until the
// relay is stopped, and returns at once on a verdict (unsupported server,
// schema missing).
func (r *Relay) checkSchema(ctx context.Context) error {
	bo := r.loopBackoff()
	for {
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		err := r.d.Check(qctx, r.db)
		cancel()
		if err == nil {
			return nil
		}
		if errors.Is(err, dialect.ErrUnsupportedServer) || errors.Is(err, dialect.ErrSchemaMissing) ||
			errors.Is(err, dialect.ErrSchemaOutdated) || errors.Is(err, dialect.ErrSchemaTooNew) {
			return err
		}
		wait := bo.NextBackOff()
		r.log.Warn("relay cannot reach the database; retrying", "error", err, "retry_in", wait.String())
		select {
		case <-r.stopping:
			return nil
		case <-time.After(wait):
		}
	}
}

func (r *Relay) loopBackoff() backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.Clock = r.cfg.Clock
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 30 * time.Second
	b.MaxElapsedTime = 0
	b.Reset()
	return b
}

// Stop stops the relay gracefully: no new claims; the in-flight batch may
// finish and record its outcomes. If ctx ends first, in-flight work is
// cancelled (its rows stay pending and are re-sent later, as duplicates at
// worst) and Stop returns ctx.Err() once Run has returned. Stop before Run
// makes Run return at once. Stop is safe to call twice.
func (r *Relay) Stop(ctx context.Context) error {
	r.beginStop()
	r.mu.Lock()
	hard := r.hard
	r.mu.Unlock()
	if hard == nil {
		return nil // Run not called: nothing to wait for
	}
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
		hard()
		<-r.done
		return ctx.Err()
	}
}

func (r *Relay) beginStop() { r.stopOnce.Do(func() { close(r.stopping) }) }

// cycle claims one batch, publishes it and records the outcomes. It
// returns the number of rows claimed.
func (r *Relay) cycle(ctx context.Context) (int, error) {
	defer r.endLogCycle()
	r.keepStream, r.claimedAll, r.fromTable = false, false, false
	set, release := r.leases.snapshot()
	if len(release) > 0 {
		r.ahead = nil // it may hold rows of the partitions given up
		// Give up excess partitions only once this instance's work on
		// them is recorded, so the next owner starts where it stopped.
		r.finishMark()
		r.leases.release(ctx, release)
	}
	if len(set.epochs) == 0 || !time.Now().Before(set.trustedUntil) {
		return 0, nil // nothing owned, or ownership not renewed in time
	}
	if r.rec != nil {
		var err error
		if set, err = r.reconcile(ctx, set); err != nil {
			return 0, err
		}
		if len(set.epochs) == 0 {
			return 0, nil
		}
	}
	claimStart := time.Now()
	msgs, limit, claimTook := r.adoptAhead(set)
	if msgs == nil {
		limit = r.batch
		var err error
		msgs, err = r.next(ctx, set)
		if err != nil || len(msgs) == 0 {
			return 0, err
		}
		claimTook = time.Since(claimStart)
	}
	r.cfg.Observer.Claimed(len(msgs), claimTook)
	failpoint.Inject(failpoint.AfterClaim)
	// Publish only within the trust window: a paused or partitioned
	// instance must not publish for partitions it may have lost.
	budget := min(r.cfg.PublishTimeout, time.Until(set.trustedUntil))
	if budget <= 0 {
		// The batch is dropped unpublished, its rows pending in the table.
		// With the WAL source the stream has moved past them (or, in the
		// exactly-once log-only mode, they were written to the table just
		// now): the table is claimed next, before the stream's later
		// events of their aggregates; and this cycle's claim, unpublished,
		// releases no refused route (claimedAll).
		r.claimedAll = false
		r.claimTable("the leases' trust window passed before publishing")
		return 0, nil
	}
	pctx, cancel := context.WithTimeout(ctx, budget)
	if r.pipe != nil {
		// The batch still being marked sent is published: its rows go in
		// this publish's manifests too, until their mark is confirmed.
		r.pipe.Carry(r.marking.byPartition())
	}
	// A full batch: more is likely pending. Claim the next batch while
	// this one is published (lookahead.go); it is used only if this one
	// is acknowledged as a whole.
	ahead := r.readAhead(ctx, set, msgs, limit)
	var perr error
	if po, ok := r.cfg.Observer.(PublishObserver); ok {
		sctx, end := po.StartPublish(pctx, msgs)
		if sctx == nil { // a broken observer must not break publishing
			sctx = pctx
		}
		perr = r.cfg.Publisher.Publish(sctx, msgs)
		if end != nil {
			end(perr)
		}
	} else {
		perr = r.cfg.Publisher.Publish(pctx, msgs)
	}
	cancel()
	r.ahead = ahead.wait(perr == nil)
	if r.rec != nil {
		r.observeTransactions(msgs, perr)
	}
	failpoint.Inject(failpoint.AfterPublish)
	// The previous batch's mark-sent ran while this batch was claimed and
	// published; it must finish before this batch's outcomes are written.
	r.finishMark()
	took := time.Since(claimStart)
	if perr == nil {
		r.logDone = true // every event of a logical decoding message is published
		r.lastAcked = time.Now()
		for i := range msgs {
			r.cfg.Observer.Published(msgs[i], took)
		}
		r.unroutable.acked(msgs)
		r.health.published.Add(int64(len(msgs)))
		r.health.busy.Add(int64(took))
		if r.rec != nil && r.pipe == nil {
			// A Reconciler's broker keeps only the last publish's record per
			// partition: unless it carries the batch before (a Pipeliner),
			// this batch is marked before the next one is claimed, and a
			// failed mark-sent is reconciled.
			if err := r.markSent(ctx, msgs); err != nil {
				r.unreconcile(msgs)
				return len(msgs), fmt.Errorf("%w (their relay partitions are reconciled before the next claim: no message is sent twice)", err)
			}
			return len(msgs), nil
		}
		// Pipelining: mark this batch sent while the next one is claimed
		// and published. Its rows are still pending in the table until
		// then, so claim skips them (r.marking); in the exactly-once mode
		// the next publish's manifests list them too (Pipeliner).
		r.startMark(ctx, msgs)
		return len(msgs), nil
	}
	var pe PublishErrors
	whole := !errors.As(perr, &pe) || len(pe) != len(msgs)
	if err := r.spillFailed(ctx, set, msgs, pe, whole); err != nil {
		return len(msgs), err
	}
	if whole {
		// The batch failed as a whole (broker unreachable, timeout,
		// misconfiguration): no attempt is counted; the loop backs off and
		// re-sends.
		r.unavailable(perr)
		if errors.Is(perr, ErrOutcomeUnknown) {
			r.unreconcile(msgs)
		}
		dead, err := r.deadLetterUnroutable(ctx, msgs, perr)
		if err != nil {
			return len(msgs), err
		}
		class := ClassBatch
		if errors.Is(perr, ErrUnavailable) {
			class = ClassUnavailable
		}
		for i := range msgs {
			if !dead[i] { // a dead letter's failure was reported as permanent
				r.cfg.Observer.Failed(msgs[i], class, perr)
			}
		}
		if class == ClassUnavailable && !errors.Is(perr, ErrOutcomeUnknown) && r.fromTable && r.wal != nil && r.wal.logPrefix != "" &&
			time.Since(r.lastAcked) < 2*r.cfg.PollInterval {
			// Log-only mode: a table claim refused as a whole while the
			// broker acknowledged other events lately (from the stream) is
			// a refused route, not an outage (a publisher that sends each
			// message alone fails a batch as a whole when every route in
			// it is refused: relay.PublishInOrder): hold its aggregates
			// and stay on the stream, as for per-message refusals below.
			r.holdRefused(msgs)
		}
		return len(msgs), fmt.Errorf("publishing %d messages: %w", len(msgs), perr)
	}
	// Per-message outcomes. The first failure of an aggregate counts an
	// attempt and schedules its retry; the claim then holds the aggregate's
	// later rows back until it succeeds. Later failures of the same
	// aggregate in this batch count nothing: they stay pending.
	// An entry wrapping a *BatchError was not sent, or its outcome is
	// unknown, for a reason of the batch as a whole (deadline, connection
	// lost): it is not the message's fault, so it counts no attempt and
	// stays pending, and the loop backs off as after a failed batch.
	sent := make([]Message, 0, len(msgs))
	acked := make([]Message, 0, len(msgs))
	for i := range msgs {
		if pe[i] == nil {
			acked = append(acked, msgs[i])
		}
	}
	r.unroutable.acked(acked) // before the failures: an acknowledgement in this batch counts for them
	if len(acked) > 0 {
		r.lastAcked = time.Now()
	}
	var failed []int
	var unavailable, batchErr error
	var refusedMsgs []Message // each aggregate's first message failed with ErrUnavailable
	held := map[aggregateKey]bool{}
	for i := range msgs {
		k := aggregateKey{msgs[i].AggregateType, msgs[i].AggregateID}
		switch {
		case pe[i] == nil:
			r.cfg.Observer.Published(msgs[i], took)
			if held[k] {
				r.orderViolation(msgs[i])
			}
			sent = append(sent, msgs[i])
		case !held[k]:
			held[k] = true
			if errors.Is(pe[i], ErrOutcomeUnknown) {
				r.unreconcile(msgs[i : i+1])
				batchErr = pe[i]
				r.cfg.Observer.Failed(msgs[i], ClassBatch, pe[i])
				continue
			}
			if errors.Is(pe[i], ErrAborted) {
				r.cfg.Observer.Failed(msgs[i], ClassBatch, pe[i]) // no attempt, no hold: sent again next cycle
				// From the table: with the WAL source the stream would
				// not bring it again, and a later event of its aggregate
				// must not go out before it.
				r.claimTable("a message aborted")
				continue
			}
			if be := (*BatchError)(nil); errors.As(pe[i], &be) {
				batchErr = pe[i]
				r.cfg.Observer.Failed(msgs[i], ClassBatch, pe[i])
				continue
			}
			if errors.Is(pe[i], ErrUnavailable) {
				if dead := r.unroutable.failed(msgs[i], pe[i]); dead != nil {
					pe[i] = dead // DeadLetterUnroutableAfter: dead-lettered below
					failed = append(failed, i)
					continue
				}
				unavailable = pe[i] // not the message's fault: no attempt
				refusedMsgs = append(refusedMsgs, msgs[i])
				r.cfg.Observer.Failed(msgs[i], ClassUnavailable, pe[i])
				continue
			}
			failed = append(failed, i)
		}
	}
	r.health.published.Add(int64(len(sent)))
	r.health.busy.Add(int64(took))
	if err := r.markSent(ctx, sent); err != nil {
		if r.rec != nil {
			r.unreconcile(sent)
		}
		return len(msgs), err
	}
	for _, i := range failed {
		if err := r.markFailed(ctx, msgs[i], pe[i]); err != nil {
			return len(msgs), err
		}
	}
	if unavailable != nil {
		r.unavailable(unavailable)
		if batchErr == nil && r.wal != nil && r.wal.logPrefix != "" {
			// Log-only mode: what was refused is in the table now
			// (spillFailed); its aggregates wait there, the others go on
			// from the stream (see tableHeld).
			r.holdRefused(refusedMsgs)
		}
		return len(msgs), fmt.Errorf("publishing: %w", unavailable)
	}
	if batchErr != nil {
		return len(msgs), fmt.Errorf("publishing: %d of %d messages acknowledged, the rest not sent or unresolved: %w", len(sent), len(msgs), batchErr)
	}
	return len(msgs), nil
}

// holdRefused puts the aggregates of msgs, refused on their routes and
// waiting in the table, in r.tableHeld, and keeps the loop on the stream
// (r.keepStream) after the failed cycle.
func (r *Relay) holdRefused(msgs []Message) {
	if r.tableHeld == nil {
		r.tableHeld = map[aggregateKey]bool{}
	}
	for i := range msgs {
		r.tableHeld[aggregateKey{msgs[i].AggregateType, msgs[i].AggregateID}] = true
	}
	r.keepStream = true
}

// spillFailed writes to the table the events of logical decoding messages
// (log-only mode) in msgs that were not acknowledged (every one if the
// batch failed as a whole), in batch order, and gives them their IDs: from
// there the cycle's outcome handling retries, holds and dead-letters them
// as rows. It then marks the cycle's log events done (r.logDone). Without
// such events it does nothing.
func (r *Relay) spillFailed(ctx context.Context, set leaseSet, msgs []Message, pe PublishErrors, whole bool) error {
	if !r.logTaken {
		return nil
	}
	var idx []int
	for i := range msgs {
		if msgs[i].log && msgs[i].ID == 0 && (whole || pe[i] != nil) {
			idx = append(idx, i)
		}
	}
	if len(idx) > 0 {
		if err := r.spill(ctx, set, msgs, idx); err != nil {
			return err
		}
		r.walSpilled.Add(int64(len(idx)))
	}
	r.logDone = true
	return nil
}

// deadLetterUnroutable applies Config.DeadLetterUnroutableAfter to a
// batch that failed as a whole with perr: if perr wraps ErrUnavailable
// (every message failed on its route, or was held back behind its
// aggregate's failed one), each aggregate's first message whose route has
// been unavailable for long enough is dead-lettered; the rest stay
// pending, without an attempt. It returns the indexes dead-lettered.
func (r *Relay) deadLetterUnroutable(ctx context.Context, msgs []Message, perr error) (map[int]bool, error) {
	if r.unroutable.after <= 0 || !errors.Is(perr, ErrUnavailable) {
		return nil, nil
	}
	done := map[int]bool{}
	first := map[aggregateKey]bool{}
	for i := range msgs {
		k := aggregateKey{msgs[i].AggregateType, msgs[i].AggregateID}
		if first[k] {
			continue
		}
		first[k] = true
		if dead := r.unroutable.failed(msgs[i], perr); dead != nil {
			if err := r.markFailed(ctx, msgs[i], dead); err != nil {
				return done, err
			}
			done[i] = true
		}
	}
	return done, nil
}

// orderViolation reports m, acknowledged by the publisher although an
// earlier message of its aggregate in the same batch failed (see
// OrderObserver).
func (r *Relay) orderViolation(m Message) {
	r.log.Error("publisher acknowledged a message after an earlier one of its aggregate failed; first delivery order may be broken",
		"message_id", m.MessageID, "outbox_id", m.ID, "aggregate_type", m.AggregateType, "aggregate_id", m.AggregateID)
	if oo, ok := r.cfg.Observer.(OrderObserver); ok {
		oo.OrderViolation(m)
	}
}

// unavailable alerts on a configuration-wide publish error.
func (r *Relay) unavailable(err error) {
	if !errors.Is(err, ErrUnavailable) {
		return
	}
	r.unavailLog.failed(err)
	if r.cfg.OnUnavailable != nil {
		r.cfg.OnUnavailable(err)
	}
}

type aggregateKey struct{ typ, id string }

// markJob is an asynchronous mark-sent of one acknowledged batch.
type markJob struct {
	ids   []int64 // in claim order
	parts []int   // ids[i]'s relay partition
	done  chan error
}

// byPartition returns the job's ids by relay partition, ascending, or nil
// for a nil job (no mark-sent running).
func (j *markJob) byPartition() map[int][]int64 {
	if j == nil {
		return nil
	}
	out := map[int][]int64{}
	for i, id := range j.ids {
		out[j.parts[i]] = append(out[j.parts[i]], id)
	}
	for _, ids := range out {
		slices.Sort(ids)
	}
	return out
}

// startMark marks msgs sent in the background; at most one job runs, and
// only the relay's loop goroutine touches r.marking.
func (r *Relay) startMark(ctx context.Context, msgs []Message) {
	j := &markJob{ids: make([]int64, 0, len(msgs)), parts: make([]int, 0, len(msgs)), done: make(chan error, 1)}
	for i := range msgs {
		if msgs[i].ID != 0 { // 0: an event of a logical decoding message, in no table
			j.ids, j.parts = append(j.ids, msgs[i].ID), append(j.parts, msgs[i].Partition)
		}
	}
	r.marking = j
	go func() { j.done <- r.markSent(ctx, msgs) }()
}

// finishMark waits for the running mark-sent job, if any. If it failed,
// its messages are pending in the table although the broker has them:
// at least once they are sent again; in the exactly-once mode their relay
// partitions are reconciled before the next claim (the broker's
// manifests list them), so they are marked, not sent again.
func (r *Relay) finishMark() {
	j := r.marking
	err := r.waitMark()
	if err == nil {
		return
	}
	if r.rec == nil {
		r.log.Warn("marking a published batch sent failed; its messages will be sent again (the same message IDs)", "error", err)
		return
	}
	for _, p := range j.parts {
		delete(r.recon.done, p)
	}
	r.log.Warn("marking a published batch sent failed; its relay partitions are reconciled before the next claim (no message is sent twice)", "error", err)
}

// waitMark waits for the running mark-sent job, if any, and returns its error.
func (r *Relay) waitMark() error {
	if r.marking == nil {
		return nil
	}
	err := <-r.marking.done
	r.marking = nil
	return err
}

// claim reads the next batch. Rows of a batch still being marked sent are
// pending in the table but already published: the query leaves them out
// by id (it used to ask for that many more rows and drop them here, which
// read and transferred every such row twice).
func (r *Relay) claim(ctx context.Context, set leaseSet) ([]Message, error) {
	return r.claimSkipping(ctx, set, nil)
}

// claimSkipping is claim that also leaves out the ids in publishing (the
// batch being published while this claim reads ahead: lookahead.go).
func (r *Relay) claimSkipping(ctx context.Context, set leaseSet, publishing []int64) ([]Message, error) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	var skip []int64
	if r.marking != nil {
		skip = r.marking.ids
	}
	if len(publishing) > 0 {
		skip = append(slices.Clip(skip), publishing...)
	}
	parts := make([]int, 0, len(set.epochs))
	for p := range set.epochs {
		parts = append(parts, p)
	}
	sort.Ints(parts)
	var rows *sql.Rows
	var err error
	floored := r.d.HasClaimFloor()
	if floored {
		r.floor.cover(set.epochs)
		check, want := r.floor.args(time.Now())
		var qr interface {
			QueryContext(context.Context, string, ...any) (*sql.Rows, error)
		} = r.db
		conn, cerr := r.claimSession(qctx)
		if cerr != nil {
			return nil, fmt.Errorf("claiming from %s: %w", r.table, cerr)
		}
		if conn != nil {
			qr = conn
		}
		if st := r.claimStatement(qctx); st != nil {
			rows, err = st.QueryContext(qctx, r.floor.floor, r.floor.epoch, r.batch,
				dialect.IDArray(skip), dialect.IntArray(parts), check, want)
		} else {
			rows, err = qr.QueryContext(qctx, r.d.ClaimFloor(), r.floor.floor, r.floor.epoch, r.batch,
				dialect.IDArray(skip), dialect.IntArray(parts), check, want)
		}
		if err != nil {
			r.dropClaimSession() // it may be broken: the next claim takes another
		}
	} else {
		q, args := r.d.ClaimBatch(r.batch, parts, skip, r.sent.ranges())
		rows, err = r.db.QueryContext(qctx, q, args...)
	}
	if err != nil {
		return nil, fmt.Errorf("claiming from %s: %w", r.table, err)
	}
	msgs, bytes, rep, reported, err := r.readClaimed(rows, floored, set)
	if err != nil {
		if floored {
			r.dropClaimSession()
		}
		return nil, err
	}
	if floored {
		if !reported {
			return nil, fmt.Errorf("claiming from %s: the claim function returned no floor report", r.table)
		}
		r.floor.update(rep, time.Now())
		r.batch = nextBatch(r.cfg, r.batch, len(msgs), bytes)
		return msgs, nil
	}
	// The batch grows after a full claim, by the claim's own rows (a short
	// claim that late rows filled is still short), and is bounded by the
	// average size of the rows handed out.
	claimed := len(msgs)
	if claimed > 0 {
		var lateN, lateBytes int
		if msgs, lateN, lateBytes, err = r.claimLate(ctx, set, parts, skip, msgs); err != nil {
			return nil, err
		}
		bytes = (bytes + lateBytes) * claimed / (claimed + lateN)
	}
	r.batch = nextBatch(r.cfg, r.batch, claimed, bytes)
	return msgs, nil
}

// claimLate runs the MySQL/MariaDB claim's second look (Dialect.ClaimLate;
// relay/doc.go, "Late rows") after a claim of up to r.batch rows that
// returned msgs (in id order), and returns msgs with the pending rows
// below their highest id that the claim did not see merged in, in id
// order, at most r.batch of them. It looks again until a look finds
// nothing: a look's own read view can miss an earlier row of an aggregate
// whose later row it shows, exactly as the claim's could, and the next
// look, made after it, shows that row. The looks end: only rows below the
// batch's highest id count, and ids are handed out in insert order, so
// each look can only find rows that were inserted before that row was.
// The merged batch is cut at r.batch rows, its highest ids left for the
// next claim: every pending row below the cut is in it (a look that
// returned r.batch rows, as many as it may, fills the batch below its own
// last row, and rows above that stay out, since an earlier row of their
// aggregate may be among those it could not return). Each look has a
// QueryTimeout of its own.
//
// It also returns how many rows the looks read and their payload and
// header bytes (for the batch size), cut or not.
func (r *Relay) claimLate(ctx context.Context, set leaseSet, parts []int, skip []int64, msgs []Message) (_ []Message, n, bytes int, _ error) {
	if r.d.Name() != dialect.MySQL { // no late rows to look for (Dialect.ClaimLate)
		return msgs, 0, 0, nil
	}
	for {
		if r.claimedHook != nil {
			r.claimedHook()
		}
		top := msgs[len(msgs)-1].ID
		leave := make([]int64, 0, len(skip)+len(msgs))
		leave = append(leave, skip...)
		for _, m := range msgs {
			leave = append(leave, m.ID)
		}
		late, b, err := r.lookLate(ctx, r.d.ClaimLate(r.batch, parts, leave, r.sent.ranges(), top), set)
		if err != nil {
			return nil, 0, 0, err
		}
		if len(late) == 0 {
			return msgs, n, bytes, nil
		}
		n, bytes = n+len(late), bytes+b
		r.lateRows.Add(int64(len(late)))
		merged := make([]Message, 0, len(msgs)+len(late))
		i, j := 0, 0
		for i < len(msgs) || j < len(late) {
			if j == len(late) || (i < len(msgs) && msgs[i].ID < late[j].ID) {
				merged = append(merged, msgs[i])
				i++
			} else {
				merged = append(merged, late[j])
				j++
			}
		}
		msgs = merged[:min(len(merged), max(r.batch, 1))]
	}
}

// lookLate runs one look of claimLate (q) under a QueryTimeout of its own.
// It returns the rows and their payload and header bytes.
func (r *Relay) lookLate(ctx context.Context, q string, set leaseSet) ([]Message, int, error) {
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	rows, err := r.db.QueryContext(qctx, q)
	if err != nil {
		return nil, 0, fmt.Errorf("claiming from %s (late rows): %w", r.table, err)
	}
	late, bytes, _, _, err := r.readClaimed(rows, false, set)
	return late, bytes, err
}

// readClaimed reads and closes the rows of a claim (floored: the
// PostgreSQL claim function's, with its floor report) and returns the
// messages, their payload and header bytes, and the floor report.
func (r *Relay) readClaimed(rows *sql.Rows, floored bool, set leaseSet) (msgs []Message, bytes int, rep floorReport, reported bool, _ error) {
	defer rows.Close()
	// msgs is not preallocated to r.batch: a quiet claim returns one or two rows.
	for rows.Next() {
		var m Message
		var headers string
		var ageMicros int64
		var err error
		if floored {
			var kind int16
			err = rows.Scan(&kind, &m.ID, &m.MessageID, &m.AggregateType, &m.AggregateID, &m.EventType,
				&m.Topic, &m.Partition, &m.ContentType, &m.Payload, &headers, &m.Attempts, &ageMicros,
				&rep.epoch, &rep.resolved, &rep.pendingMin, &rep.seqLast, &rep.xid)
			if err == nil && kind == 0 {
				reported = true
				continue
			}
		} else {
			err = rows.Scan(&m.ID, &m.MessageID, &m.AggregateType, &m.AggregateID, &m.EventType,
				&m.Topic, &m.Partition, &m.ContentType, &m.Payload, &headers, &m.Attempts, &ageMicros)
		}
		if err != nil {
			return nil, 0, rep, false, fmt.Errorf("reading claimed row: %w", err)
		}
		if m.Payload == nil {
			m.Payload = []byte{} // some drivers read an empty BLOB as nil
		}
		m.Epoch = set.epochs[m.Partition]
		m.Age = time.Duration(ageMicros) * time.Microsecond
		if headers != "" {
			if err := json.Unmarshal([]byte(headers), &m.Headers); err != nil {
				return nil, 0, rep, false, fmt.Errorf("decoding headers of row %d: %w", m.ID, err)
			}
		}
		bytes += len(m.Payload) + len(headers)
		msgs = append(msgs, m)
	}
	if err := rows.Err(); err != nil {
		return nil, 0, rep, false, fmt.Errorf("claiming from %s: %w", r.table, err)
	}
	return msgs, bytes, rep, reported, nil
}

// nextBatch is the claim size after a claim of limit rows returned n rows
// of bytes payload and header bytes: doubled after a full claim, capped by
// MaxBatchSize and by MaxBatchBytes at the claim's average message size,
// never below BatchSize; BatchSize after a short claim.
func nextBatch(cfg Config, limit, n, bytes int) int {
	if n < limit || n == 0 {
		return cfg.BatchSize
	}
	next := min(2*limit, cfg.MaxBatchSize)
	if avg := bytes / n; avg > 0 {
		next = min(next, cfg.MaxBatchBytes/avg)
	}
	return max(next, cfg.BatchSize)
}

// markSent records acknowledged messages. It runs even while the relay is
// being stopped: an outcome the broker already acknowledged is worth
// recording (otherwise the message is re-sent as a duplicate).
func (r *Relay) markSent(ctx context.Context, msgs []Message) error {
	ids := make([]int64, 0, len(msgs))
	var retried []int64
	for i := range msgs {
		if msgs[i].ID == 0 {
			continue // an event of a logical decoding message: in no table
		}
		ids = append(ids, msgs[i].ID)
		if msgs[i].Attempts > 0 {
			retried = append(retried, msgs[i].ID)
		}
	}
	return r.markSentIDs(ctx, ids, retried)
}

// markSentIDs is markSent by outbox id. retried lists those of ids whose
// messages had failed before (their rows carry a retry time, cleared by an
// UPDATE; the others only leave the pending set). Ids of rows already
// sent, or not in a partition this relay owns, are left as they are.
func (r *Relay) markSentIDs(ctx context.Context, ids, retried []int64) error {
	if len(ids) == 0 {
		return nil
	}
	if r.cfg.DeleteOnPublish {
		return r.markIDs(ctx, ids, "delete_sent", r.d.DeleteSent)
	}
	done := int64(0)
	rest := ids
	if len(retried) > 0 {
		// The rest go through mark_sent: an id no longer in the pending set
		// would cost MySQL/MariaDB a gap lock there under REPEATABLE READ.
		again := make(map[int64]bool, len(retried))
		for _, id := range retried {
			again[id] = true
		}
		rest = make([]int64, 0, len(ids)-len(retried))
		for _, id := range ids {
			if !again[id] {
				rest = append(rest, id)
			}
		}
		// First: their UPDATE removes them from the pending set as well,
		// so a crash between the two statements leaves nothing half done.
		_, markRetried := r.marks()
		for _, c := range dialect.Chunks(len(retried), r.d.MaxIDs("mark_sent_retried")) {
			q, args := markRetried(retried[c[0]:c[1]], r.cfg.InstanceID)
			qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
			res, err := r.db.ExecContext(qctx, q, args...)
			cancel()
			if err != nil {
				return fmt.Errorf("marking %d messages sent: %w", len(ids), err)
			}
			if n, err := res.RowsAffected(); err == nil {
				done += n
			}
		}
	}
	if len(rest) == 0 {
		if done == int64(len(ids)) {
			r.sent.add(ids)
		}
		return nil
	}
	mark, _ := r.marks()
	if err := r.markIDs(ctx, rest, "mark_sent", mark); err != nil {
		return err
	}
	if done == int64(len(retried)) && len(retried) > 0 {
		r.sent.add(retried)
	}
	return nil
}

// markReconciledIDs marks sent the ids a Reconciler returned, whose
// messages' attempts the relay does not know: the UPDATE of
// MarkRetriedSent takes those that had failed before, then the pending
// set's entries of the others go.
func (r *Relay) markReconciledIDs(ctx context.Context, ids []int64) error {
	if len(ids) == 0 || r.cfg.DeleteOnPublish {
		return r.markSentIDs(ctx, ids, nil)
	}
	mark, markRetried := r.marks()
	for _, c := range dialect.Chunks(len(ids), r.d.MaxIDs("mark_sent_retried")) {
		q, args := markRetried(ids[c[0]:c[1]], r.cfg.InstanceID)
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		_, err := r.db.ExecContext(qctx, q, args...)
		cancel()
		if err != nil {
			return fmt.Errorf("marking %d reconciled messages sent: %w", len(ids), err)
		}
	}
	return r.markIDs(ctx, ids, "mark_sent", mark)
}

// marks returns the mark-sent statements of the relay's mode: in the
// exactly-once mode (a Reconciler publisher) the durable ones, whose
// commit survives a database crash: a transaction's manifest lists the
// rows of the batch before it only until their mark is confirmed
// (Pipeliner), so a confirmed mark must not be lost. Otherwise a lost mark
// only re-sends its messages.
func (r *Relay) marks() (mark, markRetried func([]int64, string) (string, []any)) {
	if r.rec != nil {
		return r.d.MarkSentDurable, r.d.MarkRetriedSentDurable
	}
	return r.d.MarkSent, r.d.MarkRetriedSent
}

// markIDs runs the id-list statement mark (mark_sent or delete_sent, by
// name) over ids in chunks of the dialect's MaxIDs. Each statement
// touches only its ids' rows, by primary key (see queries.sql): it never
// waits on a row outside the batch, such as a writer's row whose COMMIT
// has not completed. A chunk whose every id is now sent is remembered for
// the MySQL claim (sentids.go).
func (r *Relay) markIDs(ctx context.Context, ids []int64, name string, mark func([]int64, string) (string, []any)) error {
	for _, c := range dialect.Chunks(len(ids), r.d.MaxIDs(name)) {
		q, args := mark(ids[c[0]:c[1]], r.cfg.InstanceID)
		qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
		res, err := r.db.ExecContext(qctx, q, args...)
		cancel()
		if err != nil {
			return fmt.Errorf("marking %d messages sent: %w", len(ids)-c[0], err)
		}
		if n, err := res.RowsAffected(); err == nil && n == int64(c[1]-c[0]) {
			r.sent.add(ids[c[0]:c[1]]) // every id of the chunk is sent now (sentids.go)
		}
	}
	return nil
}

// retryDelay returns the delay before attempt+1, for a message that has now
// failed attempt times (attempt >= 1), with jitter.
func (r *Relay) retryDelay(attempt int) time.Duration {
	b := backoff.NewExponentialBackOff()
	b.Clock = r.cfg.Clock
	b.InitialInterval = r.cfg.RetryInitial
	b.Multiplier = 2
	b.RandomizationFactor = r.cfg.RetryJitter
	b.MaxInterval = r.cfg.RetryMax
	b.MaxElapsedTime = 0
	b.Reset()
	d := b.NextBackOff()
	for i := 1; i < attempt; i++ {
		d = b.NextBackOff()
	}
	return d
}

func (r *Relay) markFailed(ctx context.Context, m Message, perr error) error {
	attempt := m.Attempts + 1
	qctx, cancel := context.WithTimeout(ctx, r.cfg.QueryTimeout)
	defer cancel()
	class := ClassTransient
	if errors.Is(perr, ErrPermanent) {
		class = ClassPermanent
	}
	r.cfg.Observer.Failed(m, class, perr)
	if attempt >= r.cfg.MaxAttempts || errors.Is(perr, ErrPermanent) {
		q := "mark_dead"
		if r.cfg.DeadLetterPolicy == SkipDead {
			q = "mark_dead_released"
		}
		if _, err := r.db.ExecContext(qctx, r.d.Fenced(q, true), errText(perr), m.ID, r.cfg.InstanceID); err != nil {
			return fmt.Errorf("dead-lettering message %s: %w", m.MessageID, err)
		}
		if r.cfg.DeadLetterPolicy == SkipDead {
			// Its aggregate is released: the rows it held go out next,
			// from the table, before later events of the aggregate from
			// the WAL source's stream.
			r.claimTable("a dead letter released its aggregate")
		}
		r.log.Error("message dead-lettered", "held", r.cfg.DeadLetterPolicy == HoldAggregate, "message_id", m.MessageID, "outbox_id", m.ID,
			"aggregate_type", m.AggregateType, "aggregate_id", m.AggregateID, "attempts", attempt, "error", perr)
		r.cfg.Observer.DeadLettered(m, perr)
		if r.cfg.OnDeadLetter != nil {
			r.cfg.OnDeadLetter(m, perr)
		}
		return nil
	}
	delay := r.retryDelay(attempt)
	if _, err := r.db.ExecContext(qctx, r.d.Fenced("mark_retry", true), delay.Microseconds(), errText(perr), m.ID, r.cfg.InstanceID); err != nil {
		return fmt.Errorf("scheduling retry of message %s: %w", m.MessageID, err)
	}
	r.cfg.Observer.Retried(m, attempt, delay)
	r.log.Warn("publish failed; will retry", "message_id", m.MessageID, "outbox_id", m.ID, "attempt", attempt, "retry_in", delay.String(), "error", perr)
	return nil
}
