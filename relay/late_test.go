package relay_test

import (
	"context"
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
// returns as many as it may (B waits for the next claim).
func TestMySQLClaimTakesRowsCommittedBelowIt(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		batch int
		want  []string // message IDs claimed, in order
	}{
		{"both_in_id_order", 10, []string{"a", "b"}},
		{"late_rows_at_the_limit", 1, []string{"a"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := testdb.New(t, testdb.All[2], driver.Config{})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			insert := fmt.Sprintf("INSERT INTO %s (message_id, aggregate_type, aggregate_id, event_type, topic, partition_key, content_type, payload, headers, created_at, updated_at) "+
				"VALUES (?, 'order', '42', 'created', 't', 0, 'application/json', '{}', '', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))", e.Table)
			txA, err := e.RelayDB.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = txA.Rollback() }()
			if _, err := txA.ExecContext(ctx, insert, "a"); err != nil {
				t.Fatal(err)
			}
			if _, err := e.RelayDB.ExecContext(ctx, insert, "b"); err != nil {
				t.Fatal(err)
			}

			r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{Publisher: outboxtest.NewPublisher(), Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			hooked := 0
			r.OnClaimed(func() {
				if hooked++; hooked == 1 {
					if err := txA.Commit(); err != nil {
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
			if hooked != 1 || !slices.Equal(got, c.want) {
				t.Fatalf("claimed %v (hook ran %d times), want %v: the claim handed out an aggregate's event before an earlier one it did not see", got, hooked, c.want)
			}
			if r.LateRows() != 1 {
				t.Fatalf("late rows counted %d, want 1", r.LateRows())
			}
		})
	}
}
