package relay

import (
	"fmt"
	"sync"
	"time"
)

// maxUnroutableRoutes bounds the routes the unroutable policy tracks at
// once. Past it, a newly failing route is not tracked (and so never
// dead-lettered by the policy) until a tracked one recovers.
const maxUnroutableRoutes = 10_000

// unroutable carries Config.DeadLetterUnroutableAfter: for each route (see
// routeOf) that failed with ErrUnavailable, since when it has failed
// without one of its messages acknowledged; and when the publisher last
// acknowledged any message. It lives in memory: a restarted relay starts
// every route's clock again.
type unroutable struct {
	after time.Duration // 0: the policy is off
	now   func() time.Time

	mu      sync.Mutex
	since   map[string]time.Time
	lastAck time.Time
}

func newUnroutable(after time.Duration, now func() time.Time) *unroutable {
	return &unroutable{after: after, now: now, since: map[string]time.Time{}}
}

// routeOf names the route of m as the policy tracks it: its Topic, or,
// for a message the publisher routes by itself (Topic ""), its aggregate
// type and event type, which is all a publisher routes such a message by.
func routeOf(m Message) string {
	if m.Topic != "" {
		return "topic " + m.Topic
	}
	return "aggregate type " + m.AggregateType + ", event type " + m.EventType
}

// acked records acknowledged messages: their routes work again.
func (u *unroutable) acked(msgs []Message) {
	if u.after <= 0 || len(msgs) == 0 {
		return
	}
	now := u.now()
	u.mu.Lock()
	defer u.mu.Unlock()
	u.lastAck = now
	for i := range msgs {
		delete(u.since, routeOf(msgs[i]))
	}
}

// failed records that m failed with ErrUnavailable (cause) and returns
// the error to dead-letter it with (wrapping ErrPermanent and cause) if
// its route has failed for at least the policy's time T and the publisher
// acknowledged a message of another route after the route's first failure
// and within the last T (the broker works now, and refuses this route
// only); else nil. A refusal of every route that lasts T or more leaves
// no recent acknowledgement, so it dead-letters nothing.
func (u *unroutable) failed(m Message, cause error) error {
	if u.after <= 0 {
		return nil
	}
	now := u.now()
	route := routeOf(m)
	u.mu.Lock()
	defer u.mu.Unlock()
	since, ok := u.since[route]
	if !ok {
		if len(u.since) < maxUnroutableRoutes {
			u.since[route] = now
		}
		return nil
	}
	if now.Sub(since) < u.after || !u.lastAck.After(since) || now.Sub(u.lastAck) > u.after {
		return nil
	}
	return fmt.Errorf("%w: %s unavailable for %s while the broker acknowledged other routes (DeadLetterUnroutableAfter %s): %w",
		ErrPermanent, route, now.Sub(since).Round(time.Second), u.after, cause)
}
