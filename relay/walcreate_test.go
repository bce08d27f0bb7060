package relay_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/relay"
)

// TestWALCreateRecordsALostSlot: in log-only mode the slot is lost
// (dropped by hand, or a failover to a replica without it) while it holds
// an event no relay has read, and before any relay starts again the
// operator runs `outbox wal create` (relay.CreateWAL), as ErrNoSlot's text
// tells a writer's operator to. The window must be recorded, as when a
// relay finds its slot missing: before the fix CreateWAL left the state
// table's row as it was, the next relay found the slot present, A-2 was
// lost and every relay was ready (found by a helper trying to break the
// WAL source).
func TestWALCreateRecordsALostSlot(t *testing.T) {
	t.Parallel()
	e, wal := logEnv(t)
	first := walSetup(t, e, wal, nil)
	waitStreaming(t, first, wal.Slot)
	first.emit(t, event("A", 1))
	if _, err := first.pub.Wait(first.ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 1 }); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(first.ctx, 10*time.Second)
	defer cancel()
	if err := first.r.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	// Committed while the slot exists (the writer's check passes), never
	// read by a relay.
	first.emit(t, event("A", 2))
	// The slot is lost (no reader holds it: the relay stopped).
	eventually(t, first.ctx, "the slot dropped", func() bool {
		_, err := e.RelayDB.ExecContext(first.ctx, "SELECT pg_drop_replication_slot($1)", wal.Slot)
		return err == nil
	})
	if _, err := relay.CreateWAL(first.ctx, e.Outbox, e.RelayDB, wal); err != nil {
		t.Fatal(err)
	}
	second := walSetup(t, e, wal, nil)
	waitStreaming(t, second, wal.Slot)
	second.emit(t, event("A", 3))
	msgs, err := second.pub.Wait(second.ctx, func(m []relay.Message) bool { return len(order(m, "A")) >= 1 })
	if err != nil {
		t.Fatal(err)
	}
	// The state table is what every relay's Ready, the metric and
	// `outbox wal status` read.
	st, err := relay.ReadWALStatus(second.ctx, e.Outbox, e.RelayDB, wal)
	if err != nil {
		t.Fatal(err)
	}
	if got := order(msgs, "A"); fmt.Sprint(got) != "[A-3]" {
		t.Fatalf("the second relay published %v, want [A-3] (A-2 was in the slot that was dropped)", got)
	}
	if st.Loss == nil || st.Loss.Reason != "missing (dropped)" {
		t.Fatalf("status loss %+v, want the window of the dropped slot", st.Loss)
	}
	eventually(t, second.ctx, "the relay reports the loss", func() bool { return errors.Is(second.r.Ready(), relay.ErrWALLoss) })
}
