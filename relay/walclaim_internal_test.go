package relay

import (
	"context"
	"io"
	"log/slog"
	"testing"
)

// TestWALClaimPartitionBack: a partition left out of one cycle's lease
// set (given up, lost, or, in the exactly-once mode, left unreconciled
// when the trust window ran short: reconcile drops it without an error)
// has its events of that cycle written to the table. When it is back,
// even under the same lease epoch, the next cycle claims from the table
// first, so that those rows go out before later events of their
// aggregates from the stream. Before, only a new epoch did.
func TestWALClaimPartitionBack(t *testing.T) {
	t.Parallel()
	r := &Relay{log: slog.New(slog.NewTextHandler(io.Discard, nil)), batch: 10,
		walLeases: map[int]int64{0: 5, 1: 5}}
	r.wal = newWALReader(WALConfig{Buffer: 10}, "t", `"t"`, "test", r.log)
	r.wal.streaming, r.wal.gap = true, false // an open stream with nothing buffered
	ctx := context.Background()
	if msgs, err := r.walClaim(ctx, leaseSet{epochs: map[int]int64{1: 5}}); err != nil || msgs != nil || r.tableDue {
		t.Fatalf("partition 0 out: %v, %v, table due %v; want nothing, and the stream", msgs, err, r.tableDue)
	}
	if msgs, err := r.walClaim(ctx, leaseSet{epochs: map[int]int64{0: 5, 1: 5}}); err != nil || msgs != nil {
		t.Fatalf("partition 0 back: %v, %v", msgs, err)
	}
	if !r.tableDue {
		t.Fatal("partition 0 back under the same epoch: the next cycle does not claim from the table first")
	}
}
