package relay_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sqloutbox/outbox/relay"
)

// TestEachAggregate: every message is handed over once, one aggregate's in
// batch order and in one call; no more than maxInFlight calls run at once;
// an ended context starts nothing and says so.
func TestEachAggregate(t *testing.T) {
	t.Parallel()
	var msgs []relay.Message
	for i := range 60 {
		msgs = append(msgs, relay.Message{AggregateType: "order", AggregateID: fmt.Sprint(i % 7), MessageID: fmt.Sprint(i)})
	}
	msgs = append(msgs, relay.Message{AggregateType: "invoice", AggregateID: "0", MessageID: "inv"}) // same ID, other type
	for _, limit := range []int{0, 1, 3, 100} {
		t.Run(fmt.Sprint("maxInFlight=", limit), func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var calls [][]int
			var running, peak atomic.Int64
			err := relay.EachAggregate(context.Background(), msgs, limit, func(idx []int) {
				n := running.Add(1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				mu.Lock()
				calls = append(calls, idx)
				mu.Unlock()
				running.Add(-1)
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(calls) != 8 {
				t.Fatalf("%d calls, want one per aggregate (8)", len(calls))
			}
			seen := map[int]bool{}
			for _, idx := range calls {
				for j, i := range idx {
					if seen[i] {
						t.Fatalf("message %d handed over twice", i)
					}
					seen[i] = true
					if msgs[i].AggregateType != msgs[idx[0]].AggregateType || msgs[i].AggregateID != msgs[idx[0]].AggregateID {
						t.Fatalf("call %v mixes aggregates", idx)
					}
					if j > 0 && idx[j-1] >= i {
						t.Fatalf("call %v not in batch order", idx)
					}
				}
			}
			if len(seen) != len(msgs) {
				t.Fatalf("%d of %d messages handed over", len(seen), len(msgs))
			}
			if p := peak.Load(); p > int64(max(limit, 1)) {
				t.Fatalf("%d calls at once, limit %d", p, limit)
			}
		})
	}
	t.Run("context ended", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var n atomic.Int64
		err := relay.EachAggregate(ctx, msgs, 4, func([]int) { n.Add(1) })
		if err != context.Canceled || n.Load() != 0 {
			t.Fatalf("EachAggregate on an ended context: %v, %d calls; want context.Canceled and none", err, n.Load())
		}
	})
}
