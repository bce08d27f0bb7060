package consume

import (
	"context"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Lease is a time-bounded exclusive right held in the broker (a NATS KV
// key, a Redis key): one holder at a time, for ttl after its last
// successful Acquire or Renew, measured by the broker.
type Lease interface {
	// Acquire takes the lease if nobody holds it; true if taken.
	Acquire(ctx context.Context) (bool, error)
	// Renew extends the lease if this holder still holds it; false if
	// it does not (it expired, and maybe another holder took it).
	Renew(ctx context.Context) (bool, error)
	// Release gives the lease up if this holder holds it.
	Release(ctx context.Context) error
}

// Lead runs session while this process holds l, until ctx ends.
//
// It tries to acquire l every ttl/3. Once acquired, it renews it every
// ttl/3 and runs session with a context that ends when the lease may have
// passed to someone else: when a renewal says it is lost, or when no
// renewal succeeded for ttl·4/5 after the start of the last successful
// one (the broker counts ttl from when it received that call, which is
// later, so this process stops first, by ttl/5 at least, whatever the
// clocks say). session must return soon after its context ends; then Lead
// releases the lease and tries again. A session error is logged and the
// lease released, so that another process may try.
//
// What the session does after its context ended is the runner's concern:
// the runners stop taking new deliveries at once and finish the handler in
// progress, whose outcome the inbox's unique key keeps exactly once should
// the next holder get the same message meanwhile.
func Lead(ctx context.Context, l Lease, ttl time.Duration, log *slog.Logger, session func(ctx context.Context) error) {
	every := ttl / 3
	for ctx.Err() == nil {
		start := time.Now()
		actx, cancel := context.WithTimeout(ctx, every)
		ok, err := l.Acquire(actx)
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Warn("acquiring the consumer lease", "err", err)
		}
		if !ok {
			if !Sleep(ctx, every) {
				return
			}
			continue
		}
		log.Info("consumer lease acquired: this process consumes")
		err = hold(ctx, l, ttl, start, log, session)
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), every)
		if rerr := l.Release(rctx); rerr != nil {
			log.Warn("releasing the consumer lease; it expires by itself", "err", rerr)
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Error("consumer session failed; lease released", "err", err)
			if !Sleep(ctx, every) {
				return
			}
		} else if ctx.Err() == nil {
			log.Warn("consumer lease lost: this process stopped consuming")
		}
	}
}

// hold runs session and renews the lease until session returns; the
// session's context ends when the lease may be lost.
func hold(ctx context.Context, l Lease, ttl time.Duration, since time.Time, log *slog.Logger, session func(context.Context) error) error {
	every := ttl / 3
	safe := ttl - ttl/5
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	deadline := since.Add(safe)
	watchdog := time.AfterFunc(time.Until(deadline), cancel)
	defer watchdog.Stop()
	done := make(chan error, 1)
	go func() { done <- session(sctx) }()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-t.C:
		}
		if sctx.Err() != nil {
			continue // ended; wait for the session to return
		}
		start := time.Now()
		rctx, rcancel := context.WithDeadline(sctx, deadline)
		ok, err := l.Renew(rctx)
		rcancel()
		switch {
		case err != nil:
			log.Warn("renewing the consumer lease", "err", err)
		case !ok:
			cancel()
		default:
			deadline = start.Add(safe)
			if watchdog.Stop() {
				watchdog.Reset(time.Until(deadline))
			}
		}
	}
}

// Sleep waits d (backoff.Stop or a negative d: DefaultRetryMax) or until
// ctx ends; false if ctx ended.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d == backoff.Stop || d < 0 {
		d = DefaultRetryMax
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
