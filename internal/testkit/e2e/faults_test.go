package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/internal/testkit/e2e"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

var sqlite = testdb.Target{Name: "sqlite", Dialect: "sqlite"}

// memoryFaults is a FaultConfig of an in-memory publisher that
// acknowledges what send lets through, recording it as a broker would.
type memoryBroker struct {
	recs outboxtest.Recorder[relay.Message]
	// send returns the outcome of each message of a batch (nil:
	// acknowledged and recorded); nil send acknowledges everything.
	send atomic.Pointer[func([]relay.Message) []error]
}

func (b *memoryBroker) Publish(ctx context.Context, msgs []relay.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var errs []error
	if send := b.send.Load(); send != nil {
		errs = (*send)(msgs)
	}
	var failed bool
	for i, m := range msgs {
		if errs != nil && errs[i] != nil {
			failed = true
			continue
		}
		b.recs.Add(m)
	}
	if failed {
		return relay.PublishErrors(errs)
	}
	return nil
}

func (b *memoryBroker) config(fault func(context.Context, *testing.T, *e2e.Probe)) e2e.FaultConfig[relay.Message] {
	return e2e.FaultConfig[relay.Message]{
		Publisher: b,
		Fault:     fault,
		WaitForAll: func(ctx context.Context, ids ...string) ([]relay.Message, error) {
			return b.recs.WaitForMessageIDs(ctx, func(m relay.Message) (string, bool) { return m.MessageID, true }, ids...)
		},
		Check: func(rows []outboxtest.Row, msgs []relay.Message) outboxtest.Ledger {
			return outboxtest.Check(rows, outboxtest.MessageIDs(msgs, func(m relay.Message) (string, bool) { return m.MessageID, true }))
		},
		Events: 100,
	}
}

// every fails every message of a batch with err.
func every(err error) *func([]relay.Message) []error {
	f := func(msgs []relay.Message) []error {
		errs := make([]error, len(msgs))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	return &f
}

// outage makes b fail every batch as a whole (each message with a
// *relay.BatchError: no attempt counted) until the relay failed two
// Publish calls.
func (b *memoryBroker) outage(ctx context.Context, t *testing.T, p *e2e.Probe) {
	failed := p.Failed()
	b.send.Store(every(&relay.BatchError{Err: errors.New("outage")}))
	testdb.Eventually(t, ctx, "two failed publishes", func() bool { return p.Failed() >= failed+2 })
	b.send.Store(nil)
}

// TestRunFault: a broker outage in the middle, on an in-memory broker
// whose failures hold nothing back but fail every message: every event
// arrives once, in order, and the report is clean.
func TestRunFault(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	b := &memoryBroker{}
	rep := e2e.RunFault(ctx, t, sqlite, b.config(b.outage))
	if err := rep.Err(); err != nil {
		t.Fatalf("%v\n%s", err, rep)
	}
	if rep.Ledger.Committed < 100 || rep.Failed < 2 || rep.Unresolved == 0 || rep.Ledger.Duplicates != 0 {
		t.Errorf("report %s: want at least 100 events, 2 failed publishes with unresolved messages, no duplicate", rep)
	}
}

// TestRunFaultCatchesDisorder: a broker that, after an outage (a
// backlog: several messages of an aggregate per batch), fails the first
// message of each aggregate in a batch but acknowledges the later ones
// (no hold-back) breaks the order: the report says so, from the ledger
// and from the relay's own order violations. This is what the matrix
// would report of a publisher that lost its hold-back.
func TestRunFaultCatchesDisorder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	b := &memoryBroker{}
	leak := func(msgs []relay.Message) []error {
		errs := make([]error, len(msgs))
		seen := map[string]bool{}
		for i, m := range msgs {
			if !seen[m.AggregateID] {
				seen[m.AggregateID] = true
				errs[i] = fmt.Errorf("transient failure of %s", m.MessageID)
			}
		}
		return errs
	}
	rep := e2e.RunFault(ctx, t, sqlite, b.config(func(ctx context.Context, t *testing.T, p *e2e.Probe) {
		b.outage(ctx, t, p)
		b.send.Store(&leak)
		testdb.Eventually(t, ctx, "an order violation", func() bool { return p.OrderViolations() > 0 })
		b.send.Store(nil)
	}))
	err := rep.Err()
	if !errors.Is(err, outboxtest.ErrOrder) || !errors.Is(err, e2e.ErrRelayOrder) {
		t.Fatalf("report %s: %v; want ErrOrder and ErrRelayOrder", rep, err)
	}
	if errors.Is(err, outboxtest.ErrLost) || errors.Is(err, outboxtest.ErrGhost) || errors.Is(err, e2e.ErrPremise) {
		t.Errorf("report %s: %v; want only the order broken", rep, err)
	}
}

// TestFaultReportDuplicates: duplicates up to the unresolved messages
// are allowed, more are not; a broker that dedupes allows none.
func TestFaultReportDuplicates(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		dups, unresolved int
		dedupes, ok      bool
	}{{0, 0, false, true}, {3, 3, false, true}, {4, 3, false, false}, {1, 3, true, false}, {0, 3, true, true}} {
		rep := e2e.FaultReport{Ledger: outboxtest.Ledger{Duplicates: c.dups}, Unresolved: c.unresolved, Dedupes: c.dedupes}
		if err := rep.Err(); (err == nil) != c.ok || (err != nil && !errors.Is(err, e2e.ErrDuplicates)) {
			t.Errorf("%+v: Err = %v", c, err)
		}
	}
}

// TestRunFaultReportsDeadLetters: a broker that refuses one message for
// good (relay.ErrPermanent, as a publisher misreporting a fault as the
// message's own would make the relay do after its attempts) gets it
// dead-lettered, and its aggregate's later events held behind it: the
// run ends without waiting for them, and the report says lost and
// dead-lettered.
func TestRunFaultReportsDeadLetters(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	b := &memoryBroker{}
	var refused atomic.Bool
	refuseOne := func(msgs []relay.Message) []error {
		errs := make([]error, len(msgs))
		if refused.CompareAndSwap(false, true) {
			errs[0] = fmt.Errorf("%w: refused for good", relay.ErrPermanent)
			for i, m := range msgs[1:] { // held back behind it
				if m.AggregateID == msgs[0].AggregateID {
					errs[i+1] = relay.ErrHeldBack
				}
			}
		}
		return errs
	}
	rep := e2e.RunFault(ctx, t, sqlite, b.config(func(ctx context.Context, t *testing.T, p *e2e.Probe) {
		failed := p.Failed()
		b.send.Store(&refuseOne)
		testdb.Eventually(t, ctx, "a refused message", func() bool { return p.Failed() > failed })
		b.send.Store(nil)
	}))
	err := rep.Err()
	if !errors.Is(err, outboxtest.ErrLost) || !errors.Is(err, e2e.ErrDeadLettered) || rep.DeadLettered != 1 {
		t.Fatalf("report %s: %v; want one dead letter and its aggregate lost", rep, err)
	}
	if errors.Is(err, outboxtest.ErrOrder) || errors.Is(err, e2e.ErrRelayOrder) || errors.Is(err, outboxtest.ErrGhost) {
		t.Errorf("report %s: %v; want only the loss", rep, err)
	}
}
