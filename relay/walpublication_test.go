package relay_test

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay"
)

// TestWALPublicationDroppedUnderTheStream: an operator drops the
// publication while the relay streams (DROP PUBLICATION, or `outbox wal
// drop` run against a live relay), and a change of any table of the
// database is committed before the relay creates the publication again.
// The walsender fails at that change with "publication ... does not
// exist" (42704, raised by pgoutput in its change callback), and fails
// there in every read: pgoutput looks the publication up in the catalog as
// of each change, and at that change there was none, whatever exists now
// (PostgreSQL 15; shown in psql: DROP PUBLICATION, an INSERT into any
// table, CREATE PUBLICATION, and every peek of the slot fails at the
// INSERT). Before, the relay created the publication again at each
// reconnect and retried the slot for ever: the rows were claimed from the
// table, and the slot kept the server's WAL from that point until the disk
// was full or an operator dropped it; log-only events were stuck. Now
// such a failure counts as a slot the server cannot read
// (relay/walslot.go): after RecreateUnreadableAfter (1 s here, 30 s by
// default) the relay reads it once more, drops it and creates another.
//
// Table mode: A-2, committed while the publication was missing (its row
// is the failing change), is claimed from the table; nothing is lost, no
// loss is recorded, and A-3 comes from the new slot's stream.
//
// Log-only mode: A-2, a logical decoding message emitted after the failing
// change (an INSERT into a table of the test's own), is in the part of the
// WAL no slot can read any more: the window is recorded as a loss (Ready
// wraps ErrWALLoss), and A-3 comes from the new slot's stream.
func TestWALPublicationDroppedUnderTheStream(t *testing.T) {
	t.Parallel()
	for _, logOnly := range []bool{false, true} {
		t.Run(map[bool]string{false: "table", true: "log-only"}[logOnly], func(t *testing.T) {
			t.Parallel()
			var e *testdb.Env
			var wal relay.WALConfig
			if logOnly {
				e, wal = logEnv(t)
			} else {
				e, wal = walEnv(t)
			}
			wal.Publication = relay.PublicationName(e.Table)
			scratch := e.Table + "_scratch"
			if _, err := e.RelayDB.Exec("CREATE TABLE " + scratch + " (id int)"); err != nil {
				t.Fatal(err)
			}
			logs := &syncLog{}
			b := setupOn(t, e, func(c *relay.Config) {
				c.Source, c.WAL, c.PollInterval = relay.SourceWAL, wal, 30*time.Second
				c.Logger = slog.New(slog.NewJSONHandler(logs, nil))
			}, func(r *relay.Relay) { r.RecreateUnreadableAfter(time.Second) })
			ctx := b.ctx
			waitStreaming(t, b, wal.Slot)
			b.emit(t, event("A", 1))
			if _, err := b.pub.Wait(ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 1 }); err != nil {
				t.Fatal(err)
			}
			if _, err := e.RelayDB.ExecContext(ctx, "DROP PUBLICATION "+wal.Publication); err != nil {
				t.Fatal(err)
			}
			if logOnly {
				// The failing change; in table mode A-2's row is one.
				if _, err := e.RelayDB.ExecContext(ctx, "INSERT INTO "+scratch+" VALUES (1)"); err != nil {
					t.Fatal(err)
				}
			}
			b.emit(t, event("A", 2)) // committed while no publication exists
			var written string
			if err := e.RelayDB.QueryRowContext(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&written); err != nil {
				t.Fatal(err)
			}
			// The slot passes A-2's transaction: recreated after it.
			eventually(t, ctx, "the slot past the transactions committed without a publication", func() bool {
				var past bool
				err := e.RelayDB.QueryRowContext(ctx, "SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1", wal.Slot, written).Scan(&past)
				return err == nil && past
			})
			waitStreaming(t, b, wal.Slot)
			fromStream, _ := b.r.WALCounts()
			b.emit(t, event("A", 3))
			msgs, err := b.pub.Wait(ctx, func(m []relay.Message) bool { return strings.Contains(fmt.Sprint(order(m, "A")), "A-3") })
			if err != nil {
				t.Fatal(err)
			}
			want := "[A-1 A-2 A-3]"
			if logOnly {
				want = "[A-1 A-3]"
			}
			if got := fmt.Sprint(firstDeliveries(order(msgs, "A"))); got != want {
				t.Fatalf("A first delivered as %s, want %s", got, want)
			}
			if now, _ := b.r.WALCounts(); now == fromStream {
				t.Fatalf("A-3 did not come from the stream (%d messages from it before and after)", now)
			}
			recreated := 0
			for _, l := range logs.lines() {
				if strings.HasPrefix(fmt.Sprint(l["msg"]), "replication slot unreadable") {
					recreated++
					if !strings.Contains(fmt.Sprint(l["error"]), "publication") {
						t.Errorf("the recreation's log line does not give the server's error: %v", l)
					}
				}
			}
			if recreated != 1 {
				t.Errorf("slot recreated %d times, want 1", recreated)
			}
			wantRecreationLoss(t, b, wal, logOnly, "does not exist")
		})
	}
}
