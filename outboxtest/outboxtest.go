// Package outboxtest helps test code that emits events: an in-memory
// Publisher that records what the relay publishes, and waits on conditions
// with a deadline instead of sleeps.
//
//	pub := outboxtest.NewPublisher()
//	r, _ := relay.New(ob, db, relay.Config{Publisher: pub}) // ob: the test's *driver.Outbox
//	errc := make(chan error, 1)
//	go func() { errc <- r.Run(ctx) }() // read errc after cancelling ctx: Run's error
//	// ... commit a transaction that emits ...
//	msgs, err := pub.WaitForCount(ctx, 1)
//
// It also holds what the broker test kits (outboxtest/kafkatest,
// relay/nats/natstest, relay/rabbitmq/rabbitmqtest, relay/redis/redistest)
// share, with no broker client in it: [Recorder], the collector their
// consumers record into and tests wait on, and the ledger, [Check], which
// joins the committed rows ([Row]) with the message IDs of what a
// consumer received and reports lost events, ghosts, duplicates and
// per-aggregate order as a [Ledger]. Each kit's Check puts its broker's records in the
// order a consumer of one aggregate sees them and calls it.
package outboxtest

import (
	"context"
	"fmt"
	"sync"

	"github.com/sqloutbox/outbox/relay"
)

// Publisher is an in-memory relay.Publisher. It records every message it
// acknowledges, in publish order, and can be told to fail. The zero value
// is not usable; call NewPublisher. Safe for concurrent use.
type Publisher struct {
	mu      sync.Mutex
	msgs    []relay.Message
	changed chan struct{} // closed and replaced on every change
	fail    func(relay.Message) error
	batches int
}

// ErrHeldBack fails a message because an earlier message of its aggregate
// failed in the same batch. It is relay.ErrHeldBack, the error every
// publisher of this repository holds messages back with, so errors.Is
// matches either name.
var ErrHeldBack = relay.ErrHeldBack

// NewPublisher returns an empty Publisher that acknowledges everything.
func NewPublisher() *Publisher {
	return &Publisher{changed: make(chan struct{})}
}

// FailWith makes Publish fail each message for which fn returns a non-nil
// error (per message, as relay.PublishErrors); nil fn restores success.
// Like an order-keeping broker client, a failed message also fails the
// later messages of its aggregate in the same batch (with ErrHeldBack).
func (p *Publisher) FailWith(fn func(relay.Message) error) {
	p.mu.Lock()
	p.fail = fn
	p.mu.Unlock()
}

// Publish implements relay.Publisher.
func (p *Publisher) Publish(ctx context.Context, msgs []relay.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.batches++
	var errs relay.PublishErrors
	type key struct{ t, id string }
	failed := map[key]bool{}
	for i, m := range msgs {
		if p.fail != nil {
			err := p.fail(m)
			if err == nil && failed[key{m.AggregateType, m.AggregateID}] {
				err = ErrHeldBack
			}
			if err != nil {
				failed[key{m.AggregateType, m.AggregateID}] = true
				if errs == nil {
					errs = make(relay.PublishErrors, len(msgs))
				}
				errs[i] = err
				continue
			}
		}
		m.Payload = append([]byte(nil), m.Payload...)
		p.msgs = append(p.msgs, m)
	}
	close(p.changed)
	p.changed = make(chan struct{})
	if errs != nil {
		return errs
	}
	return nil
}

// Messages returns a copy of the acknowledged messages in publish order
// (duplicates included).
func (p *Publisher) Messages() []relay.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]relay.Message(nil), p.msgs...)
}

// Batches returns how many Publish calls were made.
func (p *Publisher) Batches() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.batches
}

// Wait blocks until cond, called with the acknowledged messages after each
// change, returns true, or ctx ends (then it returns ctx's error and the
// messages so far).
func (p *Publisher) Wait(ctx context.Context, cond func([]relay.Message) bool) ([]relay.Message, error) {
	for {
		p.mu.Lock()
		msgs := append([]relay.Message(nil), p.msgs...)
		ch := p.changed
		p.mu.Unlock()
		if cond(msgs) {
			return msgs, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return msgs, fmt.Errorf("outboxtest: condition not met (%d messages published): %w", len(msgs), ctx.Err())
		}
	}
}

// WaitForCount waits until at least n messages were acknowledged.
func (p *Publisher) WaitForCount(ctx context.Context, n int) ([]relay.Message, error) {
	return p.Wait(ctx, func(m []relay.Message) bool { return len(m) >= n })
}

// WaitForIDs waits until every given message ID was acknowledged.
func (p *Publisher) WaitForIDs(ctx context.Context, ids ...string) ([]relay.Message, error) {
	return p.Wait(ctx, func(msgs []relay.Message) bool {
		seen := make(map[string]bool, len(msgs))
		for _, m := range msgs {
			seen[m.MessageID] = true
		}
		for _, id := range ids {
			if !seen[id] {
				return false
			}
		}
		return true
	})
}
