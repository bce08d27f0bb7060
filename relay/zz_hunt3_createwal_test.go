package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/relay"
)

// TestHunt3CreateWALHidesALostSlot: in log-only mode the slot is lost
// (dropped by hand, or a failover to a replica without it) while it holds
// an event no relay has confirmed; before any relay starts again, the
// operator runs `outbox wal create` (relay.CreateWAL), as ErrNoSlot's text
// tells a writer's operator to. CreateWAL creates a new slot and leaves
// the state table's row as it was (INSERT ... ON CONFLICT DO NOTHING); the
// next relay finds the slot present (slotFound: no loss) and never reports
// the window. The event is lost and every relay is ready.
func TestHunt3CreateWALHidesALostSlot(t *testing.T) {
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
	got := order(msgs, "A")
	lost := true
	for _, id := range got {
		if id == "A-2" {
			lost = false
		}
	}
	if lost && st.Loss == nil {
		t.Fatalf("A-2 was never delivered (second relay published %v) and no loss is recorded: status loss %v, Ready %v", got, st.Loss, second.r.Ready())
	}
}
