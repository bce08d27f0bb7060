package relay_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sqloutbox/outbox/relay"
)

// inOrderBatch returns messages "<agg><n>" of the aggregates in spec, in
// spec's order: inOrderBatch("a1", "b1", "a2") is a1 and a2 of aggregate
// a, b1 of b.
func inOrderBatch(ids ...string) []relay.Message {
	msgs := make([]relay.Message, len(ids))
	for i, id := range ids {
		msgs[i] = relay.Message{ID: int64(i + 1), MessageID: id, AggregateType: "t", AggregateID: id[:1]}
	}
	return msgs
}

var (
	errFlaky = errors.New("flaky broker error")
	errConn  = errors.New("connection lost")
)

// TestPublishInOrder: the outcome of a batch from what send returns per
// message: which messages are sent, and the error returned (nil, one
// whole-batch error, one ErrUnavailable error, or PublishErrors entry by
// entry).
func TestPublishInOrder(t *testing.T) {
	t.Parallel()
	unavailable := fmt.Errorf("%w: no stream", relay.ErrUnavailable)
	permanent := fmt.Errorf("%w: too large", relay.ErrPermanent)
	type want int
	const (
		wantNil want = iota
		wantBatch
		wantUnavailable
		wantPerMessage
	)
	for _, tc := range []struct {
		name string
		ids  []string
		fail map[string]error // send's error per message ID
		// maxInFlight 1 makes "not sent" deterministic across aggregates.
		maxInFlight int
		want        want
		// For wantPerMessage: the error each entry must match ("" nil,
		// "held" ErrHeldBack, "batch" a *BatchError wrapping errConn, else
		// the fail entry of that message).
		entries []string
		// The messages send must never see.
		notSent []string
	}{
		{name: "AllAcknowledged", ids: []string{"a1", "b1", "a2", "c1", "b2"}, want: wantNil},
		{name: "FailureHoldsBackItsAggregateOnly", ids: []string{"a1", "b1", "a2", "a3", "b2"},
			fail: map[string]error{"a2": errFlaky}, want: wantPerMessage,
			entries: []string{"", "", "a2", "held", ""}, notSent: []string{"a3"}},
		{name: "PermanentIsPerMessage", ids: []string{"a1", "a2", "b1"},
			fail: map[string]error{"a1": permanent}, want: wantPerMessage,
			entries: []string{"a1", "held", ""}, notSent: []string{"a2"}},
		// a (a1, a2) is sent first and acknowledged: only b1 and the unsent
		// c1 carry the batch error, so the relay does not send a1, a2 again.
		{name: "BatchErrorFailsTheRest", ids: []string{"a1", "b1", "a2", "c1"}, maxInFlight: 1,
			fail: map[string]error{"b1": &relay.BatchError{Err: errConn}}, want: wantPerMessage,
			entries: []string{"", "batch", "", "batch"}, notSent: []string{"c1"}},
		{name: "WrappedBatchError", ids: []string{"a1", "b1"}, maxInFlight: 1,
			fail: map[string]error{"a1": fmt.Errorf("publishing: %w", &relay.BatchError{Err: errConn})}, want: wantBatch,
			notSent: []string{"b1"}},
		{name: "BatchErrorBeatsPerMessageErrors", ids: []string{"a1", "a2", "b1"}, maxInFlight: 1,
			fail: map[string]error{"a1": errFlaky, "b1": &relay.BatchError{Err: errConn}}, want: wantBatch},
		{name: "AllUnavailableIsOneError", ids: []string{"a1", "a2", "b1"},
			fail: map[string]error{"a1": unavailable, "b1": unavailable}, want: wantUnavailable, notSent: []string{"a2"}},
		{name: "UnavailableAndAcknowledged", ids: []string{"a1", "b1"},
			fail: map[string]error{"a1": unavailable}, want: wantPerMessage, entries: []string{"a1", ""}},
		{name: "UnavailableAndFlaky", ids: []string{"a1", "b1", "b2"},
			fail: map[string]error{"a1": unavailable, "b1": errFlaky}, want: wantPerMessage,
			entries: []string{"a1", "b1", "held"}},
		{name: "AllFlaky", ids: []string{"a1", "b1"},
			fail: map[string]error{"a1": errFlaky, "b1": errFlaky}, want: wantPerMessage, entries: []string{"a1", "b1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			msgs := inOrderBatch(tc.ids...)
			var mu sync.Mutex
			sent := map[string]bool{}
			err := relay.PublishInOrder(context.Background(), msgs, tc.maxInFlight, func(_ context.Context, i int) error {
				mu.Lock()
				sent[msgs[i].MessageID] = true
				mu.Unlock()
				return tc.fail[msgs[i].MessageID]
			})
			for _, id := range tc.notSent {
				if sent[id] {
					t.Errorf("%s was sent", id)
				}
			}
			var pe relay.PublishErrors
			var be *relay.BatchError
			switch tc.want {
			case wantNil:
				if err != nil {
					t.Fatalf("err = %v, want nil", err)
				}
				if len(sent) != len(msgs) {
					t.Fatalf("%d of %d sent", len(sent), len(msgs))
				}
			case wantBatch:
				if !errors.As(err, &be) || !errors.Is(err, errConn) || errors.As(err, &pe) {
					t.Fatalf("err = %v, want a *BatchError wrapping %v", err, errConn)
				}
			case wantUnavailable:
				if !errors.Is(err, relay.ErrUnavailable) || errors.As(err, &pe) || errors.As(err, &be) {
					t.Fatalf("err = %#v, want one error wrapping ErrUnavailable", err)
				}
			case wantPerMessage:
				if !errors.As(err, &pe) || len(pe) != len(msgs) {
					t.Fatalf("err = %v, want PublishErrors of %d", err, len(msgs))
				}
				for i, e := range pe {
					switch w := tc.entries[i]; w {
					case "":
						if e != nil {
							t.Errorf("entry %d (%s) = %v, want nil", i, msgs[i].MessageID, e)
						}
					case "batch":
						if !errors.As(e, &be) || !errors.Is(e, errConn) {
							t.Errorf("entry %d (%s) = %v, want a *BatchError wrapping %v", i, msgs[i].MessageID, e, errConn)
						}
					case "held":
						if !errors.Is(e, relay.ErrHeldBack) || errors.Is(e, relay.ErrUnavailable) || errors.Is(e, relay.ErrPermanent) {
							t.Errorf("entry %d (%s) = %v, want ErrHeldBack alone", i, msgs[i].MessageID, e)
						}
					default:
						if !errors.Is(e, tc.fail[w]) || errors.Is(e, relay.ErrHeldBack) {
							t.Errorf("entry %d (%s) = %v, want %v", i, msgs[i].MessageID, e, tc.fail[w])
						}
					}
				}
			}
		})
	}
}

// TestPublishInOrderOrderAndConcurrency: one aggregate's messages are sent
// one at a time in batch order; different aggregates run concurrently, up
// to maxInFlight and never more.
func TestPublishInOrderOrderAndConcurrency(t *testing.T) {
	t.Parallel()
	var ids []string
	for n := 1; n <= 5; n++ {
		for _, a := range "abcdefghij" {
			ids = append(ids, fmt.Sprintf("%c%d", a, n))
		}
	}
	msgs := inOrderBatch(ids...)
	for _, limit := range []int{0, 1, 3, 10} {
		t.Run(fmt.Sprint("maxInFlight=", limit), func(t *testing.T) {
			t.Parallel()
			bound := max(limit, 1)
			var (
				mu       sync.Mutex
				running  int
				peak     int
				busy     = map[string]bool{} // aggregate -> a send running
				last     = map[string]int{}  // aggregate -> index last sent
				gate     = make(chan struct{})
				gateOnce sync.Once
			)
			err := relay.PublishInOrder(context.Background(), msgs, limit, func(ctx context.Context, i int) error {
				agg := msgs[i].AggregateID
				mu.Lock()
				if busy[agg] {
					mu.Unlock()
					return fmt.Errorf("%s sent while its aggregate had a send running", msgs[i].MessageID)
				}
				if j, ok := last[agg]; ok && j >= i {
					mu.Unlock()
					return fmt.Errorf("%s sent after %s", msgs[i].MessageID, msgs[j].MessageID)
				}
				busy[agg], last[agg] = true, i
				running++
				peak = max(peak, running)
				if running == bound {
					gateOnce.Do(func() { close(gate) })
				}
				mu.Unlock()
				// Hold every send until bound sends ran at once: the bound
				// is reached, and any send beyond it would show in peak.
				select {
				case <-gate:
				case <-ctx.Done():
					return &relay.BatchError{Err: ctx.Err()}
				}
				mu.Lock()
				busy[agg] = false
				running--
				mu.Unlock()
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if peak != bound {
				t.Fatalf("%d sends at once, want exactly the bound %d", peak, bound)
			}
			for _, a := range "abcdefghij" {
				if j := last[string(a)]; msgs[j].MessageID != string(a)+"5" {
					t.Fatalf("aggregate %c: last sent %s, want %c5", a, msgs[j].MessageID, a)
				}
			}
		})
	}
}

// TestPublishInOrderContext: an ended context fails the batch as a whole
// (a *BatchError wrapping ctx's error), before or during the sends, and
// a BatchError cancels the sends still running.
func TestPublishInOrderContext(t *testing.T) {
	t.Parallel()
	msgs := inOrderBatch("a1", "b1", "a2", "b2")
	t.Run("EndedBefore", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var n atomic.Int64
		err := relay.PublishInOrder(ctx, msgs, 2, func(context.Context, int) error { n.Add(1); return nil })
		var be *relay.BatchError
		if !errors.As(err, &be) || !errors.Is(err, context.Canceled) || n.Load() != 0 {
			t.Fatalf("err = %v after %d sends, want a *BatchError wrapping context.Canceled and none", err, n.Load())
		}
	})
	t.Run("EndedDuring", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var n atomic.Int64
		// The first send is acknowledged and cancels ctx: nothing else is
		// sent, and ctx's end decides the rest.
		err := relay.PublishInOrder(ctx, msgs, 1, func(ctx context.Context, i int) error {
			if n.Add(1) == 1 {
				cancel()
				return nil
			}
			return nil
		})
		// The acknowledged message counts; the others are not sent.
		var pe relay.PublishErrors
		if !errors.As(err, &pe) || len(pe) != len(msgs) {
			t.Fatalf("err = %v, want PublishErrors of %d", err, len(msgs))
		}
		for i, e := range pe {
			var be *relay.BatchError
			switch {
			case i == 0 && e != nil:
				t.Errorf("a1, acknowledged: %v", e)
			case i > 0 && (!errors.As(e, &be) || !errors.Is(e, context.Canceled)):
				t.Errorf("%s: %v, want a *BatchError wrapping context.Canceled", msgs[i].MessageID, e)
			}
		}
		if n.Load() != 1 {
			t.Fatalf("%d sends, want 1: nothing is sent after ctx ended", n.Load())
		}
	})
	t.Run("BatchErrorCancelsRunningSends", func(t *testing.T) {
		t.Parallel()
		started := make(chan struct{})
		err := relay.PublishInOrder(context.Background(), msgs, 2, func(ctx context.Context, i int) error {
			if msgs[i].AggregateID == "a" {
				<-started // b's send is waiting for its acknowledgement
				return &relay.BatchError{Err: errConn}
			}
			close(started)
			<-ctx.Done() // the acknowledgement never comes; only the cancel ends it
			return &relay.BatchError{Err: ctx.Err()}
		})
		if !errors.Is(err, errConn) {
			t.Fatalf("err = %v, want the first batch error (%v), not the cancellation it caused", err, errConn)
		}
	})
	t.Run("NoMessagesAndNilSend", func(t *testing.T) {
		t.Parallel()
		if err := relay.PublishInOrder(context.Background(), nil, 1, nil); err != nil {
			t.Fatalf("empty batch: %v", err)
		}
		if err := relay.PublishInOrder(context.Background(), msgs, 1, nil); err == nil {
			t.Fatal("nil send: no error")
		}
	})
}

// ExamplePublishInOrder shows a Publisher for an order-less broker built
// on PublishInOrder: send publishes one message and waits for its
// acknowledgement; a lost connection fails the batch.
func ExamplePublishInOrder() {
	msgs := inOrderBatch("a1", "b1", "a2", "a3")
	err := relay.PublishInOrder(context.Background(), msgs, 16, func(ctx context.Context, i int) error {
		switch msgs[i].MessageID {
		case "a2":
			return errFlaky // a3 is held back, unsent
		}
		return nil // acknowledged
	})
	var pe relay.PublishErrors
	if errors.As(err, &pe) {
		for i, e := range pe {
			fmt.Printf("%s: %v\n", msgs[i].MessageID, e)
		}
	}
	// Output:
	// a1: <nil>
	// b1: <nil>
	// a2: flaky broker error
	// a3: outbox: held back behind a failed message of the same aggregate (message a2 failed: flaky broker error)
}
