package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay"
)

// scriptedPublisher answers each Publish with answer(call, msgs), where
// call counts from 1, and records every message it reports acknowledged.
type scriptedPublisher struct {
	answer func(call int, msgs []relay.Message) error
	calls  atomic.Int64
	mu     sync.Mutex
	acked  []string
}

func (p *scriptedPublisher) Publish(ctx context.Context, msgs []relay.Message) error {
	err := p.answer(int(p.calls.Add(1)), msgs)
	var pe relay.PublishErrors
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case err == nil:
		for _, m := range msgs {
			p.acked = append(p.acked, m.MessageID)
		}
	case errors.As(err, &pe):
		for i, m := range msgs {
			if pe[i] == nil {
				p.acked = append(p.acked, m.MessageID)
			}
		}
	}
	return err
}

// failing returns PublishErrors for msgs that fail each message whose ID
// is in errs with its error, and acknowledge the others.
func failing(msgs []relay.Message, errs map[string]error) relay.PublishErrors {
	pe := make(relay.PublishErrors, len(msgs))
	for i, m := range msgs {
		pe[i] = errs[m.MessageID]
	}
	return pe
}

func (p *scriptedPublisher) ackedIDs() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.acked...)
}

// orderLog is an Observer that records OrderViolation and Failed calls.
type orderLog struct {
	relay.NopObserver
	mu         sync.Mutex
	violations []string
	classes    map[string][]relay.ErrorClass
}

func (o *orderLog) OrderViolation(m relay.Message) {
	o.mu.Lock()
	o.violations = append(o.violations, m.MessageID)
	o.mu.Unlock()
}

func (o *orderLog) Failed(m relay.Message, class relay.ErrorClass, _ error) {
	o.mu.Lock()
	if o.classes == nil {
		o.classes = map[string][]relay.ErrorClass{}
	}
	o.classes[m.MessageID] = append(o.classes[m.MessageID], class)
	o.mu.Unlock()
}

func (o *orderLog) get() (violations []string, classes map[string][]relay.ErrorClass) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := map[string][]relay.ErrorClass{}
	for k, v := range o.classes {
		c[k] = append([]relay.ErrorClass(nil), v...)
	}
	return append([]string(nil), o.violations...), c
}

// TestOrderViolationIsReported: a publisher that acknowledges A-2 after
// A-1 failed in the same batch breaks per-aggregate order; the relay
// reports it to an OrderObserver and logs it at ERROR, and a publisher
// that holds A-2 back (ErrHeldBack) reports nothing.
func TestOrderViolationIsReported(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		second   error // the answer for A-2 in the first batch
		wantViol []string
	}{
		{"AckedBehindFailure", nil, []string{"A-2"}},
		{"HeldBack", relay.ErrHeldBack, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			obs := &orderLog{}
			var logs syncLog
			pub := &scriptedPublisher{answer: func(call int, msgs []relay.Message) error {
				if call > 1 {
					return nil
				}
				return failing(msgs, map[string]error{"A-1": errors.New("produce failed"), "A-2": tc.second})
			}}
			b := setup(t, testdb.All[3], func(c *relay.Config) {
				c.Publisher = pub
				c.Observer = obs
				c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
			})
			b.emit(t, event("A", 1), event("A", 2), event("B", 1))
			eventually(t, b.ctx, "every event sent", func() bool {
				for _, id := range []string{"A-1", "A-2", "B-1"} {
					if s, _ := b.status(t, id); s != 1 {
						return false
					}
				}
				return true
			})
			got, _ := obs.get()
			if fmt.Sprint(got) != fmt.Sprint(tc.wantViol) {
				t.Errorf("order violations %v, want %v", got, tc.wantViol)
			}
			logged := 0
			for _, l := range logs.lines() {
				if l["level"] == "ERROR" && strings.Contains(fmt.Sprint(l["msg"]), "first delivery order may be broken") {
					logged++
					if l["message_id"] != "A-2" || l["aggregate_id"] != "A" {
						t.Errorf("violation logged as %v", l)
					}
				}
			}
			if logged != len(tc.wantViol) {
				t.Errorf("%d violations logged at ERROR, want %d", logged, len(tc.wantViol))
			}
		})
	}
}

// TestBatchErrorEntriesCountNoAttempt: a PublishErrors entry wrapping a
// *relay.BatchError (not sent or unresolved: a deadline, a lost
// connection) leaves its message pending without an attempt, while the
// batch's acknowledged messages are marked sent at once and not re-sent.
func TestBatchErrorEntriesCountNoAttempt(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		obs := &orderLog{}
		pub := &scriptedPublisher{answer: func(call int, msgs []relay.Message) error {
			if call > 2 {
				return nil
			}
			errs := make(relay.PublishErrors, len(msgs))
			for i, m := range msgs {
				if m.AggregateID == "S" { // stalled partition: unresolved twice
					errs[i] = fmt.Errorf("outbox/test: partition stalled: %w", &relay.BatchError{Err: context.DeadlineExceeded})
				}
			}
			return errs
		}}
		b := setup(t, tg, func(c *relay.Config) {
			c.Publisher = pub
			c.Observer = obs
			c.MaxAttempts = 2 // two counted attempts would dead-letter S-1
		})
		b.emit(t, event("S", 1), event("S", 2), event("F", 1))
		eventually(t, b.ctx, "S-2 sent", func() bool { s, _ := b.status(t, "S-2"); return s == 1 })
		for _, id := range []string{"S-1", "S-2", "F-1"} {
			// No failed attempt is counted.
			if s, a := b.status(t, id); s != 1 || a != 0 {
				t.Errorf("%s: status %d attempts %d, want sent with no failed attempt", id, s, a)
			}
		}
		acked := pub.ackedIDs()
		if fmt.Sprint(acked) != "[F-1 S-1 S-2]" {
			t.Errorf("acknowledged %v, want [F-1 S-1 S-2] (F-1 once, not re-sent)", acked)
		}
		viol, classes := obs.get()
		if len(viol) != 0 {
			t.Errorf("order violations %v", viol)
		}
		if fmt.Sprint(classes["S-1"]) != "[batch batch]" {
			t.Errorf("S-1 failures observed as %v, want [batch batch]", classes["S-1"])
		}
		if _, ok := classes["S-2"]; ok {
			t.Errorf("S-2 observed as failed %v; only an aggregate's first failure is", classes["S-2"])
		}
		if pub.calls.Load() < 3 {
			t.Errorf("%d Publish calls, want at least 3", pub.calls.Load())
		}
	})
}
