package inboxkafka

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/consume"
	"github.com/sqloutbox/outbox/internal/failpoint"
)

// Failpoints of the runner, for the process-kill tests (see the root
// module's internal/failpoint: OUTBOX_FAILPOINTS=name=kill@N).
const (
	// fpAfterStore: a record's outcome is stored (its handler's transaction
	// committed, or it was recognised, held or parked), its offset not yet
	// committable.
	fpAfterStore = "inboxkafka/after-store"
	// fpBeforeCommit: offsets are about to be committed.
	fpBeforeCommit = "inboxkafka/before-commit"
)

// Defaults and minimums of Config.
const (
	// DefaultMaxAttempts is how many times a record's handler is tried
	// before the record is parked.
	DefaultMaxAttempts = consume.DefaultMaxAttempts
	// DefaultRetryInitial is the backoff before the second attempt; each
	// further one doubles, up to DefaultRetryMax, with ±20 % jitter.
	DefaultRetryInitial = consume.DefaultRetryInitial
	// DefaultRetryMax caps the backoff between attempts.
	DefaultRetryMax = consume.DefaultRetryMax
	// DefaultCommitInterval is how often finished offsets are committed.
	DefaultCommitInterval = 500 * time.Millisecond
	// MinCommitInterval is the shortest CommitInterval accepted.
	MinCommitInterval = time.Millisecond
	// DefaultMaxBufferedRecords is how many polled records a partition's
	// worker may have waiting before the partition is paused.
	DefaultMaxBufferedRecords = 1000
	// DefaultAttemptTimeout bounds one handler attempt (its context's
	// deadline), below franz-go's default rebalance timeout (60 s), since
	// a revocation waits for the handler in progress.
	DefaultAttemptTimeout = consume.DefaultAttemptTimeout
	// DefaultStopTimeout bounds the final offset commit at shutdown.
	DefaultStopTimeout = 10 * time.Second
	// DefaultBatchLinger is how long a partition's worker waits for more
	// records when BatchSize is set and fewer than BatchSize are waiting.
	DefaultBatchLinger = consume.DefaultBatchLinger
	// DefaultRequestInterval is how often the runner serves retry requests
	// (inbox.Inbox.ServeRequests: `outbox inbox parked skip` and `retry`).
	DefaultRequestInterval = consume.DefaultRequestInterval
)

// Errors.
var (
	// ErrInvalidConfig is returned (wrapped) by NewRunner for a missing or
	// out-of-range setting.
	ErrInvalidConfig = errors.New("inboxkafka: invalid config")
	// ErrPermanent marks a handler error that retrying cannot fix (a
	// malformed payload): a handler error wrapping it (errors.Is) parks the
	// record after the first attempt. It is inbox.ErrPermanent, shared by
	// every broker's runner.
	ErrPermanent = inbox.ErrPermanent
	// ErrHandlerPanic wraps the value of a recovered handler panic; it
	// counts as a handler error (retried, then parked). It is
	// inbox.ErrHandlerPanic: the inbox recovers the panic.
	ErrHandlerPanic = inbox.ErrHandlerPanic
	// ErrStarted is returned by Run when the runner already ran.
	ErrStarted = errors.New("inboxkafka: Run already called")
	// ErrTopicNotFound is wrapped by Run's error (with Config.FailFast)
	// and by Ready when a topic of Config.Topics does not exist on the
	// cluster; the error names the topics. It is inbox.ErrSourceMissing.
	ErrTopicNotFound = inbox.ErrSourceMissing
	// ErrNotReady is wrapped by Ready while the runner is not consuming
	// (inbox.ErrNotReady).
	ErrNotReady = inbox.ErrNotReady
)

// topicCheckInterval is how often a runner started with a missing topic
// looks for it again.
const topicCheckInterval = 5 * time.Second

// Handler applies one message to the consumer's database inside tx, the
// inbox's transaction (the dedupe row commits with it). It must not commit
// or roll back tx. An error rolls the transaction back and the record is
// retried, then parked. ctx carries the values of Run's context (and what
// Config.ContextFor adds) and the deadline Config.AttemptTimeout; it is
// not cancelled at shutdown or revocation: the runner waits for a handler
// in progress, so a handler must honour ctx (database/sql calls do).
type Handler func(ctx context.Context, tx *sql.Tx, msg inbox.Message) error

// FailurePolicy says what happens to a record whose handler failed every
// attempt (or failed with ErrPermanent): inbox.FailurePolicy, shared by
// every broker's runner.
type FailurePolicy = inbox.FailurePolicy

const (
	// ParkAndHold parks the record (inbox.Inbox.Park) and so holds its
	// aggregate: the aggregate's later records are stored as Held, not
	// applied, until the parked message is retried or skipped. The
	// default; it keeps the order of every aggregate.
	ParkAndHold = inbox.ParkAndHold
	// SkipAfterPark parks the record, for the record of it, and skips it
	// at once (inbox.Inbox.Skip), so its aggregate is not held and later
	// records are applied: order is given up for that message.
	SkipAfterPark = inbox.SkipAfterPark
)

// Config configures a Runner. Brokers, Group, Topics, Inbox, DB and
// Handler are required; every other field has a default.
type Config struct {
	// Brokers are the bootstrap addresses ("host:port").
	Brokers []string
	// Group is the Kafka consumer group ID. Members of one group share the
	// topics' partitions; give every runner of one application the same
	// Group (and the same inbox consumer name).
	Group string
	// Topics are consumed from their committed offsets, or from their
	// start for a group that has committed none. Run checks that they
	// exist (a metadata request): a missing one is one WARN naming it,
	// and Ready fails (ErrTopicNotFound) until it exists (looked for
	// every 5 s); see FailFast.
	Topics []string
	// FailFast makes Run return an error wrapping ErrTopicNotFound at
	// start, before joining the group, when a topic of Topics does not
	// exist, instead of waiting for it. Default false.
	FailFast bool
	// Inbox stores dedupe rows and parked messages.
	Inbox *inbox.Inbox
	// DB is the consumer's database, where Inbox's table and the
	// handler's business tables live. Size its pool for one connection per
	// assigned partition (each worker holds one during a handler).
	DB *sql.DB
	// Handler applies one message in the inbox's transaction.
	Handler Handler

	// MaxAttempts is how many times a handler is tried before the record
	// is parked (1: park on the first failure). Default DefaultMaxAttempts.
	MaxAttempts int
	// Backoff returns a fresh backoff for one record's retries; it is also
	// used, without an attempt limit, while the inbox itself fails (the
	// database unreachable). backoff.Stop means "the default cap". Default:
	// exponential from DefaultRetryInitial to DefaultRetryMax, ±20 %
	// jitter, no elapsed-time limit.
	Backoff func() backoff.BackOff
	// AttemptTimeout is the deadline of one handler attempt's context
	// (inbox.Handle's transaction included; with BatchSize, of a batch's
	// transaction); an attempt that runs out is a failed attempt
	// (retried, then parked), also when the handler ignores its context
	// and returns nil late (the commit is then refused). Keep it below the group's
	// rebalance timeout: a revocation waits for the attempt in progress.
	// Default DefaultAttemptTimeout; negative: no deadline.
	AttemptTimeout time.Duration
	// OnFailure is the policy for a record that failed every attempt.
	// Default ParkAndHold.
	OnFailure FailurePolicy
	// ContextFor derives a handler's context from the record, e.g. to
	// continue the trace whose context the relay put in the headers (see
	// the package documentation for outboxotel.Extract). The record
	// must not be modified. Default: ctx unchanged.
	ContextFor func(ctx context.Context, rec *kgo.Record) context.Context
	// Observer is told about every record's outcome and each partition's
	// lag (NewMetrics for Prometheus; give it to the Inbox too). Its
	// methods are called from the partition workers concurrently and must
	// not block. Default none.
	Observer Observer
	// Logger receives the runner's logs. Default slog.Default().
	Logger *slog.Logger
	// CommitInterval is how often the offsets of finished records are
	// committed (also at every revocation and at shutdown). A crash
	// redelivers up to about this much work, which the inbox dedupes.
	// Default DefaultCommitInterval; minimum MinCommitInterval.
	CommitInterval time.Duration
	// MaxBufferedRecords is how many polled records one partition may have
	// waiting for its worker before the partition is paused (it resumes at
	// half). Default DefaultMaxBufferedRecords.
	MaxBufferedRecords int
	// ReadUncommitted consumes at read_uncommitted. Default false: the
	// runner reads at read_committed, so a record of an aborted Kafka
	// transaction never reaches the handler, and a transaction's records
	// only once it committed: what the relay's exactly-once mode
	// (relay/kafka ExactlyOnce) needs end to end. With producers that use
	// no transactions (the relay's default mode) both levels read the same
	// records at the same time.
	ReadUncommitted bool
	// BatchSize, from 2 to inbox.MaxBatch (64), applies up to that many
	// records of a partition in one transaction (inbox.Inbox.HandleBatch:
	// one dedupe INSERT, the handlers in order, one commit; savepoints
	// only after a failure), which multiplies a partition's throughput
	// (BENCHMARKS.md "Every broker's runner": 5.7x on PostgreSQL at 64).
	// A record whose handler fails in a batch, and the later records of
	// its aggregate in that batch, are then handled one at a time with
	// the usual retries and parking; a batch that fails as a whole (the
	// database, or AttemptTimeout, which bounds the batch's one
	// transaction) is handled record by record. Default 0 (or 1): one
	// record per transaction.
	BatchSize int
	// BatchLinger is how long a worker waits for more records when fewer
	// than BatchSize are waiting (latency traded for larger batches at low
	// rates). Default DefaultBatchLinger; ignored without BatchSize.
	BatchLinger time.Duration
	// RequestInterval is how often the runner serves the inbox's retry
	// requests with its Handler (inbox.Inbox.ServeRequests): `outbox inbox
	// parked skip` requests the release of the held messages behind a
	// skipped one, `outbox inbox parked retry` a retry. Default
	// DefaultRequestInterval; negative: never (call Retry yourself).
	RequestInterval time.Duration
	// Kgo are extra franz-go client options (TLS, SASL, client ID, fetch
	// sizes, another balancer). They are applied after the runner's
	// defaults (seed brokers, cooperative-sticky balancer, start offset at
	// the log start) and before what correctness needs, which always wins:
	// the group and topics, auto-commit off, BlockRebalanceOnPoll and the
	// partition callbacks.
	Kgo []kgo.Opt
}

func (c Config) withDefaults() Config {
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.Backoff == nil {
		c.Backoff = consume.DefaultBackoff
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.AttemptTimeout == 0 {
		c.AttemptTimeout = DefaultAttemptTimeout
	}
	if c.CommitInterval == 0 {
		c.CommitInterval = DefaultCommitInterval
	}
	if c.MaxBufferedRecords == 0 {
		c.MaxBufferedRecords = DefaultMaxBufferedRecords
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	if c.BatchLinger == 0 {
		c.BatchLinger = DefaultBatchLinger
	}
	if c.RequestInterval == 0 {
		c.RequestInterval = DefaultRequestInterval
	}
	return c
}

// Stats are a runner's counters since NewRunner (records, not messages:
// a redelivered record counts again).
type Stats struct {
	// Applied: handlers whose transaction committed.
	Applied int64
	// Duplicates: records the inbox recognised; no handler ran.
	Duplicates int64
	// Held: records stored behind a parked message of their aggregate.
	Held int64
	// Parked: records parked after failing (with SkipAfterPark, also skipped).
	Parked int64
	// HandlerErrors: failed handler attempts (retries included).
	HandlerErrors int64
	// StoreErrors: failed inbox operations (the database, not the handler).
	StoreErrors int64
	// Invalid: records the inbox refused to store (inbox.ErrInvalidMessage:
	// a message ID, aggregate or topic it cannot hold), logged at ERROR and
	// passed over.
	Invalid int64
	// Commits: successful offset commits.
	Commits int64
	// Batches: transactions of several records committed with BatchSize
	// (inbox.Inbox.HandleBatch); Applied counts their records too.
	Batches int64
}

// Runner consumes Config.Topics as a member of Config.Group and applies
// each record through the inbox. Create it with NewRunner; Run it once.
type Runner struct {
	cfg Config
	log *slog.Logger

	started atomic.Bool
	opts    []kgo.Opt
	runCtx  context.Context // values of Run's ctx, never cancelled
	eng     *consume.Engine

	mu      sync.Mutex // guards workers
	workers map[tp]*worker

	commitMu sync.Mutex // serializes commits with revocations

	commits atomic.Int64

	health  *consume.Health
	missing atomic.Bool // a topic was missing at the last check
}

// Ready reports whether the runner is healthy: nil while it consumes (a
// member of the group, with or without partitions assigned); an error
// wrapping ErrNotReady otherwise: before Run started, after it returned,
// while a topic is missing (ErrTopicNotFound wrapped too) and after a
// fetch error until records are fetched again. A readiness probe serves
// it (HealthHandler). Safe for concurrent use.
func (r *Runner) Ready() error { return r.health.Ready() }

// HealthHandler returns an http.Handler for a readiness probe (mount it
// at /readyz, say): 200 "ready" while Ready returns nil, else 503 with
// "not ready: " and Ready's error on one line; any method and path.
func (r *Runner) HealthHandler() http.Handler { return consume.Handler(r.Ready) }

// checkTopics returns an error wrapping ErrTopicNotFound naming the
// topics of Config.Topics the cluster does not have, nil if it has them
// all, or the metadata request's error.
func (r *Runner) checkTopics(ctx context.Context, adm *kadm.Client) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	details, err := adm.ListTopics(ctx, r.cfg.Topics...)
	if err != nil {
		return fmt.Errorf("inboxkafka: reading the topics' metadata: %w", err)
	}
	var missing []string
	for _, t := range r.cfg.Topics {
		if d, ok := details[t]; !ok || errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
			missing = append(missing, t)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: inboxkafka: topic %s does not exist on the cluster: check Config.Topics against the relay's topics "+
			"(its topic prefix and the aggregate type, e.g. outbox.event.order), or create it (kafka-topics.sh --create --topic NAME)",
			ErrTopicNotFound, strings.Join(missing, ", "))
	}
	return nil
}

// watchTopics looks for the missing topics every topicCheckInterval until
// they all exist (the runner is then ready) or ctx ends.
func (r *Runner) watchTopics(ctx context.Context, adm *kadm.Client) {
	t := time.NewTicker(topicCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := r.checkTopics(ctx, adm)
		if errors.Is(err, ErrTopicNotFound) {
			r.health.Problem("topics missing", err, "a topic does not exist: nothing is consumed from it until it is created")
			continue
		}
		if err == nil {
			r.missing.Store(false)
			r.health.OK("every topic exists now")
			return
		}
	}
}

type tp struct {
	topic     string
	partition int32
}

// NewRunner validates cfg and returns a Runner. It returns an error
// wrapping ErrInvalidConfig for a missing Brokers, Group, Topics, Inbox, DB
// or Handler, a negative MaxAttempts, CommitInterval below
// MinCommitInterval, a negative MaxBufferedRecords or an unknown
// OnFailure, a BatchSize above inbox.MaxBatch or a negative BatchLinger,
// and kgo's error (wrapped) for options it rejects
// (kgo.ValidateOpts). It does not connect: Run does.
func NewRunner(cfg Config) (*Runner, error) {
	cfg = cfg.withDefaults()
	switch {
	case len(cfg.Brokers) == 0 || cfg.Group == "" || len(cfg.Topics) == 0:
		return nil, fmt.Errorf("%w: Brokers, Group and Topics are required", ErrInvalidConfig)
	case cfg.Inbox == nil || cfg.DB == nil || cfg.Handler == nil:
		return nil, fmt.Errorf("%w: Inbox, DB and Handler are required", ErrInvalidConfig)
	case cfg.MaxAttempts < 1:
		return nil, fmt.Errorf("%w: MaxAttempts %d is below 1", ErrInvalidConfig, cfg.MaxAttempts)
	case cfg.CommitInterval < MinCommitInterval:
		return nil, fmt.Errorf("%w: CommitInterval %s is below %s", ErrInvalidConfig, cfg.CommitInterval, MinCommitInterval)
	case cfg.MaxBufferedRecords < 1:
		return nil, fmt.Errorf("%w: MaxBufferedRecords %d is below 1", ErrInvalidConfig, cfg.MaxBufferedRecords)
	case cfg.OnFailure != ParkAndHold && cfg.OnFailure != SkipAfterPark:
		return nil, fmt.Errorf("%w: unknown OnFailure %d", ErrInvalidConfig, cfg.OnFailure)
	case cfg.BatchSize < 0 || cfg.BatchSize > inbox.MaxBatch:
		return nil, fmt.Errorf("%w: BatchSize %d, want 0 to %d", ErrInvalidConfig, cfg.BatchSize, inbox.MaxBatch)
	case cfg.BatchLinger < 0:
		return nil, fmt.Errorf("%w: negative BatchLinger %s", ErrInvalidConfig, cfg.BatchLinger)
	}
	for _, t := range cfg.Topics {
		if t == "" {
			return nil, fmt.Errorf("%w: an empty topic name", ErrInvalidConfig)
		}
	}
	r := &Runner{cfg: cfg, workers: map[tp]*worker{},
		log: cfg.Logger.With("component", "inboxkafka", "group", cfg.Group)}
	r.health = consume.NewHealth(r.log)
	r.eng = consume.NewEngine(consume.Settings{Inbox: cfg.Inbox, DB: cfg.DB, Handler: cfg.Handler,
		MaxAttempts: cfg.MaxAttempts, Backoff: cfg.Backoff, AttemptTimeout: cfg.AttemptTimeout, OnFailure: cfg.OnFailure,
		BatchSize: cfg.BatchSize, BatchLinger: cfg.BatchLinger, RequestInterval: cfg.RequestInterval}, r.log, observer{cfg.Observer})
	if m, ok := cfg.Observer.(*Metrics); ok && cfg.Inbox.Config().Observer != inbox.Observer(m) {
		r.log.Warn("the Metrics given as Config.Observer is not the Inbox's Observer: only lag is recorded; give it to inbox.Config.Observer too")
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(cfg.Brokers...),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
	}
	if !cfg.ReadUncommitted {
		opts = append(opts, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	}
	opts = append(opts, cfg.Kgo...)
	opts = append(opts,
		kgo.ConsumerGroup(cfg.Group),
		kgo.ConsumeTopics(cfg.Topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(r.assigned),
		kgo.OnPartitionsRevoked(r.revoked),
		kgo.OnPartitionsLost(r.lost),
	)
	if err := kgo.ValidateOpts(opts...); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	r.opts = opts
	return r, nil
}

// Stats returns the runner's counters so far. Safe for concurrent use.
func (r *Runner) Stats() Stats {
	c := r.eng.Counters()
	return Stats{
		Applied: c.Applied, Duplicates: c.Duplicates, Held: c.Held, Parked: c.Parked, HandlerErrors: c.HandlerErrors,
		StoreErrors: c.StoreErrors, Invalid: c.Invalid, Commits: r.commits.Load(), Batches: c.Batches,
	}
}

// Retry runs the parked and held messages that f selects through the
// runner's Handler, with inbox.Inbox.Retry (an aggregate's in the order
// they were stored, each in its own transaction; an aggregate stops at its
// first failure, which stays parked). It returns how many were applied and
// Retry's errors (inbox.ErrInvalidFilter, inbox.ErrNothingMatched, handler
// failures wrapping inbox.ErrHandler). A handler panic is an error
// wrapping ErrHandlerPanic. It may be called whether or not Run runs (an
// admin endpoint of the consumer); the held messages that arrive while it
// runs are the inbox's concern (see inbox.Inbox.Retry).
func (r *Runner) Retry(ctx context.Context, f inbox.ParkedFilter) (int, error) {
	return r.eng.Retry(ctx, f)
}

// Run checks the inbox schema (inbox.Inbox.Check), creates the Kafka
// client, joins the group and processes records until ctx is cancelled.
// Then it
// stops every worker (a handler in progress finishes), commits the offsets
// of every finished record (bounded by DefaultStopTimeout), leaves the
// group, and returns nil. Broker and database errors during the run are
// logged and retried; they do not end Run. It returns ErrStarted if called
// twice; the schema's error (inbox.ErrSchemaMissing, ErrSchemaOutdated or
// ErrSchemaTooNew, wrapped) without starting, so that a consumer deployed
// before its migration fails at once instead of retrying every record (a
// database that cannot be reached at start is logged, and retried like
// any outage); kgo's error (wrapped) if the client cannot be created; with
// Config.FailFast, an error wrapping ErrTopicNotFound before joining the
// group when a topic does not exist (without it: one WARN, Ready fails
// until the topic exists, looked for every 5 s). The
// client is closed when Run returns; a Runner is not reusable.
func (r *Runner) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return ErrStarted
	}
	r.runCtx = context.WithoutCancel(ctx)
	r.eng.SetBase(ctx)
	if err := r.eng.Check(ctx, "inboxkafka"); err != nil {
		return err
	}
	cl, err := kgo.NewClient(r.opts...)
	if err != nil {
		return fmt.Errorf("inboxkafka: creating the Kafka client: %w", err)
	}
	adm := kadm.NewClient(cl)
	switch err := r.checkTopics(ctx, adm); {
	case errors.Is(err, ErrTopicNotFound) && r.cfg.FailFast:
		cl.Close()
		r.health.Stopped(err)
		return err
	case errors.Is(err, ErrTopicNotFound):
		r.missing.Store(true)
		r.health.Problem("topics missing", err, "a topic does not exist: nothing is consumed from it until it is created; looking again every 5s")
	case err != nil:
		r.log.Warn("could not check that the topics exist; consuming anyway", "err", err)
		r.health.OK("inbox consumer starting")
	default:
		r.health.OK("inbox consumer starting")
	}
	r.log.Info("inbox consumer starting", "topics", r.cfg.Topics)
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watching sync.WaitGroup
	if r.missing.Load() {
		watching.Go(func() { r.watchTopics(watchCtx, adm) })
	}

	commitDone := make(chan struct{})
	commitCtx, stopCommitter := context.WithCancel(r.runCtx)
	go func() {
		defer close(commitDone)
		r.committer(commitCtx, cl)
	}()
	requestsDone := make(chan struct{})
	go func() {
		defer close(requestsDone)
		r.eng.ServeRequests(commitCtx)
	}()

	for ctx.Err() == nil {
		fetches := cl.PollFetches(ctx)
		if fetches.IsClientClosed() {
			break
		}
		failed := r.fetchErrors(fetches)
		if !failed && fetches.NumRecords() > 0 && !r.missing.Load() {
			r.health.OK("fetching again")
		}
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) > 0 {
				r.worker(cl, tp{p.Topic, p.Partition}).push(p.Records, p.HighWatermark)
			}
		})
		cl.AllowRebalance()
	}

	stopCommitter()
	<-commitDone
	<-requestsDone
	r.commitMu.Lock()
	ws := r.take(nil)
	stopAll(ws)
	stopCtx, cancel := context.WithTimeout(r.runCtx, DefaultStopTimeout)
	if err := r.commit(stopCtx, cl, ws); err != nil {
		r.log.Warn("final offset commit failed; the next owner redelivers, the inbox dedupes", "err", err)
	}
	cancel()
	r.commitMu.Unlock()
	cl.AllowRebalance()
	stopWatch()
	watching.Wait()
	cl.Close()
	r.health.Stopped(nil)
	r.log.Info("inbox consumer stopped")
	return nil
}

// worker returns the partition's worker, starting one if the partition
// has none (the assignment callback normally started it).
func (r *Runner) worker(cl *kgo.Client, k tp) *worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.workers[k]
	if w == nil {
		w = r.startWorker(cl, k)
	}
	return w
}

// startWorker starts k's worker; r.mu is held.
func (r *Runner) startWorker(cl *kgo.Client, k tp) *worker {
	w := &worker{r: r, cl: cl, tp: k, stop: make(chan struct{}), done: make(chan struct{}),
		wake: make(chan struct{}, 1), committed: -1, hw: -1}
	r.workers[k] = w
	go w.run()
	return w
}

// take removes and returns the workers of the given partitions (nil: all).
func (r *Runner) take(m map[string][]int32) []*worker {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ws []*worker
	if m == nil {
		for k, w := range r.workers {
			ws = append(ws, w)
			delete(r.workers, k)
		}
		return ws
	}
	for t, ps := range m {
		for _, p := range ps {
			if w := r.workers[tp{t, p}]; w != nil {
				ws = append(ws, w)
				delete(r.workers, tp{t, p})
			}
		}
	}
	return ws
}

// stopAll stops the workers and waits until each has returned.
func stopAll(ws []*worker) {
	for _, w := range ws {
		close(w.stop)
	}
	for _, w := range ws {
		<-w.done
	}
}

func (r *Runner) assigned(_ context.Context, cl *kgo.Client, m map[string][]int32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for t, ps := range m {
		for _, p := range ps {
			if r.workers[tp{t, p}] == nil {
				r.startWorker(cl, tp{t, p})
			}
		}
	}
	r.log.Debug("partitions assigned", "partitions", m)
}

// revoked stops the revoked partitions' workers, waits for them and
// commits what they finished, before the rebalance goes on. franz-go also
// calls it, with an empty map, at the end of every group session: then it
// commits what every worker finished.
func (r *Runner) revoked(ctx context.Context, cl *kgo.Client, m map[string][]int32) {
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	ws := r.take(m)
	stopAll(ws)
	if len(m) == 0 {
		r.mu.Lock()
		for _, w := range r.workers {
			ws = append(ws, w)
		}
		r.mu.Unlock()
	}
	cctx, cancel := context.WithTimeout(ctx, DefaultStopTimeout)
	defer cancel()
	if err := r.commit(cctx, cl, ws); err != nil {
		r.log.Warn("offset commit at revocation failed; the next owner redelivers, the inbox dedupes", "err", err)
	}
	r.forget(cl, ws, len(m) != 0)
	r.log.Debug("partitions revoked", "partitions", m)
}

// lost stops the lost partitions' workers and waits for them, without a
// commit (the member is no longer in the group).
func (r *Runner) lost(_ context.Context, cl *kgo.Client, m map[string][]int32) {
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	ws := r.take(m)
	stopAll(ws)
	r.forget(cl, ws, true)
	r.log.Warn("partitions lost", "partitions", m)
}

// forget resumes stopped workers' paused partitions (a partition assigned
// again must fetch) and tells the observer they are gone.
func (r *Runner) forget(cl *kgo.Client, ws []*worker, gone bool) {
	if !gone {
		return
	}
	for _, w := range ws {
		w.mu.Lock()
		if w.paused {
			w.paused = false
			cl.ResumeFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
		}
		w.mu.Unlock()
		r.cfg.Observer.PartitionRevoked(w.tp.topic, w.tp.partition)
	}
}

// committer commits finished offsets every CommitInterval until ctx ends.
func (r *Runner) committer(ctx context.Context, cl *kgo.Client) {
	t := time.NewTicker(r.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.commitMu.Lock()
		r.mu.Lock()
		ws := make([]*worker, 0, len(r.workers))
		for _, w := range r.workers {
			ws = append(ws, w)
		}
		r.mu.Unlock()
		cctx, cancel := context.WithTimeout(ctx, DefaultStopTimeout)
		if err := r.commit(cctx, cl, ws); err != nil && ctx.Err() == nil {
			r.log.Warn("offset commit failed; retried at the next interval", "err", err)
		}
		cancel()
		r.commitMu.Unlock()
	}
}

// commit commits, for each worker, the offset after its last finished
// record, if that is past what it committed. r.commitMu is held.
func (r *Runner) commit(ctx context.Context, cl *kgo.Client, ws []*worker) error {
	var recs []*kgo.Record
	var owners []*worker
	for _, w := range ws {
		w.mu.Lock()
		if w.finished != nil && w.finished.Offset > w.committed {
			recs = append(recs, w.finished)
			owners = append(owners, w)
		}
		w.mu.Unlock()
	}
	if len(recs) == 0 {
		return nil
	}
	failpoint.Inject(fpBeforeCommit)
	if err := cl.CommitRecords(ctx, recs...); err != nil {
		return fmt.Errorf("inboxkafka: committing offsets: %w", err)
	}
	r.commits.Add(1)
	for i, w := range owners {
		w.mu.Lock()
		if recs[i].Offset > w.committed {
			w.committed = recs[i].Offset
		}
		w.mu.Unlock()
	}
	return nil
}

// worker processes one partition's records in order.
type worker struct {
	r    *Runner
	cl   *kgo.Client
	tp   tp
	stop chan struct{} // closed: finish the current record, then return
	done chan struct{} // closed when run returned
	wake chan struct{} // a push happened

	mu        sync.Mutex
	queue     []*kgo.Record
	paused    bool
	hw        int64       // the partition's high watermark as last fetched
	finished  *kgo.Record // the last record whose outcome is stored
	committed int64       // offset of the last committed record, -1 none
}

// push appends polled records; it never blocks.
func (w *worker) push(recs []*kgo.Record, hw int64) {
	w.mu.Lock()
	w.queue = append(w.queue, recs...)
	if hw > w.hw {
		w.hw = hw
	}
	if !w.paused && len(w.queue) >= w.r.cfg.MaxBufferedRecords {
		// Under w.mu, so that a resume cannot come between the flag
		// and the pause (and leave the partition paused for good).
		w.paused = true
		w.cl.PauseFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// next returns the next record, waiting for one; false once stopped.
func (w *worker) next() (*kgo.Record, bool) {
	for {
		select {
		case <-w.stop:
			return nil, false
		default:
		}
		w.mu.Lock()
		if len(w.queue) > 0 {
			rec := w.queue[0]
			w.queue[0] = nil
			w.queue = w.queue[1:]
			if w.paused && len(w.queue) <= w.r.cfg.MaxBufferedRecords/2 {
				w.paused = false
				w.cl.ResumeFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
			}
			w.mu.Unlock()
			return rec, true
		}
		w.mu.Unlock()
		select {
		case <-w.stop:
			return nil, false
		case <-w.wake:
		}
	}
}

func (w *worker) run() {
	defer close(w.done)
	if w.r.cfg.BatchSize >= 2 {
		w.runBatches()
		return
	}
	for {
		rec, ok := w.next()
		if !ok {
			return
		}
		if !w.r.eng.Process(w.stop, w.r.delivery(rec), 0, nil) {
			return
		}
		failpoint.Inject(fpAfterStore)
		w.finish(rec)
	}
}

// finish makes rec's offset committable and reports the lag.
func (w *worker) finish(rec *kgo.Record) {
	w.mu.Lock()
	w.finished = rec
	lag := w.hw - rec.Offset - 1
	w.mu.Unlock()
	if lag < 0 {
		lag = 0
	}
	w.r.cfg.Observer.Lag(rec.Topic, rec.Partition, lag)
}

// nextBatch returns up to BatchSize records, waiting for one and then, if
// fewer are queued, up to BatchLinger for more; false once stopped.
func (w *worker) nextBatch() ([]*kgo.Record, bool) {
	first, ok := w.next()
	if !ok {
		return nil, false
	}
	batch := []*kgo.Record{first}
	var linger <-chan time.Time
	for len(batch) < w.r.cfg.BatchSize {
		w.mu.Lock()
		n := min(len(w.queue), w.r.cfg.BatchSize-len(batch))
		batch = append(batch, w.queue[:n]...)
		clear(w.queue[:n])
		w.queue = w.queue[n:]
		if w.paused && len(w.queue) <= w.r.cfg.MaxBufferedRecords/2 {
			w.paused = false
			w.cl.ResumeFetchPartitions(map[string][]int32{w.tp.topic: {w.tp.partition}})
		}
		w.mu.Unlock()
		if len(batch) == w.r.cfg.BatchSize {
			break
		}
		if linger == nil {
			t := time.NewTimer(w.r.cfg.BatchLinger)
			defer t.Stop()
			linger = t.C
		}
		select {
		case <-w.wake:
			continue
		case <-linger:
		case <-w.stop:
		}
		break
	}
	return batch, true
}

// runBatches is run with BatchSize: each batch through
// inbox.Inbox.HandleBatch, then the records it left one at a time.
func (w *worker) runBatches() {
	for {
		batch, ok := w.nextBatch()
		if !ok {
			return
		}
		ds := make([]*consume.Delivery, len(batch))
		for i, rec := range batch {
			ds[i] = w.r.delivery(rec)
		}
		if n, ok := w.r.eng.ProcessBatch(w.stop, ds); !ok {
			if n > 0 {
				w.finish(batch[n-1])
			}
			return
		}
		failpoint.Inject(fpAfterStore)
		w.finish(batch[len(batch)-1])
	}
}

// delivery adapts rec for the engine.
func (r *Runner) delivery(rec *kgo.Record) *consume.Delivery {
	d := &consume.Delivery{Msg: Message(rec), Ref: rec,
		Where: []any{"topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset}}
	if r.cfg.ContextFor != nil {
		d.Ctx = r.cfg.ContextFor(r.runCtx, rec)
	}
	return d
}

// observer reports the engine's results to the Config's Observer.
type observer struct{ o Observer }

func (o observer) Processed(d *consume.Delivery, res consume.Result) {
	rec := d.Ref.(*kgo.Record)
	o.o.Processed(Result{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Outcome: res.Outcome,
		Parked: res.Parked, Invalid: res.Invalid, Attempts: res.Attempts, Duration: res.Duration})
}

func (o observer) AttemptFailed(d *consume.Delivery, attempt int, err error) {
	rec := d.Ref.(*kgo.Record)
	o.o.AttemptFailed(rec.Topic, rec.Partition, attempt, err)
}

// fetchErrors reports a poll's fetch errors (context cancellation aside)
// to the runner's health, one problem per distinct error naming every
// partition it hit: a cause shared by all partitions (the broker refuses
// the topic, or is gone) is one WARN line, not one per partition and
// poll. It returns whether any fetch failed.
func (r *Runner) fetchErrors(fetches kgo.Fetches) bool {
	type hit struct {
		err   error
		parts []string
	}
	var hits []*hit
	byText := map[string]*hit{}
	fetches.EachError(func(t string, p int32, err error) {
		if errors.Is(err, context.Canceled) {
			return
		}
		h := byText[err.Error()]
		if h == nil {
			h = &hit{err: err}
			byText[err.Error()] = h
			hits = append(hits, h)
		}
		h.parts = append(h.parts, fmt.Sprintf("%s/%d", t, p))
	})
	for _, h := range hits {
		slices.Sort(h.parts)
		where := strings.Join(h.parts, ", ")
		if !r.health.Problem("fetch: "+h.err.Error(), fmt.Errorf("inboxkafka: fetching %s: %w", where, h.err),
			"fetch error", "partitions", where) {
			r.log.Debug("fetch error again", "partitions", where, "err", h.err)
		}
	}
	return len(hits) > 0
}
