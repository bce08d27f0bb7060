package relay

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/partition"
)

// nopPublisher acknowledges everything.
type nopPublisher struct{}

func (nopPublisher) Publish(context.Context, []Message) error { return nil }

// TestClaimFloorForgetsAPartitionLeftOut: the PostgreSQL claim's scan
// floor is proven over the partitions of the claims that prove it (the
// proof's lowest pending id reads only those partitions). A partition left
// out of some claims and back under the same lease epoch (the exactly-once
// mode's reconcile leaving it out when the trust window ran short, without
// an error; a release that failed, renewed by the next heartbeat) must not
// be claimed from a floor proven without it. Before the fix
// claimFloor.cover kept the floor and its covered partitions when a claim
// covered fewer, and X, pending below the floor, was never claimed (found
// by a helper trying to break the WAL source; its end-to-end version, an
// exactly-once relay whose reconcile ran out of trust window, delivered an
// aggregate's second event and never its first, 6 of 6 runs, with the
// table claim and with the WAL source).
func TestClaimFloorForgetsAPartitionLeftOut(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.All[0], driver.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := New(e.Outbox, e.RelayDB, Config{Publisher: nopPublisher{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	// Two aggregates in two partitions.
	aggIn := func(p int, not int) (string, int) {
		for i := 0; ; i++ {
			id := fmt.Sprintf("agg%d", i)
			if q := partition.Of("acct", id, 32); (p < 0 && q != not) || q == p {
				return id, q
			}
		}
	}
	x, P := aggIn(-1, -1)
	y, Q := aggIn(-1, P)
	emit := func(agg string, n int) {
		octx := outbox.NewContext(ctx)
		tx, err := e.DB.BeginTx(octx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := outbox.Emit(octx, outbox.Event{ID: fmt.Sprintf("%s-%d", agg, n), AggregateType: "acct", AggregateID: agg, Type: "t", Payload: []byte("{}")}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	emit(x, 1) // X: pending in P, the lowest id
	emit(y, 1) // Y: pending in Q
	r.batch = 100
	both := leaseSet{epochs: map[int]int64{P: 7, Q: 7}, trustedUntil: time.Now().Add(time.Hour)}
	onlyQ := leaseSet{epochs: map[int]int64{Q: 7}, trustedUntil: both.trustedUntil}
	claimed := func(set leaseSet) []string {
		msgs, err := r.claim(ctx, set)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range msgs {
			ids = append(ids, m.MessageID)
		}
		return ids
	}
	t.Logf("partitions P=%d Q=%d; claim over both: %v", P, Q, claimed(both))
	var xid int64
	if err := e.RelayDB.QueryRowContext(ctx, "SELECT id FROM "+e.Table+" WHERE message_id = $1", x+"-1").Scan(&xid); err != nil {
		t.Fatal(err)
	}
	// P left out of the claims (same lease epochs) until a floor proof
	// has been taken and resolved over Q alone.
	testdb.Eventually(t, ctx, "a floor proven over Q alone", func() bool {
		claimed(onlyQ)
		return r.floor.floor > xid
	})
	t.Logf("floor %d, X's id %d", r.floor.floor, xid)
	// P back under the same epoch: its pending row X must be claimed.
	got := claimed(both)
	found := false
	for _, id := range got {
		found = found || id == x+"-1"
	}
	if !found {
		t.Errorf("claim over P and Q after P was left out under the same epoch returned %v: X (%s-1, pending in P, id %d) is below the floor %d and is never claimed", got, x, xid, r.floor.floor)
	}
}
