package relay

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestAckWALLossKeepsALaterLoss: AckWALLoss read the recorded window and
// then cleared the row's loss columns whatever they held. A relay that
// found the slot missing again between the two (slotCreated widens the
// unacknowledged window to the new slot's start) had its new loss erased
// by the acknowledgement, which returned only the old window: the events
// of the second window were never reported (found by a helper trying to
// break the WAL source). Now the acknowledgement clears only the window it
// read, and otherwise returns ErrWALLoss naming the new one. The
// interleaving is forced with a row lock held by the relay's own
// transaction, in which it runs slotCreated.
func TestAckWALLossKeepsALaterLoss(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.Target{Name: "pgx", Dialect: driver.Postgres}, driver.Config{LogOnly: true})
	d, err := dialectOf(e.Outbox)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	slot := strings.ToLower(testdb.RandomName("outbox_test_"))
	s := &walLogState{table: d.WALLogTable(), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	conn, err := pgconn.Connect(ctx, e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := s.prepare(ctx, conn); err != nil {
		t.Fatal(err)
	}
	lsn := func(v string) pglogrepl.LSN {
		l, err := pglogrepl.ParseLSN(v)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	// The slot recorded at 0/100, then found missing: window 0/100-0/200.
	if err := s.slotFound(ctx, conn, slot, lsn("0/100")); err != nil {
		t.Fatal(err)
	}
	if err := s.slotCreated(ctx, conn, slot, "missing (dropped)", lsn("0/200")); err != nil {
		t.Fatal(err)
	}
	// The relay streams the new slot and records its position.
	if err := s.record(ctx, e.RelayDB, slot, lsn("0/300")); err != nil {
		t.Fatal(err)
	}
	// The operator acknowledges the window while the slot is lost again:
	// the relay's transaction that records the new loss holds the row.
	if _, err := conn.Exec(ctx, "BEGIN; SELECT 1 FROM "+s.table+" WHERE slot_name = "+sqlLiteral(slot)+" FOR UPDATE").ReadAll(); err != nil {
		t.Fatal(err)
	}
	type ack struct {
		loss *WALLoss
		err  error
	}
	acked := make(chan ack, 1)
	go func() {
		l, err := AckWALLoss(ctx, e.Outbox, e.RelayDB, WALConfig{Slot: slot})
		acked <- ack{l, err}
	}()
	schema, _, _ := strings.Cut(e.Table, ".")
	testdb.Eventually(t, ctx, "the acknowledgement read the window and waits on the row", func() bool {
		var n int
		if err := e.RelayDB.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%SET loss_from = NULL%' AND strpos(query, $1) > 0", schema).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	})
	if err := s.slotCreated(ctx, conn, slot, "missing (dropped)", lsn("0/400")); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "COMMIT").ReadAll(); err != nil {
		t.Fatal(err)
	}
	a := <-acked
	if !errors.Is(a.err, ErrWALLoss) || a.loss != nil || !strings.Contains(a.err.Error(), "0/400") {
		t.Errorf("AckWALLoss = %+v, %v; want ErrWALLoss naming the window that grew to 0/400", a.loss, a.err)
	}
	left, err := readWALLoss(ctx, e.RelayDB, s.table, slot)
	if err != nil {
		t.Fatal(err)
	}
	if left == nil || left.From != "0/100" || left.To != "0/400" {
		t.Fatalf("recorded loss after the acknowledgement %+v, want 0/100 to 0/400 kept", left)
	}
	if l, err := AckWALLoss(ctx, e.Outbox, e.RelayDB, WALConfig{Slot: slot}); err != nil || l == nil || l.To != "0/400" {
		t.Fatalf("acknowledging again = %+v, %v; want the window to 0/400", l, err)
	}
}
