package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
)

// TestRepartition: refused while rows are pending or a relay runs; once
// drained and stopped, the lease table is resized and the new count stored,
// the writers' Outbox reads it back, a relay asserting the old count is
// refused with ErrPartitionMismatch, and one that reads the stored count
// relays rows written with the new count.
func TestRepartition(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg, nil)
		b.emit(t, event("A", 1))
		if _, err := b.pub.WaitForCount(b.ctx, 1); err != nil {
			t.Fatal(err)
		}
		ctx := b.ctx
		if err := relay.Repartition(ctx, b.e.Outbox, b.e.RelayDB, 64); !errors.Is(err, relay.ErrNotDrained) {
			t.Fatalf("Repartition with a live relay = %v, want ErrNotDrained", err)
		}
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := b.r.Stop(sctx); err != nil {
			t.Fatal(err)
		}
		if err := relay.Repartition(ctx, b.e.Outbox, b.e.RelayDB, 0); !errors.Is(err, relay.ErrInvalidConfig) {
			t.Errorf("count 0: %v", err)
		}
		if err := relay.Repartition(ctx, nil, b.e.RelayDB, 8); !errors.Is(err, relay.ErrInvalidConfig) {
			t.Errorf("nil outbox: %v", err)
		}
		if err := relay.Repartition(ctx, b.e.Outbox, b.e.RelayDB, 64); err != nil {
			t.Fatal(err)
		}
		var n int
		if err := b.e.RelayDB.QueryRow("SELECT COUNT(*) FROM " + b.e.Table + "_lease").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 64 {
			t.Errorf("%d lease rows, want 64", n)
		}
		if got, err := b.e.Outbox.PartitionCount(ctx, b.e.RelayDB); err != nil || got != 64 {
			t.Errorf("stored count = %d, %v; want 64", got, err)
		}
		old, err := driver.New(driver.Config{Dialect: tg.Dialect, Table: b.e.Table, Partitions: partition.DefaultCount})
		if err != nil {
			t.Fatal(err)
		}
		stale, err := relay.New(old, b.e.RelayDB, relay.Config{Publisher: outboxtest.NewPublisher(), Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		if err := stale.Run(ctx); !errors.Is(err, relay.ErrPartitionMismatch) {
			t.Errorf("relay with the old count: %v, want ErrPartitionMismatch", err)
		}
		// The writers' Outbox was refreshed by Repartition: new rows are
		// hashed onto 64 partitions, and a relay reading the stored count
		// publishes them.
		b.emit(t, event("B", 1))
		var part int
		if err := b.e.RelayDB.QueryRow("SELECT partition_key FROM "+b.e.Table+" WHERE message_id = "+b.e.Placeholder(1), "B-1").Scan(&part); err != nil {
			t.Fatal(err)
		}
		if want := partition.Of("acct", "B", 64); part != want {
			t.Errorf("B-1 in partition %d, want %d (of 64)", part, want)
		}
		fresh, err := driver.New(driver.Config{Dialect: tg.Dialect, Table: b.e.Table})
		if err != nil {
			t.Fatal(err)
		}
		pub := outboxtest.NewPublisher()
		r, err := relay.New(fresh, b.e.RelayDB, relay.Config{Publisher: pub, PollInterval: 20 * time.Millisecond, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		run := make(chan error, 1)
		go func() { run <- r.Run(ctx) }()
		if _, err := pub.WaitForIDs(ctx, "B-1"); err != nil {
			t.Fatal(err)
		}
		// A deadline of its own: the first Stop's may have passed by now
		// (it did, at load average 35, after 16 s).
		sctx2, cancel2 := context.WithTimeout(ctx, 10*time.Second)
		defer cancel2()
		if err := r.Stop(sctx2); err != nil {
			t.Fatal(err)
		}
		if err := <-run; err != nil {
			t.Fatalf("relay with the stored count: %v", err)
		}
	})
}

// TestFenceRejectsStaleOwner: once a partition's lease belongs to another
// instance (or has expired), the former owner's outcome writes change
// nothing.
func TestFenceRejectsStaleOwner(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		b := setup(t, tg, func(c *relay.Config) { c.InstanceID = "owner-a" })
		sctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
		defer cancel()
		b.emit(t, event("F", 1))
		if _, err := b.pub.WaitForCount(b.ctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := b.r.Stop(sctx); err != nil {
			t.Fatal(err)
		}
		d, err := dialect.New(dialect.Name(tg.Dialect), b.e.Table)
		if err != nil {
			t.Fatal(err)
		}
		db := b.e.RelayDB
		var id int64
		var part int
		if err := db.QueryRow("SELECT id, partition_key FROM "+b.e.Table).Scan(&id, &part); err != nil {
			t.Fatal(err)
		}
		// Pending again (in the pending set), as if never sent.
		if _, err := db.Exec(d.Bind("INSERT INTO "+testdb.PendingTable(b.e.Table)+" (id, partition_key) VALUES (?, ?)"), id, part); err != nil {
			t.Fatal(err)
		}
		// owner-b holds the partition now.
		if _, err := db.Exec(d.Lease("lease_acquire"), "owner-b", int64(time.Minute/time.Microsecond), part); err != nil {
			t.Fatal(err)
		}
		for _, owner := range []string{"owner-a", "owner-b"} {
			q, args := d.MarkSent([]int64{id}, owner)
			res, err := db.Exec(q, args...)
			if err != nil {
				t.Fatal(err)
			}
			n, _ := res.RowsAffected()
			if want := map[string]int64{"owner-a": 0, "owner-b": 1}[owner]; n != want {
				t.Errorf("mark sent by %s changed %d rows, want %d", owner, n, want)
			}
		}
	})
}

// TestRepartitionWaitsForTheSlot: with log-only writers, events committed
// while no relay reads the slot are in no table, and carry the partition
// of the count they were written with. Repartition refuses
// (ErrNotDrained) while the slot holds them; once a relay has published
// them and stopped, it succeeds. Before the check it counted only pending
// rows and live relays: a shrink from 32 to 4 partitions left 15 of 16
// such events, in partitions 4 and above, written to the table where no
// relay could own them, and the slot confirmed past them (found by a
// helper trying to break the WAL source).
func TestRepartitionWaitsForTheSlot(t *testing.T) {
	t.Parallel()
	e, wal := logEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	if _, err := relay.CreateWAL(ctx, e.Outbox, e.RelayDB, wal); err != nil {
		t.Fatal(err)
	}
	const n = 16
	b0 := &bundle{e: e, ctx: ctx} // no relay runs
	for i := range n {
		b0.emit(t, event(fmt.Sprintf("G%d", i), 1))
	}
	var written string
	if err := e.RelayDB.QueryRow("SELECT pg_current_wal_lsn()::text").Scan(&written); err != nil {
		t.Fatal(err)
	}
	if err := relay.Repartition(ctx, e.Outbox, e.RelayDB, 4); !errors.Is(err, relay.ErrNotDrained) || !strings.Contains(err.Error(), wal.Slot) {
		t.Fatalf("Repartition with %d events in slot %s = %v, want ErrNotDrained naming the slot", n, wal.Slot, err)
	}
	b := walSetup(t, e, wal, nil)
	if _, err := b.pub.WaitForCount(b.ctx, n); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "the slot confirmed past the events (WALConfig.StatusInterval)", func() bool {
		var past bool
		if err := e.RelayDB.QueryRow("SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1", wal.Slot, written).Scan(&past); err != nil {
			t.Fatal(err)
		}
		return past
	})
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	if err := b.r.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "Repartition once the relay's walsender has released the slot", func() bool {
		err := relay.Repartition(ctx, e.Outbox, e.RelayDB, 4)
		if err != nil && !strings.Contains(err.Error(), "is active") {
			t.Fatalf("Repartition after the drain: %v", err)
		}
		return err == nil
	})
	if got, err := e.Outbox.PartitionCount(ctx, e.RelayDB); err != nil || got != 4 {
		t.Fatalf("stored count = %d, %v; want 4", got, err)
	}
}

// TestRepartitionWithoutAPublication: with log-only writers Repartition
// peeks the slots recorded for the table, which pgoutput reads through a
// publication of the table; without one it refuses (ErrNotDrained) and
// says why, rather than repartitioning over events it could not see.
func TestRepartitionWithoutAPublication(t *testing.T) {
	t.Parallel()
	e, wal := logEnv(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if _, err := relay.CreateWAL(ctx, e.Outbox, e.RelayDB, wal); err != nil {
		t.Fatal(err)
	}
	(&bundle{e: e, ctx: ctx}).emit(t, event("G", 1)) // no relay runs
	if _, err := e.RelayDB.ExecContext(ctx, "DROP PUBLICATION "+relay.PublicationName(e.Table)); err != nil {
		t.Fatal(err)
	}
	err := relay.Repartition(ctx, e.Outbox, e.RelayDB, 4)
	if !errors.Is(err, relay.ErrNotDrained) || !strings.Contains(err.Error(), "without a publication") || !strings.Contains(err.Error(), wal.Slot) {
		t.Fatalf("Repartition without a publication = %v, want ErrNotDrained naming the slot and saying it cannot be read without one", err)
	}
	if got, err := e.Outbox.PartitionCount(ctx, e.RelayDB); err != nil || got == 4 {
		t.Fatalf("stored count = %d, %v; want it unchanged", got, err)
	}
}
