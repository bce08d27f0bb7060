package relay_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// TestMySQLClaimTakesRowsCommittedBelowIt is the regression test for the
// MariaDB order defect (docs/guarantees.md, relay/doc.go "Late rows"): a
// claim's read view that does not show an aggregate's earlier row A
// although it shows the later row B. MariaDB builds a read view by walking
// its active-transaction hash without a lock, so a view can list as still
// active a transaction that committed before one it shows (A's writer
// committed, then B's, which was waiting on A's row lock); the claim then
// returned B, and A went out in the next batch. That race cannot be
// brought about on demand; the same view, A missing and B shown, can: A's
// transaction inserts first and commits only after the claim's statement
// has read (the hook between the claim and its late-rows statement). The
// relay must hand out A before B: both in id order when the late-rows
// statement may return as many rows as the claim did, A alone when it
// returns as many as it may (B waits for the next claim). A look can miss
// a row the same way: the relay looks again until a look finds nothing.
func TestMySQLClaimTakesRowsCommittedBelowIt(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		batch int
		// rows, in id order: aggregate and whether it is committed before
		// the claim; the others are committed by the hook before the
		// look commitBefore[i] names (1: the first look after the claim).
		rows        []lateRow
		want        []string // message IDs claimed, in order
		wantLate    int64
		wantLookups int
	}{
		{"both_in_id_order", 10,
			[]lateRow{{"a", "X", 1}, {"b", "X", 0}},
			[]string{"a", "b"}, 1, 2},
		{"late_rows_at_the_limit", 1,
			[]lateRow{{"a", "X", 1}, {"b", "X", 0}},
			[]string{"a"}, 1, 2},
		// The second look's own view misses c1 while it shows c2 (the
		// same race as the claim's): the third look finds c1.
		{"a_look_that_misses_a_row", 10,
			[]lateRow{{"a", "X", 1}, {"c1", "Y", 2}, {"c2", "Y", 1}, {"b", "X", 0}},
			[]string{"a", "c1", "c2", "b"}, 3, 3},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := testdb.New(t, testdb.All[2], driver.Config{})
			e.RelayDB.SetMaxOpenConns(8) // a connection per open transaction, and the claim's
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			insert := fmt.Sprintf("INSERT INTO %s (message_id, aggregate_type, aggregate_id, event_type, topic, partition_key, content_type, payload, headers, created_at, updated_at) "+
				"VALUES (?, 'order', ?, 'created', 't', 0, 'application/json', '{}', '', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))", e.Table)
			open := map[int][]*sql.Tx{} // look -> transactions it commits
			for _, row := range c.rows {
				if row.look == 0 {
					if _, err := e.RelayDB.ExecContext(ctx, insert, row.id, row.agg); err != nil {
						t.Fatal(err)
					}
					continue
				}
				tx, err := e.RelayDB.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = tx.Rollback() })
				if _, err := tx.ExecContext(ctx, insert, row.id, row.agg); err != nil {
					t.Fatal(err)
				}
				open[row.look] = append(open[row.look], tx)
			}

			r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{Publisher: outboxtest.NewPublisher(), Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			looks := 0
			r.OnClaimed(func() {
				looks++
				for _, tx := range open[looks] {
					if err := tx.Commit(); err != nil {
						t.Error(err)
					}
				}
			})
			msgs, _, err := r.ClaimOnce(ctx, c.batch, 32)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, m := range msgs {
				got = append(got, m.MessageID)
			}
			if !slices.Equal(got, c.want) {
				t.Fatalf("claimed %v after %d looks, want %v: the claim handed out an aggregate's event before an earlier one it did not see", got, looks, c.want)
			}
			if r.LateRows() != c.wantLate || looks != c.wantLookups {
				t.Fatalf("late rows %d in %d looks, want %d in %d", r.LateRows(), looks, c.wantLate, c.wantLookups)
			}
		})
	}
}

// lateRow is one row of TestMySQLClaimTakesRowsCommittedBelowIt: its
// message ID, its aggregate ID, and the look before which it commits (0:
// before the claim).
type lateRow struct {
	id, agg string
	look    int
}
