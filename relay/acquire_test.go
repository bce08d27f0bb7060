package relay_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
)

// TestLeasesAcquiredTogether: a starting relay takes every free partition
// (it is the only live instance), leaves alone the ones another owner
// still holds, and raises each taken partition's epoch once. On
// every dialect one statement takes them all (on MySQL/MariaDB after a
// locking SELECT in the same transaction): on PostgreSQL every taken lease
// row then carries the same xmin (one transaction). The relay used to take
// one statement, and one commit, per partition, which under a saturated
// burst kept its first claim waiting for 100-140 ms on PostgreSQL and
// a commit time (9-48 ms under 16 to 64 writers) per partition on
// MariaDB (issue 26).
func TestLeasesAcquiredTogether(t *testing.T) {
	t.Parallel()
	const held = 10 // partitions 0..held-1 belong to owner-b, which is not a live member
	forEach(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		d := leaseDialect(t, ctx, e)
		n := partition.DefaultCount
		for p := 0; p < held; p++ {
			if _, err := e.RelayDB.ExecContext(ctx, d.Lease("lease_acquire"), "owner-b", int64(time.Hour/time.Microsecond), p); err != nil {
				t.Fatal(err)
			}
		}
		// No renewal during the test: one renews every owned row in one
		// statement, which would give them one xmin whatever took them.
		startRelay(t, ctx, e, time.Hour)
		eventually(t, ctx, "owner-a holds the free partitions", func() bool {
			owned := 0
			for _, l := range leaseRows(t, ctx, e) {
				if l.owner == "owner-a" {
					owned++
				}
			}
			return owned == n-held
		})

		for p, l := range leaseRows(t, ctx, e) {
			want := "owner-a"
			if p < held {
				want = "owner-b"
			}
			if l.owner != want || l.epoch != 1 {
				t.Errorf("partition %d: owner %q, epoch %d; want %q, epoch 1", p, l.owner, l.epoch, want)
			}
		}
		if tg.Dialect == driver.Postgres {
			var txs int
			if err := e.RelayDB.QueryRowContext(ctx, "SELECT COUNT(DISTINCT xmin::text) FROM "+e.Table+"_lease WHERE owner = 'owner-a'").Scan(&txs); err != nil {
				t.Fatal(err)
			}
			if txs != 1 {
				t.Errorf("the %d partitions were taken by %d transactions, want 1", n-held, txs)
			}
		}
	})
}

// leaseDialect returns e's dialect, after creating e's lease rows (one
// per partition, none owned), as a starting relay would.
func leaseDialect(t *testing.T, ctx context.Context, e *testdb.Env) *dialect.Dialect {
	t.Helper()
	d, err := dialect.New(dialect.Name(e.Target.Dialect), e.Table)
	if err != nil {
		t.Fatal(err)
	}
	n := partition.DefaultCount
	args := make([]any, n)
	for p := range args {
		args[p] = p
	}
	if _, err := e.RelayDB.ExecContext(ctx, d.LeaseInit(n), args...); err != nil {
		t.Fatal(err)
	}
	return d
}

// startRelay runs a relay of instance "owner-a" with leaseTTL on e until
// the test ends.
func startRelay(t *testing.T, ctx context.Context, e *testdb.Env, leaseTTL time.Duration) {
	t.Helper()
	r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{Publisher: outboxtest.NewPublisher(), InstanceID: "owner-a",
		LeaseTTL: leaseTTL, PollInterval: 20 * time.Millisecond, Logger: quiet(), Observer: outboxtest.WatchOrder(t, nil)})
	if err != nil {
		t.Fatal(err)
	}
	run := make(chan error, 1)
	go func() { run <- r.Run(ctx) }()
	t.Cleanup(func() {
		sctx, c := context.WithTimeout(context.Background(), 10*time.Second)
		defer c()
		if err := r.Stop(sctx); err != nil {
			t.Errorf("stop: %v", err)
		}
		if err := <-run; err != nil {
			t.Errorf("run: %v", err)
		}
	})
}

// lease is one lease row.
type lease struct {
	owner string
	epoch int64
}

// leaseRows reads e's lease table: owner ("" for none) and epoch per
// partition.
func leaseRows(t *testing.T, ctx context.Context, e *testdb.Env) map[int]lease {
	t.Helper()
	rows, err := e.RelayDB.QueryContext(ctx, "SELECT partition_key, COALESCE(owner, ''), epoch FROM "+e.Table+"_lease")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[int]lease{}
	for rows.Next() {
		var p int
		var l lease
		if err := rows.Scan(&p, &l.owner, &l.epoch); err != nil {
			t.Fatal(err)
		}
		out[p] = l
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLeaseAcquireSkipsLockedRows (MySQL/MariaDB): a free partition whose
// lease row another transaction holds a shared lock on (what a mark-sent
// fence takes while it runs) is skipped, not waited for: the relay takes
// every other partition at once, and that one at a later heartbeat once
// the lock is gone. Taking partitions one statement each in order, the
// relay used to wait at that row for the lock (up to
// innodb_lock_wait_timeout) before taking the partitions after it; taking
// them in one plain UPDATE, it would hold the rows before that one while
// waiting, which closes deadlock cycles with fences (see
// TestNoDeadlocksAcrossLeaseHandovers).
func TestLeaseAcquireSkipsLockedRows(t *testing.T) {
	t.Parallel()
	const locked = 5
	e := testdb.New(t, testdb.Target{Name: "mysql", Dialect: driver.MySQL}, driver.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	leaseDialect(t, ctx, e)
	n := partition.DefaultCount
	other, err := sql.Open("mysql", e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	tx, err := other.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after the Rollback below
	var p int
	if err := tx.QueryRowContext(ctx, "SELECT partition_key FROM "+e.Table+"_lease WHERE partition_key = ? LOCK IN SHARE MODE", locked).Scan(&p); err != nil {
		t.Fatal(err)
	}

	startRelay(t, ctx, e, 2*time.Second)
	owned := func() (mine int, lockedFree bool) {
		for q, l := range leaseRows(t, ctx, e) {
			if l.owner == "owner-a" {
				mine++
			}
			if q == locked {
				lockedFree = l.owner == ""
			}
		}
		return mine, lockedFree
	}
	eventually(t, ctx, "owner-a holds every partition but the locked one", func() bool {
		mine, lockedFree := owned()
		return mine == n-1 && lockedFree
	})
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "owner-a holds the last partition once the lock is gone", func() bool {
		mine, _ := owned()
		return mine == n
	})
}
