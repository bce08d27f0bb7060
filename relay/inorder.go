package relay

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrHeldBack fails a message that PublishInOrder did not send because an
// earlier message of its aggregate in the same batch failed. The relay
// counts no attempt for it (it is not the aggregate's first failure in
// the batch) and re-sends it after the failed one.
var ErrHeldBack = errors.New("outbox: held back behind a failed message of the same aggregate")

// BatchError is returned (or wrapped) by a PublishInOrder send func for
// an error that fails the whole batch rather than one message: the
// connection lost, the broker unreachable, an acknowledgement that did
// not arrive in time, the context done. Err is the cause. Error returns
// Err's text and Unwrap returns Err, so errors.Is sees through it.
type BatchError struct {
	Err error
}

// Error returns Err's text ("outbox: batch failed" if Err is nil).
func (e *BatchError) Error() string {
	if e.Err == nil {
		return "outbox: batch failed"
	}
	return e.Err.Error()
}

// Unwrap returns Err.
func (e *BatchError) Unwrap() error { return e.Err }

// PublishInOrder is the whole Publish of a Publisher for a broker without
// Kafka's in-partition ordering (relay/nats, relay/rabbitmq and
// relay/redis use it): per-aggregate order, the hold-back after a
// failure, and the classification of the batch's outcome the relay
// expects.
//
// It groups msgs by aggregate (EachAggregate, up to maxInFlight
// aggregates at once; below 1 counts as 1) and sends each aggregate's
// messages one after another in batch order: send(ctx, i) must send
// msgs[i] and return only after the broker acknowledged it (nil) or it
// failed. Once msgs[i] failed, the aggregate's later messages in the
// batch are not sent: their error wraps ErrHeldBack and names the failed
// message. send is called from several goroutines at once (never twice
// at once for one aggregate) and must honour ctx; errors wrapping
// ErrPermanent or ErrUnavailable classify a message as the Publisher
// contract says.
//
// If send returns an error wrapping a *BatchError, the batch fails as a
// whole: the ctx given to every send is cancelled, no further message is
// sent, and PublishInOrder returns that first error (as send returned it,
// so errors.As finds the *BatchError) once every running send returned,
// for every message not acknowledged (see below).
//
// PublishInOrder returns, in this order of precedence:
//   - if ctx ended before it returned (some messages may not have been
//     sent), or send returned an error wrapping a *BatchError: when no
//     message was acknowledged, a *BatchError wrapping ctx.Err(), or that
//     first error as send returned it; otherwise PublishErrors with nil
//     for the acknowledged messages, each failed message's own error, and
//     that error for the messages not sent or unresolved (the relay marks
//     the acknowledged ones sent, so a fault re-sends only what it hit);
//   - nil if every message was acknowledged (also for an empty msgs);
//   - an error wrapping the first message's error that wraps
//     ErrUnavailable, if every message failed with ErrUnavailable or
//     ErrHeldBack: the route is down for the whole batch, and the relay
//     backs off as a whole without counting attempts;
//   - otherwise PublishErrors, of len(msgs), nil for acknowledged entries.
//
// A nil send is an error (not a panic) for non-empty msgs.
func PublishInOrder(ctx context.Context, msgs []Message, maxInFlight int, send func(ctx context.Context, i int) error) error {
	if len(msgs) == 0 {
		return nil
	}
	if send == nil {
		return errors.New("outbox: PublishInOrder: send is nil")
	}
	if err := ctx.Err(); err != nil {
		return &BatchError{Err: err}
	}
	sendCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		once     sync.Once
		batchErr error
	)
	errs := make([]error, len(msgs))
	acked := make([]bool, len(msgs)) // each entry written by one goroutine only
	// EachAggregate's own error is a context that ended, checked below.
	_ = EachAggregate(sendCtx, msgs, maxInFlight, func(idx []int) {
		for n, i := range idx {
			if sendCtx.Err() != nil {
				return // the batch failed as a whole
			}
			err := send(sendCtx, i)
			if err == nil {
				acked[i] = true
				continue
			}
			if be := (*BatchError)(nil); errors.As(err, &be) {
				once.Do(func() {
					batchErr = err
					cancel()
				})
				return
			}
			errs[i] = err
			for _, j := range idx[n+1:] {
				errs[j] = fmt.Errorf("%w (message %s failed: %v)", ErrHeldBack, msgs[i].MessageID, err)
			}
			return
		}
	})
	if err := ctx.Err(); err != nil {
		return partial(acked, errs, &BatchError{Err: err})
	}
	if batchErr != nil {
		return partial(acked, errs, batchErr)
	}
	failed, unavailable := 0, 0
	var firstUnavailable error
	for _, e := range errs {
		if e == nil {
			continue
		}
		failed++
		if errors.Is(e, ErrUnavailable) {
			unavailable++
			if firstUnavailable == nil {
				firstUnavailable = e
			}
		} else if errors.Is(e, ErrHeldBack) {
			unavailable++
		}
	}
	switch {
	case failed == 0:
		return nil
	case unavailable == len(msgs) && firstUnavailable != nil:
		return fmt.Errorf("every message of the batch failed on its route: %w", firstUnavailable)
	}
	return PublishErrors(errs)
}

// partial is PublishInOrder's result when the batch failed as a whole
// with err (which wraps a *BatchError): err itself if no message was
// acknowledged; otherwise PublishErrors with nil for the acknowledged
// messages, each failed message's own error, and err for the rest, so
// the relay marks the acknowledged ones sent instead of sending them
// again, and counts no attempt for the rest.
func partial(acked []bool, errs []error, err error) error {
	some := false
	for _, a := range acked {
		some = some || a
	}
	if !some {
		return err
	}
	pe := make(PublishErrors, len(errs))
	for i := range errs {
		switch {
		case acked[i]:
		case errs[i] != nil:
			pe[i] = errs[i]
		default:
			pe[i] = err
		}
	}
	return pe
}
