package inboxrabbitmq

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/consume"
)

// Defaults of Config.
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
	// when BatchSize is set and fewer are waiting.
	DefaultBatchLinger = consume.DefaultBatchLinger
	// DefaultRequestInterval is how often the runner serves the inbox's
	// retry requests (`outbox inbox parked skip` and `retry`).
	DefaultRequestInterval = consume.DefaultRequestInterval
	// DefaultWorkers is how many aggregates are applied in parallel.
	DefaultWorkers = 8
	// DefaultPrefetch is the channel's prefetch count (basic.qos): how
	// many deliveries may be unacknowledged at once.
	DefaultPrefetch = 256
	// DefaultReconnectMax caps the backoff between reconnections (from
	// 100 ms, doubling, ±20 %): a broker back after an outage is
	// reconnected to within about this long (1.2 s at most). It was 5 s,
	// which after a 4 s cut left the runner idle for 2-3 s more.
	DefaultReconnectMax = time.Second
)

// ArgSingleActiveConsumer is the queue argument that makes RabbitMQ (3.8
// and later) deliver to one consumer of the queue at a time and fail over
// to the next registered one when it goes away: what keeps an
// aggregate's order with several runners.
const ArgSingleActiveConsumer = "x-single-active-consumer"

// Errors.
var (
	// ErrInvalidConfig is returned (wrapped) by NewRunner for a missing or
	// out-of-range setting.
	ErrInvalidConfig = errors.New("inboxrabbitmq: invalid config")
	// ErrStarted is returned by Run when the runner already ran.
	ErrStarted = errors.New("inboxrabbitmq: Run already called")
	// ErrQueue is returned (wrapped, with the broker's error and what to
	// do) by Run when the queue cannot be declared, bound or consumed as
	// the runner needs it: an existing queue declared without
	// x-single-active-consumer (or with other arguments) makes the broker
	// answer 406 PRECONDITION_FAILED (such a queue would give an
	// aggregate's messages to several consumers at once; the runner
	// refuses it rather than lose the order); a binding to a missing
	// exchange 404 NOT_FOUND; a user without the rights 403
	// ACCESS_REFUSED.
	ErrQueue = errors.New("inboxrabbitmq: queue not usable")
	// ErrNotFound is wrapped, with ErrQueue, by Run's error when a
	// Binding's exchange does not exist (404; the error names it and
	// `outbox rabbitmq declare --exchange NAME`), and with Config.FailFast
	// when the queue does not exist at start. It is inbox.ErrSourceMissing.
	ErrNotFound = inbox.ErrSourceMissing
	// ErrNotReady is wrapped by Ready while the runner is not consuming
	// (inbox.ErrNotReady).
	ErrNotReady = inbox.ErrNotReady
	// ErrPermanent is inbox.ErrPermanent: a handler error wrapping it
	// parks the message after the first attempt.
	ErrPermanent = inbox.ErrPermanent
	// ErrHandlerPanic is inbox.ErrHandlerPanic: a recovered handler
	// panic, a handler error like any other.
	ErrHandlerPanic = inbox.ErrHandlerPanic
)

// FailurePolicy is inbox.FailurePolicy: what happens to a message whose
// handler failed every attempt.
type FailurePolicy = inbox.FailurePolicy

const (
	// ParkAndHold parks the message and holds its aggregate (the
	// default; the aggregate's order is kept).
	ParkAndHold = inbox.ParkAndHold
	// SkipAfterPark parks the message and skips it at once: the
	// aggregate's later messages are applied.
	SkipAfterPark = inbox.SkipAfterPark
)

// Handler applies one message to the consumer's database inside tx, the
// inbox's transaction (the dedupe row commits with it). It must not
// commit or roll back tx. An error rolls the transaction back and the
// message is retried, then parked. ctx carries the values of Run's
// context (and what Config.ContextFor adds) and the deadline
// Config.AttemptTimeout; it is not cancelled at shutdown.
type Handler func(ctx context.Context, tx *sql.Tx, msg inbox.Message) error

// Binding binds the queue to an exchange with a routing key pattern
// (the relay's keys are "<aggregate type>.<id word>": "order.*").
type Binding struct {
	Exchange string
	Key      string
}

// Config configures a Runner. URL, Queue, Inbox, DB and Handler are
// required; every other field has a default.
type Config struct {
	// URL is the AMQP URL ("amqp://user:pass@host:5672/vhost"). It is
	// never logged.
	URL string
	// AMQP is the dial configuration (TLS, heartbeat, SASL,
	// connection name); zero: amqp091's defaults.
	AMQP amqp.Config
	// Queue is the queue consumed. Run declares it durable, with
	// x-single-active-consumer and QueueArgs (idempotent when it exists
	// with exactly these arguments; ErrQueue when it exists with others).
	Queue string
	// QueueArgs are more arguments for the queue's declaration
	// ("x-queue-type": "quorum", "x-max-length", ...).
	QueueArgs amqp.Table
	// Bindings are declared at every connection (idempotent). Default
	// none: bind the queue yourself. A queue the runner had to declare
	// (it did not exist) with no Bindings receives nothing: the runner
	// says so in one WARN.
	Bindings []Binding
	// FailFast makes Run return an error wrapping ErrQueue and
	// ErrNotFound when Queue does not exist at its first connection (a
	// mistyped name), instead of declaring it. Default false.
	FailFast bool
	// Inbox stores dedupe rows and parked messages.
	Inbox *inbox.Inbox
	// DB is the consumer's database. Size its pool for Workers
	// connections.
	DB *sql.DB
	// Handler applies one message in the inbox's transaction.
	Handler Handler

	// Workers is how many aggregates are applied in parallel (a
	// message goes to the worker of its aggregate). Default
	// DefaultWorkers.
	Workers int
	// Prefetch is the channel's prefetch count. Default DefaultPrefetch,
	// or with BatchSize 8 × Workers × BatchSize if that is more: a
	// batch's deliveries stay unacknowledged until its commit, and the
	// aggregates are not spread evenly over the workers, so with 2 ×
	// (1,024 at the defaults) the batches averaged 22 messages, with 8 ×
	// 47, and one run of the benchmark went from 7,335 to 12,798 events/s
	// (BENCHMARKS.md "Every broker's runner").
	// RabbitMQ's consumer_timeout (30 min by default) closes the channel
	// of a delivery unacknowledged that long: keep MaxAttempts × the
	// backoff well below it.
	Prefetch int
	// MaxAttempts is how many times a handler is tried before the message
	// is parked. Default DefaultMaxAttempts.
	MaxAttempts int
	// Backoff returns a fresh backoff for one message's retries (also
	// used, without a limit, while the inbox itself fails). Default:
	// exponential from DefaultRetryInitial to DefaultRetryMax, ±20 %.
	Backoff func() backoff.BackOff
	// AttemptTimeout is the deadline of one handler attempt (with
	// BatchSize, of a batch's transaction); an attempt that runs out is a
	// failed attempt, also when the handler ignores its context and
	// returns nil late. Default DefaultAttemptTimeout; negative: none.
	AttemptTimeout time.Duration
	// OnFailure is the policy for a message that failed every attempt.
	// Default ParkAndHold.
	OnFailure FailurePolicy
	// ContextFor derives a handler's context from the delivery, e.g. to
	// continue the trace the relay put in the headers. Default: ctx
	// unchanged.
	ContextFor func(ctx context.Context, d *amqp.Delivery) context.Context
	// Observer is told about every message's outcome. Default none.
	Observer Observer
	// Logger receives the runner's logs. Default slog.Default().
	Logger *slog.Logger
	// ReconnectMax caps the backoff between reconnection attempts (from
	// 100 ms, doubling, ±20 % jitter): after an outage the runner
	// resumes within about ReconnectMax of the broker's return. Default
	// DefaultReconnectMax; at least 100 ms.
	ReconnectMax time.Duration
	// BatchSize, from 2 to inbox.MaxBatch (64), applies up to that many
	// messages of one worker in one transaction (inbox.Inbox.HandleBatch).
	// Default 0: one message per transaction.
	BatchSize int
	// BatchLinger is how long a worker waits for more messages when
	// fewer than BatchSize wait. Default DefaultBatchLinger.
	BatchLinger time.Duration
	// RequestInterval is how often the inbox's retry requests are served
	// with Handler. Default DefaultRequestInterval; negative: never.
	RequestInterval time.Duration
}

// Observer is told what the runner does with deliveries. Its methods are
// called from the workers concurrently and must not block. (What the
// inbox does with messages is told to the inbox's own inbox.Observer.)
type Observer interface {
	// Processed is called once per delivery whose outcome is stored,
	// right before its ack.
	Processed(Result)
	// AttemptFailed is called for every failed handler attempt.
	AttemptFailed(queue string, messageID string, attempt int, err error)
}

// Result is one delivery's stored outcome.
type Result struct {
	// Queue and MessageID (the outbox message ID) name the message;
	// DeliveryTag is the channel's tag of this delivery.
	Queue       string
	MessageID   string
	DeliveryTag uint64
	// Redelivered: the broker delivered it before (to this or another
	// consumer) without an ack.
	Redelivered bool
	// DeliveryCount is the x-delivery-count header of quorum queues (the
	// earlier deliveries), 0 elsewhere.
	DeliveryCount int64
	// Outcome is the inbox's (Applied, Duplicate or Held); 0 when
	// Parked or Invalid.
	Outcome inbox.Outcome
	Parked  bool
	Invalid bool
	// Attempts is the number of handler attempts; Duration the last
	// one's inbox call.
	Attempts int
	Duration time.Duration
}

// Stats are a runner's counters since NewRunner (deliveries, not
// messages: a redelivery counts again).
type Stats struct {
	Applied, Duplicates, Held, Parked, HandlerErrors, StoreErrors, Invalid, Batches int64
	// Acks is the number of acks sent.
	Acks int64
	// Connections is the number of connections made (1 + reconnects).
	Connections int64
}

// Runner consumes Config.Queue and applies each message through the
// inbox. Create it with NewRunner; Run it once.
type Runner struct {
	cfg     Config
	log     *slog.Logger
	eng     *consume.Engine
	started atomic.Bool

	acks, conns atomic.Int64

	health   *consume.Health
	declared atomic.Bool // the first connection checked whether the queue existed
}

// Ready reports whether the runner is healthy: nil while it consumes; an
// error wrapping ErrNotReady otherwise: before Run started consuming,
// after it returned, and while it reconnects (the connection's error
// wrapped too). A readiness probe serves it (HealthHandler). Safe for
// concurrent use.
func (r *Runner) Ready() error { return r.health.Ready() }

// HealthHandler returns an http.Handler for a readiness probe (mount it
// at /readyz, say): 200 "ready" while Ready returns nil, else 503 with
// "not ready: " and Ready's error on one line; any method and path.
func (r *Runner) HealthHandler() http.Handler { return consume.Handler(r.Ready) }

// NewRunner validates cfg and returns a Runner. It returns an error
// wrapping ErrInvalidConfig for a missing URL, Queue, Inbox, DB or
// Handler, QueueArgs with x-single-active-consumer (the runner sets it),
// a negative Workers or Prefetch, MaxAttempts below 1, an unknown
// OnFailure, a BatchSize above inbox.MaxBatch (or above Prefetch), a
// negative BatchLinger or a ReconnectMax below 100 ms. It does not
// connect: Run does.
func NewRunner(cfg Config) (*Runner, error) {
	if cfg.Workers == 0 {
		cfg.Workers = DefaultWorkers
	}
	if cfg.Prefetch == 0 {
		cfg.Prefetch = max(DefaultPrefetch, 8*cfg.Workers*cfg.BatchSize)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ReconnectMax == 0 {
		cfg.ReconnectMax = DefaultReconnectMax
	}
	s := consume.Settings{Inbox: cfg.Inbox, DB: cfg.DB, MaxAttempts: cfg.MaxAttempts, Backoff: cfg.Backoff,
		AttemptTimeout: cfg.AttemptTimeout, OnFailure: cfg.OnFailure, BatchSize: cfg.BatchSize, BatchLinger: cfg.BatchLinger,
		RequestInterval: cfg.RequestInterval, AfterStore: fpAfterStore}
	if cfg.Handler != nil {
		s.Handler = cfg.Handler
	}
	s = s.WithDefaults()
	switch {
	case cfg.URL == "" || cfg.Queue == "":
		return nil, fmt.Errorf("%w: URL and Queue are required", ErrInvalidConfig)
	case cfg.ReconnectMax < reconnectInitial:
		return nil, fmt.Errorf("%w: ReconnectMax %s is below %s", ErrInvalidConfig, cfg.ReconnectMax, reconnectInitial)
	case cfg.Workers < 1 || cfg.Prefetch < 1:
		return nil, fmt.Errorf("%w: Workers %d and Prefetch %d must be positive", ErrInvalidConfig, cfg.Workers, cfg.Prefetch)
	case cfg.QueueArgs[ArgSingleActiveConsumer] != nil:
		return nil, fmt.Errorf("%w: QueueArgs sets %s: the runner declares it (true), which keeps the order", ErrInvalidConfig, ArgSingleActiveConsumer)
	case cfg.BatchSize > cfg.Prefetch:
		return nil, fmt.Errorf("%w: BatchSize %d above Prefetch %d", ErrInvalidConfig, cfg.BatchSize, cfg.Prefetch)
	}
	if err := s.Validate(ErrInvalidConfig); err != nil {
		return nil, err
	}
	log := cfg.Logger.With("component", "inboxrabbitmq", "queue", cfg.Queue)
	r := &Runner{cfg: cfg, log: log, health: consume.NewHealth(log)}
	r.eng = consume.NewEngine(s, log, observer{r})
	return r, nil
}

// fpAfterStore is the failpoint hit after a delivery's (or a batch's)
// outcome is stored, before its ack (internal/failpoint).
const fpAfterStore = "inboxrabbitmq/after-store"

// Stats returns the runner's counters so far. Safe for concurrent use.
func (r *Runner) Stats() Stats {
	c := r.eng.Counters()
	return Stats{Applied: c.Applied, Duplicates: c.Duplicates, Held: c.Held, Parked: c.Parked,
		HandlerErrors: c.HandlerErrors, StoreErrors: c.StoreErrors, Invalid: c.Invalid, Batches: c.Batches,
		Acks: r.acks.Load(), Connections: r.conns.Load()}
}

// Retry runs the parked and held messages that f selects through the
// runner's Handler (inbox.Inbox.Retry); it returns how many were applied
// and Retry's errors. It may be called whether or not Run runs.
func (r *Runner) Retry(ctx context.Context, f inbox.ParkedFilter) (int, error) {
	return r.eng.Retry(ctx, f)
}

// Run checks the inbox schema, connects, declares the queue (with
// x-single-active-consumer) and its Bindings, and consumes until ctx is
// cancelled. A lost connection or channel stops the workers (the
// handler in progress finishes and is acked if the channel still
// lives; the broker requeues every unacked delivery) and reconnects with
// backoff. At cancellation it stops the workers the same way, closes the
// connection and returns nil.
//
// It returns ErrStarted if called twice; the schema's error
// (inbox.ErrSchemaMissing, ErrSchemaOutdated, ErrSchemaTooNew, wrapped)
// without connecting; ErrQueue (wrapped) when the broker refuses the
// queue's declaration (406 or 403: a queue declared with other arguments,
// or access refused), which no retry fixes, or a Binding's exchange does
// not exist (404, ErrNotFound too); with Config.FailFast, ErrQueue and
// ErrNotFound when the queue does not exist. Other broker errors are
// logged (once per distinct error) and retried.
func (r *Runner) Run(ctx context.Context) error {
	if !r.started.CompareAndSwap(false, true) {
		return ErrStarted
	}
	r.eng.SetBase(ctx)
	if err := r.eng.Check(ctx, "inboxrabbitmq"); err != nil {
		return err
	}
	requestsCtx, stopRequests := context.WithCancel(ctx)
	requestsDone := make(chan struct{})
	go func() {
		defer close(requestsDone)
		r.eng.ServeRequests(requestsCtx)
	}()
	defer func() {
		stopRequests()
		<-requestsDone
	}()
	wait := reconnectBackoff(r.cfg.ReconnectMax)
	r.log.Info("inbox consumer starting")
	for ctx.Err() == nil {
		start := time.Now()
		err := r.session(ctx)
		if ctx.Err() != nil {
			break
		}
		if errors.Is(err, ErrQueue) {
			r.health.Stopped(err)
			return err
		}
		if time.Since(start) > r.cfg.ReconnectMax {
			wait.Reset()
		}
		// One WARN per outage (the errors of its attempts differ: a reset,
		// then refusals or EOFs), the rest at DEBUG.
		if !r.health.Problem("connection", err, "connection lost; reconnecting") {
			r.log.Debug("connection lost again; reconnecting", "err", err)
		}
		t := time.NewTimer(wait.NextBackOff())
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	r.health.Stopped(nil)
	r.log.Info("inbox consumer stopped")
	return nil
}

// reconnectInitial is the first wait before a reconnection.
const reconnectInitial = 100 * time.Millisecond

// reconnectBackoff is the wait between reconnection attempts: from
// reconnectInitial, doubling, ±20 %, capped at limit, with no end.
func reconnectBackoff(limit time.Duration) *backoff.ExponentialBackOff {
	return backoff.NewExponentialBackOff(backoff.WithInitialInterval(reconnectInitial), backoff.WithRandomizationFactor(0.2),
		backoff.WithMaxInterval(limit), backoff.WithMaxElapsedTime(0))
}

// queueExisted reports whether the queue exists (a passive declaration
// on a channel of its own: a 404 closes it).
func (r *Runner) queueExisted(conn *amqp.Connection) (bool, error) {
	ch, err := conn.Channel()
	if err != nil {
		return false, fmt.Errorf("inboxrabbitmq: opening a channel: %w", err)
	}
	defer ch.Close()
	_, err = ch.QueueDeclarePassive(r.cfg.Queue, true, false, false, false, nil)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("inboxrabbitmq: checking queue %q: %w", r.cfg.Queue, err)
	}
	return true, nil
}

// session consumes on one connection until it fails or ctx ends.
func (r *Runner) session(ctx context.Context) error {
	conn, err := amqp.DialConfig(r.cfg.URL, r.cfg.AMQP)
	if err != nil {
		return fmt.Errorf("inboxrabbitmq: connecting: %w", redact(err, r.cfg.URL))
	}
	defer conn.Close()
	r.conns.Add(1)
	existed := true
	if !r.declared.Load() {
		if existed, err = r.queueExisted(conn); err != nil {
			return err
		}
		if !existed && r.cfg.FailFast {
			return fmt.Errorf("%w: %w: queue %q does not exist (Config.FailFast): check Config.Queue, or let the runner declare it "+
				"with Config.Bindings to the relay's exchange (outbox rabbitmq declare --exchange NAME makes the exchange)", ErrQueue, ErrNotFound, r.cfg.Queue)
		}
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("inboxrabbitmq: opening a channel: %w", err)
	}
	args := amqp.Table{ArgSingleActiveConsumer: true}
	for k, v := range r.cfg.QueueArgs {
		args[k] = v
	}
	if _, err := ch.QueueDeclare(r.cfg.Queue, true, false, false, false, args); err != nil {
		return queueErr(fmt.Errorf("declaring queue %q with %s: %w", r.cfg.Queue, ArgSingleActiveConsumer, err))
	}
	for _, b := range r.cfg.Bindings {
		if err := ch.QueueBind(r.cfg.Queue, b.Key, b.Exchange, false, nil); err != nil {
			return queueErr(fmt.Errorf("binding queue %q to exchange %q with %q: %w", r.cfg.Queue, b.Exchange, b.Key, err))
		}
	}
	if !r.declared.Swap(true) && !existed && len(r.cfg.Bindings) == 0 {
		r.log.Warn("the queue did not exist: declared it with no binding, so nothing arrives until it is bound to the relay's exchange "+
			"(set Config.Bindings, or check Config.Queue; Config.FailFast refuses a missing queue instead)", "queue", r.cfg.Queue)
	}
	if err := ch.Qos(r.cfg.Prefetch, 0, false); err != nil {
		return fmt.Errorf("inboxrabbitmq: setting prefetch: %w", err)
	}
	// Not ConsumeWithContext: cancelling the consumer (basic.cancel) at
	// shutdown would make the next registered consumer active while this
	// channel still holds unacknowledged deliveries, which the broker
	// requeues only when the channel closes: the next consumer would
	// apply an aggregate's later messages before them. The channel is
	// closed (with the connection) after the workers stopped.
	deliveries, err := ch.Consume(r.cfg.Queue, "", false, false, false, false, nil)
	if err != nil {
		return queueErr(fmt.Errorf("consuming queue %q: %w", r.cfg.Queue, err))
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	r.health.OK("consuming", "queue", r.cfg.Queue)
	pool := r.eng.NewPool(r.cfg.Workers, r.cfg.Prefetch)
	defer pool.Stop() // before the connection closes: what was stored is acked
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-closed:
			if e == nil {
				return errors.New("inboxrabbitmq: channel closed")
			}
			return fmt.Errorf("inboxrabbitmq: channel closed: %w", e)
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("inboxrabbitmq: delivery channel closed")
			}
			if err := pool.Submit(ctx, r.delivery(ch, d)); err != nil {
				return nil // ctx ended
			}
		}
	}
}

// queueErr marks the broker's refusals that no retry fixes, with what to
// do about each.
func queueErr(err error) error {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return fmt.Errorf("inboxrabbitmq: %w", err)
	}
	switch ae.Code {
	case amqp.PreconditionFailed:
		return fmt.Errorf("%w: %w (the queue exists with other arguments, e.g. declared without %s: delete it and let the runner declare it)", ErrQueue, err, ArgSingleActiveConsumer)
	case amqp.NotFound:
		return fmt.Errorf("%w: %w: %w (declare the exchange first: outbox rabbitmq declare --exchange NAME)", ErrQueue, ErrNotFound, err)
	case amqp.AccessRefused:
		return fmt.Errorf("%w: %w (the user may not declare, bind or consume the queue)", ErrQueue, err)
	}
	return fmt.Errorf("inboxrabbitmq: %w", err)
}

// delivery adapts d for the engine: its ack is sent on ch after the
// outcome is stored.
func (r *Runner) delivery(ch *amqp.Channel, d amqp.Delivery) *consume.Delivery {
	msg := Message(d)
	cd := &consume.Delivery{Msg: msg, Ref: &d,
		Where: []any{"delivery_tag", d.DeliveryTag, "redelivered", d.Redelivered}}
	if r.cfg.ContextFor != nil {
		cd.Ctx = r.cfg.ContextFor(r.eng.Base(), &d)
	}
	tag := d.DeliveryTag
	cd.Ack = func() {
		if err := ch.Ack(tag, false); err != nil {
			// The channel is gone: the broker requeued the delivery and
			// sends it again; the inbox recognises it.
			r.log.Debug("ack failed; the message comes again", "delivery_tag", tag, "err", err)
			return
		}
		r.acks.Add(1)
	}
	return cd
}

type observer struct{ r *Runner }

func (o observer) result(d *consume.Delivery) Result {
	del := d.Ref.(*amqp.Delivery)
	res := Result{Queue: o.r.cfg.Queue, MessageID: d.Msg.ID, DeliveryTag: del.DeliveryTag, Redelivered: del.Redelivered}
	switch v := del.Headers["x-delivery-count"].(type) {
	case int64:
		res.DeliveryCount = v
	case int32:
		res.DeliveryCount = int64(v)
	case int:
		res.DeliveryCount = int64(v)
	}
	return res
}

func (o observer) Processed(d *consume.Delivery, c consume.Result) {
	if o.r.cfg.Observer == nil {
		return
	}
	res := o.result(d)
	res.Outcome, res.Parked, res.Invalid, res.Attempts, res.Duration = c.Outcome, c.Parked, c.Invalid, c.Attempts, c.Duration
	o.r.cfg.Observer.Processed(res)
}

func (o observer) AttemptFailed(d *consume.Delivery, attempt int, err error) {
	if o.r.cfg.Observer != nil {
		o.r.cfg.Observer.AttemptFailed(o.r.cfg.Queue, d.Msg.ID, attempt, err)
	}
}

// redact replaces the URL's password in err's text (amqp091 errors may
// quote the URL).
func redact(err error, url string) error {
	u, perr := amqp.ParseURI(url)
	if perr != nil || u.Password == "" {
		return err
	}
	return redacted{err: err, secret: u.Password}
}

type redacted struct {
	err    error
	secret string
}

func (e redacted) Error() string { return strings.ReplaceAll(e.err.Error(), e.secret, "xxxxx") }

func (e redacted) Unwrap() error { return e.err }
