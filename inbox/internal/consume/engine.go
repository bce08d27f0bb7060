// Package consume is what the inbox's broker runners share (inbox/kafka,
// inbox/nats, inbox/rabbitmq, inbox/redis): the engine that stores one
// delivery's outcome through the inbox (retries with backoff, then park
// and hold or skip; the inbox itself retried without limit while the
// database fails), the same for a batch, the pool of workers that keeps
// each aggregate's deliveries in order and acknowledges each one only
// after its outcome is stored, the lease loop of the runners whose broker
// cannot keep one active consumer by itself (NATS, Redis), the serving
// of retry requests and the schema check at start.
//
// A runner adapts its broker to a Delivery (the inbox message, the
// handler's context, an Ack to call once the outcome is stored, and log
// attributes locating it) and reports Results to its own Observer.
package consume

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/sqloutbox/outbox/inbox"
)

// Defaults shared by the runners (each re-exports them under its own
// names).
const (
	DefaultMaxAttempts     = 5
	DefaultRetryInitial    = 100 * time.Millisecond
	DefaultRetryMax        = 5 * time.Second
	DefaultAttemptTimeout  = 30 * time.Second
	DefaultBatchLinger     = time.Millisecond
	DefaultRequestInterval = 5 * time.Second
)

// errAttemptTimeout marks an attempt that outran AttemptTimeout.
var errAttemptTimeout = errors.New("consume: attempt timed out")

// Settings are the settings every runner has.
type Settings struct {
	Inbox          *inbox.Inbox
	DB             *sql.DB
	Handler        func(ctx context.Context, tx *sql.Tx, msg inbox.Message) error
	MaxAttempts    int
	Backoff        func() backoff.BackOff
	AttemptTimeout time.Duration
	OnFailure      inbox.FailurePolicy
	BatchSize      int
	BatchLinger    time.Duration
	// RequestInterval: how often retry requests are served; negative never.
	RequestInterval time.Duration
	Logger          *slog.Logger
	// AfterStore names the failpoint (internal/failpoint, for the
	// process-kill tests) a Pool hits after storing a delivery's or a
	// batch's outcome, before its Ack: "inboxnats/after-store".
	AfterStore string
}

// WithDefaults fills the zero settings with the defaults above.
func (s Settings) WithDefaults() Settings {
	if s.MaxAttempts == 0 {
		s.MaxAttempts = DefaultMaxAttempts
	}
	if s.Backoff == nil {
		s.Backoff = DefaultBackoff
	}
	if s.AttemptTimeout == 0 {
		s.AttemptTimeout = DefaultAttemptTimeout
	}
	if s.BatchLinger == 0 {
		s.BatchLinger = DefaultBatchLinger
	}
	if s.RequestInterval == 0 {
		s.RequestInterval = DefaultRequestInterval
	}
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	return s
}

// DefaultBackoff is exponential from DefaultRetryInitial to
// DefaultRetryMax, ±20 % jitter, no elapsed-time limit.
func DefaultBackoff() backoff.BackOff {
	return backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(DefaultRetryInitial),
		backoff.WithMaxInterval(DefaultRetryMax),
		backoff.WithRandomizationFactor(0.2),
		backoff.WithMaxElapsedTime(0))
}

// Validate returns an error wrapping invalid for a missing Inbox, DB or
// Handler, a MaxAttempts below 1, an unknown OnFailure, a BatchSize
// outside 0..inbox.MaxBatch or a negative BatchLinger. Call it after
// WithDefaults.
func (s Settings) Validate(invalid error) error {
	switch {
	case s.Inbox == nil || s.DB == nil || s.Handler == nil:
		return fmt.Errorf("%w: Inbox, DB and Handler are required", invalid)
	case s.MaxAttempts < 1:
		return fmt.Errorf("%w: MaxAttempts %d is below 1", invalid, s.MaxAttempts)
	case s.OnFailure != inbox.ParkAndHold && s.OnFailure != inbox.SkipAfterPark:
		return fmt.Errorf("%w: unknown OnFailure %d", invalid, s.OnFailure)
	case s.BatchSize < 0 || s.BatchSize > inbox.MaxBatch:
		return fmt.Errorf("%w: BatchSize %d, want 0 to %d", invalid, s.BatchSize, inbox.MaxBatch)
	case s.BatchLinger < 0:
		return fmt.Errorf("%w: negative BatchLinger %s", invalid, s.BatchLinger)
	}
	return nil
}

// Delivery is one message as a runner received it.
type Delivery struct {
	// Msg is the inbox message.
	Msg inbox.Message
	// Ctx is the handler's context (values only: the trace the relay's
	// headers carried); nil: the engine's base context.
	Ctx context.Context
	// Ack, if set, is called by the Pool once the outcome is stored.
	Ack func()
	// Where are slog attributes locating the delivery (stream, sequence;
	// not the message ID, which the engine adds, nor what the runner's
	// logger has already).
	Where []any
	// Ref is the runner's own (its broker's message), for its Observer.
	Ref any
}

// attrs are the log attributes of d (Where and the message ID) and kv,
// in a slice of their own.
func (d *Delivery) attrs(kv ...any) []any {
	out := make([]any, 0, len(d.Where)+2+len(kv))
	out = append(out, d.Where...)
	out = append(out, "message_id", d.Msg.ID)
	return append(out, kv...)
}

// Result is one delivery's stored outcome.
type Result struct {
	// Outcome is the inbox's (Applied, Duplicate or Held); 0 when Parked
	// or Invalid.
	Outcome inbox.Outcome
	// Parked: every attempt failed and the message was parked.
	Parked bool
	// Invalid: the inbox refused to store the message; passed over.
	Invalid bool
	// Attempts: handler attempts, failed ones included.
	Attempts int
	// Duration of the last attempt's inbox call (0 when parked).
	Duration time.Duration
}

// Observer hears each delivery's outcome and failed attempt; called
// from the workers concurrently, it must not block.
type Observer interface {
	Processed(d *Delivery, r Result)
	AttemptFailed(d *Delivery, attempt int, err error)
}

// Counters are an engine's counts (deliveries, not messages).
type Counters struct {
	Applied, Duplicates, Held, Parked, HandlerErrors, StoreErrors, Invalid, Batches int64
}

// Engine stores deliveries' outcomes through the inbox.
type Engine struct {
	s    Settings
	log  *slog.Logger
	obs  Observer
	base context.Context

	applied, duplicates, held, parked, handlerErrs, storeErrs, invalid, batches atomic.Int64
}

// NewEngine returns an engine for s (with its defaults applied), logging
// to log and reporting to obs (nil: nobody). base is the context whose
// values every handler gets; it should never be cancelled (the engine
// waits for a handler in progress rather than cancelling it).
func NewEngine(s Settings, log *slog.Logger, obs Observer) *Engine {
	if obs == nil {
		obs = nopObserver{}
	}
	return &Engine{s: s, log: log, obs: obs, base: context.Background()}
}

// SetBase sets the context whose values every handler's context has
// (Run's, without its cancellation). Call it before the first delivery.
func (e *Engine) SetBase(ctx context.Context) { e.base = context.WithoutCancel(ctx) }

// Base returns the handlers' base context.
func (e *Engine) Base() context.Context { return e.base }

// Settings returns the engine's settings.
func (e *Engine) Settings() Settings { return e.s }

// Counters returns the counts so far.
func (e *Engine) Counters() Counters {
	return Counters{Applied: e.applied.Load(), Duplicates: e.duplicates.Load(), Held: e.held.Load(),
		Parked: e.parked.Load(), HandlerErrors: e.handlerErrs.Load(), StoreErrors: e.storeErrs.Load(),
		Invalid: e.invalid.Load(), Batches: e.batches.Load()}
}

type nopObserver struct{}

func (nopObserver) Processed(*Delivery, Result)         {}
func (nopObserver) AttemptFailed(*Delivery, int, error) {}

// Check checks the inbox schema before a runner starts: a schema error
// (inbox.ErrSchemaMissing, ErrSchemaOutdated, ErrSchemaTooNew) is
// returned wrapped with prefix; any other error (the database cannot be
// reached) is logged and nil returned: the runner retries the database
// like any outage.
func (e *Engine) Check(ctx context.Context, prefix string) error {
	err := e.s.Inbox.Check(ctx, e.s.DB)
	if err == nil {
		return nil
	}
	if errors.Is(err, inbox.ErrSchemaMissing) || errors.Is(err, inbox.ErrSchemaOutdated) || errors.Is(err, inbox.ErrSchemaTooNew) {
		return fmt.Errorf("%s: %w", prefix, err)
	}
	e.log.Warn("inbox schema not checked at start; the database is retried", "err", err)
	return nil
}

// ServeRequests serves the inbox's retry requests every RequestInterval
// until ctx ends (never with a negative RequestInterval). Each handler
// has AttemptTimeout; one in progress when ctx ends is cancelled (its
// transaction rolls back, the request stays and is served later).
func (e *Engine) ServeRequests(ctx context.Context) {
	if e.s.RequestInterval < 0 {
		return
	}
	t := time.NewTicker(e.s.RequestInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := e.s.Inbox.ServeRequests(ctx, e.s.DB, e.boundedHandler)
		if n > 0 {
			e.log.Info("retry requests served", "applied", n)
		}
		if err != nil && ctx.Err() == nil {
			e.log.Warn("serving retry requests", "applied", n, "err", err)
		}
	}
}

// boundedHandler is the handler with AttemptTimeout as its deadline, for
// the retries the engine runs outside a delivery (retry requests).
func (e *Engine) boundedHandler(ctx context.Context, tx *sql.Tx, msg inbox.Message) error {
	ctx, cancel := e.attemptCtx(ctx)
	defer cancel()
	return e.s.Handler(ctx, tx, msg)
}

// Retry runs inbox.Inbox.Retry with the engine's handler.
func (e *Engine) Retry(ctx context.Context, f inbox.ParkedFilter) (int, error) {
	return e.s.Inbox.Retry(ctx, e.s.DB, f, e.s.Handler)
}

// wait sleeps d or until stop is closed; false if stopped.
func wait(stop <-chan struct{}, d time.Duration) bool {
	if d == backoff.Stop || d < 0 {
		d = DefaultRetryMax
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-stop:
		return false
	case <-t.C:
		return true
	}
}

func (e *Engine) attemptCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if e.s.AttemptTimeout > 0 {
		return context.WithTimeout(ctx, e.s.AttemptTimeout)
	}
	return ctx, func() {}
}

func (e *Engine) ctxOf(d *Delivery) context.Context {
	if d.Ctx != nil {
		return d.Ctx
	}
	return e.base
}

// Process stores d's outcome: applied, duplicate, held or parked. It
// returns false, with nothing stored by it, if stop was closed before an
// outcome could be stored (a database outage, or retries interrupted):
// the delivery stays unacknowledged and the broker delivers it again.
// tried and lastErr are the attempts already made (in a batch) and the
// last one's error.
func (e *Engine) Process(stop <-chan struct{}, d *Delivery, tried int, lastErr error) bool {
	msg := d.Msg
	ctx := e.ctxOf(d)
	retry := e.s.Backoff()
	var storeWait backoff.BackOff
	attempt := tried
	if tried > 0 && (attempt >= e.s.MaxAttempts || errors.Is(lastErr, inbox.ErrPermanent)) {
		return e.park(stop, d, attempt, lastErr)
	}
	for {
		attempt++
		var herr error
		late := false // the handler returned after its deadline
		fn := func(ctx context.Context, tx *sql.Tx) (err error) {
			defer func() { herr = err }()
			err = e.s.Handler(ctx, tx, msg)
			late = ctx.Err() != nil
			return err
		}
		start := time.Now()
		actx, cancel := e.attemptCtx(ctx)
		outcome, err := e.s.Inbox.Handle(actx, e.s.DB, msg, fn)
		cancel()
		dur := time.Since(start)
		if err == nil {
			e.count(outcome)
			if outcome == inbox.Held && e.s.OnFailure == inbox.SkipAfterPark {
				e.heal(d)
			}
			e.obs.Processed(d, Result{Outcome: outcome, Attempts: attempt, Duration: dur})
			return true
		}
		if errors.Is(err, inbox.ErrInvalidMessage) {
			// Never storable: waiting would stop the aggregate forever.
			e.invalid.Add(1)
			e.log.Error("message cannot be stored by the inbox; passed over", d.attrs("err", err)...)
			e.obs.Processed(d, Result{Invalid: true, Attempts: attempt})
			return true
		}
		if herr == nil && !errors.Is(err, inbox.ErrHandler) && late {
			// The handler ignored its context and returned after its
			// AttemptTimeout, so the commit was refused: a failed
			// attempt, not an outage of the inbox (which is retried
			// without limit).
			herr = fmt.Errorf("%w: attempt exceeded AttemptTimeout %s: %w", errAttemptTimeout, e.s.AttemptTimeout, err)
		}
		if herr == nil && !errors.Is(err, inbox.ErrHandler) {
			// The inbox failed, not the handler: retry without limit.
			e.storeErrs.Add(1)
			attempt--
			if storeWait == nil {
				storeWait = e.s.Backoff()
			}
			e.log.Warn("inbox failed; retrying", d.attrs("err", err)...)
			if !wait(stop, storeWait.NextBackOff()) {
				return false
			}
			continue
		}
		storeWait = nil
		if herr == nil {
			herr = err // a panic, recovered by the inbox
		}
		lastErr = herr
		e.handlerErrs.Add(1)
		e.obs.AttemptFailed(d, attempt, herr)
		if attempt >= e.s.MaxAttempts || errors.Is(herr, inbox.ErrPermanent) {
			break
		}
		e.log.Info("handler failed; retrying", d.attrs("attempt", attempt, "err", herr)...)
		if !wait(stop, retry.NextBackOff()) {
			return false
		}
	}
	return e.park(stop, d, attempt, lastErr)
}

// ProcessBatch stores the outcome of every delivery of ds: the batch
// through inbox.Inbox.HandleBatch, then each delivery it left, in order,
// through Process; a batch that fails as a whole (the inbox, or its
// AttemptTimeout) goes delivery by delivery through Process. It returns false, as
// Process does, if stop was closed first; the deliveries before the one
// interrupted have their outcomes stored (done reports how many).
func (e *Engine) ProcessBatch(stop <-chan struct{}, ds []*Delivery) (done int, ok bool) {
	msgs := make([]inbox.Message, len(ds))
	byID := make(map[string]*Delivery, len(ds))
	for i, d := range ds {
		msgs[i] = d.Msg
		if d.Ctx != nil {
			byID[d.Msg.ID] = d
		}
	}
	fn := func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
		if d := byID[m.ID]; d != nil {
			// The delivery's values (its trace), the batch's deadline.
			ctx = mergeValues(ctx, d.Ctx)
		}
		return e.s.Handler(ctx, tx, m)
	}
	start := time.Now()
	actx, cancel := e.attemptCtx(e.base)
	res, err := e.s.Inbox.HandleBatch(actx, e.s.DB, msgs, fn)
	cancel()
	if err != nil {
		// The inbox failed, or the batch ran out of its AttemptTimeout (a
		// slow handler among 64): nothing of it committed. Each delivery
		// goes alone, in order, with its own deadline: a slow handler is
		// then a failed attempt of its own message (retried, parked), and
		// an outage is waited out per message.
		e.storeErrs.Add(1)
		e.log.Warn("batch failed; its messages are handled one at a time", ds[0].attrs("messages", len(ds), "err", err)...)
		for i, d := range ds {
			if !e.Process(stop, d, 0, nil) {
				return i, false
			}
		}
		return len(ds), true
	}
	dur := time.Since(start)
	e.batches.Add(1)
	for i, d := range ds {
		o := res[i]
		if o.Outcome != 0 {
			e.count(o.Outcome)
			if o.Outcome == inbox.Held && e.s.OnFailure == inbox.SkipAfterPark {
				e.heal(d)
			}
			e.obs.Processed(d, Result{Outcome: o.Outcome, Attempts: 1, Duration: dur})
			continue
		}
		tried := 0
		if errors.Is(o.Err, inbox.ErrHandler) {
			tried = 1
			e.handlerErrs.Add(1)
			e.obs.AttemptFailed(d, 1, o.Err)
		}
		if !e.Process(stop, d, tried, o.Err) {
			return i, false
		}
	}
	return len(ds), true
}

// park parks d's message with the number of failed attempts and applies
// OnFailure: each step retried alone while the database fails, each call
// bounded by AttemptTimeout.
func (e *Engine) park(stop <-chan struct{}, d *Delivery, attempts int, cause error) bool {
	msg := d.Msg
	tries := 0
	ok, invalid := e.retryStore(stop, d, "parking", func(ctx context.Context) error {
		tries++
		if tries > 1 {
			// ParkAfter adds attempts to a parked row, and a try that
			// failed on its deadline may have committed: a message that
			// is parked now was parked by that try (only this worker
			// handles the aggregate), so parking it again would count
			// its attempts twice.
			ps, err := e.s.Inbox.ListParked(ctx, e.s.DB, inbox.ParkedFilter{ID: msg.ID, Limit: 1})
			if err != nil {
				return err
			}
			if len(ps) == 1 && !ps[0].Held {
				return nil
			}
		}
		return e.s.Inbox.ParkAfter(ctx, e.s.DB, msg, cause, attempts)
	})
	if !ok {
		return false
	}
	if invalid {
		return true
	}
	if e.s.OnFailure == inbox.SkipAfterPark {
		// Parked just now by the worker that alone handles the
		// aggregate: nothing of it is held behind it yet. Should the
		// process die before the skip, the next delivery of the
		// aggregate is stored Held and heal skips it then.
		if ok, _ := e.retryStore(stop, d, "skipping the parked message", func(ctx context.Context) error {
			_, err := e.s.Inbox.Skip(ctx, e.s.DB, inbox.ParkedFilter{ID: msg.ID})
			if errors.Is(err, inbox.ErrNothingMatched) {
				return nil // processed or skipped meanwhile
			}
			return err
		}); !ok {
			return false
		}
	}
	e.parked.Add(1)
	e.log.Warn("message parked", d.attrs("aggregate_type", msg.AggregateType,
		"aggregate_id", msg.AggregateID, "attempts", attempts, "err", cause, "skipped", e.s.OnFailure == inbox.SkipAfterPark)...)
	e.obs.Processed(d, Result{Parked: true, Attempts: attempts})
	return true
}

// retryStore runs op with a deadline of AttemptTimeout until it succeeds,
// waiting with Backoff while the database fails; ok false if stop was
// closed first; invalid if the inbox refused the message
// (ErrInvalidMessage: logged, counted, passed over).
func (e *Engine) retryStore(stop <-chan struct{}, d *Delivery, what string, op func(ctx context.Context) error) (ok, invalid bool) {
	wt := e.s.Backoff()
	for {
		ctx, cancel := e.attemptCtx(e.base)
		err := op(ctx)
		cancel()
		if err == nil {
			return true, false
		}
		if errors.Is(err, inbox.ErrInvalidMessage) {
			e.log.Error(what+": the inbox cannot store the message; passed over", d.attrs("err", err)...)
			e.invalid.Add(1)
			return true, true
		}
		e.storeErrs.Add(1)
		e.log.Warn(what+" failed; retrying", d.attrs("err", err)...)
		if !wait(stop, wt.NextBackOff()) {
			return false, false
		}
	}
}

// heal, with SkipAfterPark, skips what holds d's aggregate: a message
// parked by a process that died before its skip (nothing else is parked
// under that policy). The skip records a retry request for the
// aggregate, and ServeRequests applies d and the rest of it, in order.
func (e *Engine) heal(d *Delivery) {
	msg := d.Msg
	if msg.AggregateType == "" && msg.AggregateID == "" {
		return
	}
	ctx, cancel := e.attemptCtx(e.base)
	defer cancel()
	n, err := e.s.Inbox.Skip(ctx, e.s.DB, inbox.ParkedFilter{AggregateType: msg.AggregateType, AggregateID: msg.AggregateID})
	switch {
	case err == nil:
		e.log.Warn("a parked message held its aggregate under SkipAfterPark: skipped; its held messages are applied by the next retry-request round",
			d.attrs("aggregate_type", msg.AggregateType, "aggregate_id", msg.AggregateID, "skipped", n)...)
	case errors.Is(err, inbox.ErrNothingMatched):
	default:
		e.log.Warn("skipping what holds the aggregate under SkipAfterPark failed; `outbox inbox parked skip` releases it",
			d.attrs("err", err)...)
	}
}

func (e *Engine) count(o inbox.Outcome) {
	switch o {
	case inbox.Duplicate:
		e.duplicates.Add(1)
	case inbox.Held:
		e.held.Add(1)
	default:
		e.applied.Add(1)
	}
}

// mergeValues is ctx (its deadline and cancellation) with the values of
// vals looked up first.
func mergeValues(ctx, vals context.Context) context.Context {
	return valuesCtx{Context: ctx, vals: vals}
}

type valuesCtx struct {
	context.Context
	vals context.Context
}

func (c valuesCtx) Value(key any) any {
	if v := c.vals.Value(key); v != nil {
		return v
	}
	return c.Context.Value(key)
}
