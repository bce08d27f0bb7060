package relay_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
)

// The WAL source's edges (issue 35's proof list): what a stream carries
// beyond one small event per transaction, and what an operator or a
// migration does to it while it streams. Each case runs on a private
// table and slot with the relay reading the stream, and checks that every
// committed event is published, byte for byte and in order per aggregate,
// and that nothing rolled back is.

// rawInsert inserts one outbox row by hand in tx (not through the
// driver), for transactions the test holds open; it returns the row's id.
func rawInsert(t *testing.T, ctx context.Context, tx *sql.Tx, e *testdb.Env, id, agg string) int64 {
	t.Helper()
	var rowID int64
	if err := tx.QueryRowContext(ctx, "INSERT INTO "+e.Table+" (message_id, aggregate_type, aggregate_id, event_type, topic, partition_key, content_type, payload, headers) "+
		"VALUES ($1::text, 'acct', $2, 't', '', $3, 'text/plain', convert_to($1::text, 'UTF8'), '') RETURNING id",
		id, agg, partition.Of("acct", agg, partition.DefaultCount)).Scan(&rowID); err != nil {
		t.Fatal(err)
	}
	return rowID
}

func TestWALSourceEdges(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// run writes through b (and e) and returns the message IDs it
		// committed, per aggregate in commit order, and the IDs it rolled
		// back.
		run func(t *testing.T, b *bundle, e *testdb.Env, slot string) (want map[string][]string, never []string)
		// check, if set, looks at the published messages too.
		check func(t *testing.T, msgs []relay.Message)
	}{
		{
			// Payloads TOASTed out of line (incompressible, 256 kB) and
			// compressed (900 kB of one byte, under the driver's 1 MiB record
			// limit): an INSERT's tuple carries them
			// whole.
			name: "TOASTed payloads",
			run: func(t *testing.T, b *bundle, _ *testdb.Env, _ string) (map[string][]string, []string) {
				big := outbox.Event{ID: "T-1", AggregateType: "acct", AggregateID: "T", Type: "t", ContentType: "application/octet-stream", Payload: randomBytes(256 << 10)}
				long := outbox.Event{ID: "T-2", AggregateType: "acct", AggregateID: "T", Type: "t", ContentType: "application/octet-stream", Payload: bytes.Repeat([]byte{'z'}, 900<<10)}
				b.emit(t, big)
				b.emit(t, long)
				return map[string][]string{"T": {"T-1", "T-2"}}, nil
			},
			check: func(t *testing.T, msgs []relay.Message) {
				for _, m := range msgs {
					want := 256 << 10
					if m.MessageID == "T-2" {
						want = 900 << 10
					}
					if len(m.Payload) != want {
						t.Errorf("%s: payload of %d bytes, want %d", m.MessageID, len(m.Payload), want)
					}
				}
			},
		},
		{
			// A transaction rolled back, and one whose savepoint with an
			// event was rolled back before it committed another.
			name: "rolled back transactions and savepoints",
			run: func(t *testing.T, b *bundle, e *testdb.Env, _ string) (map[string][]string, []string) {
				ctx := outbox.NewContext(b.ctx)
				tx, err := e.DB.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := outbox.Emit(ctx, event("R", 1)); err != nil {
					t.Fatal(err)
				}
				if err := tx.Rollback(); err != nil {
					t.Fatal(err)
				}
				// Savepoints by hand: the rows are written inside them.
				raw, err := e.RelayDB.BeginTx(b.ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer raw.Rollback()
				for _, q := range []string{"SAVEPOINT a"} {
					if _, err := raw.ExecContext(b.ctx, q); err != nil {
						t.Fatal(err)
					}
				}
				rawInsert(t, b.ctx, raw, e, "S-1", "S")
				if _, err := raw.ExecContext(b.ctx, "ROLLBACK TO SAVEPOINT a"); err != nil {
					t.Fatal(err)
				}
				rawInsert(t, b.ctx, raw, e, "S-2", "S")
				if err := raw.Commit(); err != nil {
					t.Fatal(err)
				}
				b.emit(t, event("R", 2))
				return map[string][]string{"S": {"S-2"}, "R": {"R-2"}}, []string{"R-1", "S-1"}
			},
		},
		{
			// One transaction of 20,000 events over 50 aggregates (written
			// by hand: the driver's default Limits.MaxEvents is 10,000): the
			// reader buffers a transaction whole (past its Buffer), and the
			// loop publishes it in batches.
			name: "a 20,000-event transaction",
			run: func(t *testing.T, b *bundle, e *testdb.Env, _ string) (map[string][]string, []string) {
				want := map[string][]string{}
				var parts []string
				for a := 0; a < 50; a++ {
					agg := fmt.Sprintf("G%02d", a)
					parts = append(parts, fmt.Sprintf("('%s', %d)", agg, partition.Of("acct", agg, partition.DefaultCount)))
					for i := 1; i <= 400; i++ {
						want[agg] = append(want[agg], fmt.Sprintf("%s-%d", agg, i))
					}
				}
				if _, err := e.RelayDB.ExecContext(b.ctx, "INSERT INTO "+e.Table+" (message_id, aggregate_type, aggregate_id, event_type, topic, partition_key, content_type, payload, headers) "+
					"SELECT a.agg || '-' || g, 'acct', a.agg, 't', '', a.p, 'text/plain', convert_to(g::text, 'UTF8'), '' "+
					"FROM generate_series(1, 400) g CROSS JOIN (VALUES "+strings.Join(parts, ", ")+") AS a(agg, p) ORDER BY g, a.agg"); err != nil {
					t.Fatal(err)
				}
				return want, nil
			},
		},
		{
			// L takes the lower id but commits after H: the stream
			// delivers both in commit order, with no floor to wait for (a
			// poller that remembers the last id seen would skip L).
			name: "a low id committed last",
			run: func(t *testing.T, b *bundle, e *testdb.Env, _ string) (map[string][]string, []string) {
				low, err := e.RelayDB.BeginTx(b.ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer low.Rollback()
				high, err := e.RelayDB.BeginTx(b.ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer high.Rollback()
				l := rawInsert(t, b.ctx, low, e, "L-1", "L")
				h := rawInsert(t, b.ctx, high, e, "H-1", "H")
				if l >= h {
					t.Fatalf("ids %d and %d: want the first lower", l, h)
				}
				if err := high.Commit(); err != nil {
					t.Fatal(err)
				}
				if _, err := b.pub.WaitForIDs(b.ctx, "H-1"); err != nil {
					t.Fatal(err)
				}
				if err := low.Commit(); err != nil {
					t.Fatal(err)
				}
				return map[string][]string{"H": {"H-1"}, "L": {"L-1"}}, nil
			},
		},
		{
			// A migration adds a column while the relay streams: pgoutput
			// sends the table's new description, and the stream goes on.
			name: "a column added while streaming",
			run: func(t *testing.T, b *bundle, e *testdb.Env, _ string) (map[string][]string, []string) {
				b.emit(t, event("C", 1))
				if _, err := b.pub.WaitForIDs(b.ctx, "C-1"); err != nil {
					t.Fatal(err)
				}
				if _, err := e.RelayDB.ExecContext(b.ctx, "ALTER TABLE "+e.Table+" ADD COLUMN note text"); err != nil {
					t.Fatal(err)
				}
				b.emit(t, event("C", 2), event("C", 3))
				return map[string][]string{"C": {"C-1", "C-2", "C-3"}}, nil
			},
		},
		{
			// An operator terminates the slot's reader and drops the slot
			// while events are written: the relay recreates the slot,
			// claims what the stream no longer carries, and streams again.
			name: "the slot dropped by an operator",
			run: func(t *testing.T, b *bundle, e *testdb.Env, slot string) (map[string][]string, []string) {
				want := map[string][]string{}
				for i := 1; i <= 60; i++ {
					b.emit(t, event("D", i))
					want["D"] = append(want["D"], fmt.Sprintf("D-%d", i))
					if i == 20 {
						// Terminate and drop in a loop: the walsender may come
						// back between the two.
						eventually(t, b.ctx, "the slot dropped", func() bool {
							_, _ = e.RelayDB.ExecContext(b.ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", slot)
							_, err := e.RelayDB.ExecContext(b.ctx, "SELECT pg_drop_replication_slot($1)", slot)
							return err == nil
						})
					}
				}
				// The relay made the slot again and streams from it.
				waitStreaming(t, b, slot)
				b.emit(t, event("D", 61))
				want["D"] = append(want["D"], "D-61")
				return want, nil
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, wal := walEnv(t)
			b := walSetup(t, e, wal, func(c *relay.Config) { c.PollInterval = time.Second })
			waitStreaming(t, b, wal.Slot)
			want, never := tc.run(t, b, e, wal.Slot)
			msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool {
				for agg, ids := range want {
					if len(dedupe(order(m, agg))) < len(ids) {
						return false
					}
				}
				return true
			})
			if err != nil {
				t.Fatal(err)
			}
			for agg, ids := range want {
				if got := dedupe(order(msgs, agg)); fmt.Sprint(got) != fmt.Sprint(ids) {
					if len(ids) > 10 {
						t.Errorf("%s: %d messages, out of order or missing", agg, len(got))
					} else {
						t.Errorf("%s delivered as %v, want %v", agg, got, ids)
					}
				}
			}
			// What was rolled back: not published by the time every
			// committed event was (the stream delivers in commit order,
			// and a claim never sees an aborted row).
			for _, m := range msgs {
				for _, id := range never {
					if m.MessageID == id {
						t.Errorf("%s was rolled back, and published", id)
					}
				}
			}
			if tc.check != nil {
				tc.check(t, msgs)
			}
			stream, table := b.r.WALCounts()
			t.Logf("%d messages: %d from the stream, %d from the table", len(msgs), stream, table)
		})
	}
}

// dedupe keeps each ID's first delivery (an at-least-once redelivery
// repeats it later): the first-delivery order the relay guarantees.
func dedupe(ids []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.IntN(256))
	}
	return b
}
