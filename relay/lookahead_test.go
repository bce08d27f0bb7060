package relay_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay"
)

// aheadSignal closes ready at the first claim made during a publish that
// returned rows, and counts such claims.
type aheadSignal struct {
	once  sync.Once
	ready chan struct{}
	rows  atomic.Int64
	n     atomic.Int64 // claims ahead that returned rows
	calls atomic.Int64 // every claim ahead
}

func newAheadSignal() *aheadSignal { return &aheadSignal{ready: make(chan struct{})} }

func (a *aheadSignal) hook(n int) {
	a.calls.Add(1)
	if n == 0 {
		return
	}
	a.n.Add(1)
	a.rows.Add(int64(n))
	a.once.Do(func() { close(a.ready) })
}

// wait blocks until a claim ahead returned rows, or ctx ends.
func (a *aheadSignal) wait(ctx context.Context) error {
	select {
	case <-a.ready:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("no claim ran during the publish: %w", ctx.Err())
	}
}

// TestLookaheadClaimsDuringThePublish: while a full batch is published,
// the relay claims the next one (the first Publish returns only once that
// claim has rows), leaving out the rows being published: every event is
// delivered once, in order per aggregate, in batches of 5, 5 and 3. The
// short third batch, claimed ahead, starts no claim ahead of its own.
func TestLookaheadClaimsDuringThePublish(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		ahead := newAheadSignal()
		ctx, cancel := context.WithTimeout(t.Context(), 30e9)
		defer cancel()
		var sizes []int
		var mu sync.Mutex
		pub := &scriptedPublisher{answer: func(call int, msgs []relay.Message) error {
			mu.Lock()
			sizes = append(sizes, len(msgs))
			mu.Unlock()
			if call == 1 {
				return ahead.wait(ctx)
			}
			return nil
		}}
		b := setup(t, tg, func(c *relay.Config) {
			c.Publisher = pub
			c.BatchSize, c.MaxBatchSize = 5, 5
		}, func(r *relay.Relay) { r.OnClaimedAhead(ahead.hook) })
		var evs []outbox.Event
		for i := 1; i <= 4; i++ {
			evs = append(evs, event("A", i), event("B", i), event("C", i))
		}
		evs = append(evs, event("A", 5))
		b.emit(t, evs...)
		eventually(t, b.ctx, "13 events acknowledged", func() bool { return len(pub.ackedIDs()) >= 13 })
		acked := pub.ackedIDs()
		if len(acked) != 13 {
			t.Fatalf("acknowledged %d messages, want 13 (each once): %v", len(acked), acked)
		}
		byAgg := map[string][]string{}
		for _, id := range acked {
			byAgg[id[:1]] = append(byAgg[id[:1]], id)
		}
		for _, agg := range []string{"A", "B", "C"} {
			want := []string{agg + "-1", agg + "-2", agg + "-3", agg + "-4"}
			if agg == "A" {
				want = append(want, "A-5")
			}
			if !slices.Equal(byAgg[agg], want) {
				t.Errorf("%s acknowledged as %v, want %v", agg, byAgg[agg], want)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(sizes, []int{5, 5, 3}) {
			t.Errorf("batches of %v, want 5, 5, 3", sizes)
		}
		if n, calls := ahead.n.Load(), ahead.calls.Load(); n != 2 || calls != 2 {
			t.Errorf("%d claims ahead, %d of them with rows; want 2 (batches 2 and 3) and none after the short batch", calls, n)
		}
	})
}

// TestLookaheadDroppedAfterAFailure: the batch claimed while a batch was
// published is not used when that batch failed in part: A-1 fails (a
// retry is scheduled) and A-2 is held back, so, claimed ahead
// in the second batch, must wait for A-1's retry; B flows.
func TestLookaheadDroppedAfterAFailure(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		ahead := newAheadSignal()
		ctx, cancel := context.WithTimeout(t.Context(), 30e9)
		defer cancel()
		pub := &scriptedPublisher{answer: func(call int, msgs []relay.Message) error {
			if call > 1 {
				return nil
			}
			if err := ahead.wait(ctx); err != nil {
				return err
			}
			return failing(msgs, map[string]error{"A-1": errors.New("produce failed"), "A-2": relay.ErrHeldBack})
		}}
		b := setup(t, tg, func(c *relay.Config) {
			c.Publisher = pub
			c.BatchSize, c.MaxBatchSize = 4, 4
		}, func(r *relay.Relay) { r.OnClaimedAhead(ahead.hook) })
		b.emit(t, event("A", 1), event("B", 1), event("A", 2), event("B", 2),
			event("A", 3), event("B", 3), event("A", 4), event("B", 4))
		eventually(t, b.ctx, "8 events acknowledged", func() bool { return len(pub.ackedIDs()) >= 8 })
		var a, bs []string
		for _, id := range pub.ackedIDs() {
			if id[0] == 'A' {
				a = append(a, id)
			} else {
				bs = append(bs, id)
			}
		}
		if fmt.Sprint(a) != "[A-1 A-2 A-3 A-4]" || fmt.Sprint(bs) != "[B-1 B-2 B-3 B-4]" {
			t.Errorf("acknowledged A as %v and B as %v, want each once in order", a, bs)
		}
		if ahead.n.Load() == 0 {
			t.Error("no batch was claimed ahead: the test proves nothing")
		}
	})
}
