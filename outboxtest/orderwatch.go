package outboxtest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/sqloutbox/outbox/relay"
)

// OrderWatch is a relay.Observer that records every order violation the
// relay reports (relay.OrderObserver: a message acknowledged after an
// earlier one of its aggregate failed in the same batch) and forwards
// every call, those of the optional interfaces relay.PartitionObserver,
// relay.ReadinessObserver, relay.PublishObserver and relay.OrderObserver
// included, to the Observer it wraps when that one implements them. Make
// it with WatchOrder; it is safe for concurrent use.
//
// Every relay test of this repository runs its relay under one, so that
// a publisher that lets a message through after an earlier one of its
// aggregate failed fails the test even when the ledger happens to come
// out in order; do the same in tests of a Publisher of your own.
type OrderWatch struct {
	relay.Observer

	mu         sync.Mutex
	violations []relay.Message
}

// WatchOrder wraps next (nil: observe nothing else) in an OrderWatch and
// fails t at cleanup if the relay reported any order violation, naming
// the first few. Register it before the relay's own stop cleanup (call it
// before starting the relay), so that the check runs after the relay
// stopped.
func WatchOrder(t testing.TB, next relay.Observer) *OrderWatch {
	t.Helper()
	if next == nil {
		next = relay.NopObserver{}
	}
	w := &OrderWatch{Observer: next}
	t.Cleanup(func() {
		if v := w.Violations(); len(v) > 0 {
			t.Errorf("the relay reported %d order violations (a message acknowledged after an earlier one of its aggregate failed in the same batch): %s", len(v), DescribeMessages(v))
		}
	})
	return w
}

// Violations returns a copy of the messages reported so far.
func (w *OrderWatch) Violations() []relay.Message {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]relay.Message(nil), w.violations...)
}

// OrderViolation implements relay.OrderObserver: it records m and
// forwards to the wrapped Observer if it implements relay.OrderObserver.
func (w *OrderWatch) OrderViolation(m relay.Message) {
	w.mu.Lock()
	w.violations = append(w.violations, m)
	w.mu.Unlock()
	if oo, ok := w.Observer.(relay.OrderObserver); ok {
		oo.OrderViolation(m)
	}
}

// PartitionMismatch forwards to the wrapped Observer if it implements
// relay.PartitionObserver.
func (w *OrderWatch) PartitionMismatch(err error) {
	if po, ok := w.Observer.(relay.PartitionObserver); ok {
		po.PartitionMismatch(err)
	}
}

// Readiness forwards to the wrapped Observer if it implements
// relay.ReadinessObserver.
func (w *OrderWatch) Readiness(err error) {
	if ro, ok := w.Observer.(relay.ReadinessObserver); ok {
		ro.Readiness(err)
	}
}

// StartPublish forwards to the wrapped Observer if it implements
// relay.PublishObserver; otherwise it returns ctx and no end function.
func (w *OrderWatch) StartPublish(ctx context.Context, msgs []relay.Message) (context.Context, func(error)) {
	if po, ok := w.Observer.(relay.PublishObserver); ok {
		return po.StartPublish(ctx, msgs)
	}
	return ctx, nil
}

// DescribeMessages names up to five of msgs (message ID, outbox id, aggregate),
// and how many more there are.
func DescribeMessages(msgs []relay.Message) string {
	var s []string
	for i, m := range msgs {
		if i == 5 {
			s = append(s, fmt.Sprintf("and %d more", len(msgs)-5))
			break
		}
		s = append(s, fmt.Sprintf("%s (outbox id %d, aggregate %s/%s)", m.MessageID, m.ID, m.AggregateType, m.AggregateID))
	}
	return strings.Join(s, ", ")
}

// Transaction implements relay.TransactionObserver: it forwards to the
// wrapped Observer if it implements it.
func (w *OrderWatch) Transaction(partition int, outcome relay.TransactionOutcome, messages int) {
	if to, ok := w.Observer.(relay.TransactionObserver); ok {
		to.Transaction(partition, outcome, messages)
	}
}

// Reconciled implements relay.TransactionObserver: it forwards to the
// wrapped Observer if it implements it.
func (w *OrderWatch) Reconciled(partition, rows int) {
	if to, ok := w.Observer.(relay.TransactionObserver); ok {
		to.Reconciled(partition, rows)
	}
}

// WALStreaming implements relay.SourceObserver: it forwards to the wrapped
// Observer if it implements relay.SourceObserver.
func (w *OrderWatch) WALStreaming(streaming bool, err error) {
	if so, ok := w.Observer.(relay.SourceObserver); ok {
		so.WALStreaming(streaming, err)
	}
}

// FromSource implements relay.SourceObserver: it forwards to the wrapped
// Observer if it implements relay.SourceObserver.
func (w *OrderWatch) FromSource(source relay.Source, n int) {
	if so, ok := w.Observer.(relay.SourceObserver); ok {
		so.FromSource(source, n)
	}
}

// WALLag implements relay.WALLagObserver: it forwards to the wrapped
// Observer if it implements relay.WALLagObserver.
func (w *OrderWatch) WALLag(l relay.WALLag) {
	if lo, ok := w.Observer.(relay.WALLagObserver); ok {
		lo.WALLag(l)
	}
}

// WALLoss implements relay.WALLossObserver: it forwards to the wrapped
// Observer if it implements relay.WALLossObserver.
func (w *OrderWatch) WALLoss(l *relay.WALLoss) {
	if lo, ok := w.Observer.(relay.WALLossObserver); ok {
		lo.WALLoss(l)
	}
}
