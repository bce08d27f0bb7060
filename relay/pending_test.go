package relay_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/testkit/handwritten"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
)

// pendingIDs lists the message IDs whose rows are in the pending set of
// table, sorted.
func pendingIDs(t *testing.T, ctx context.Context, e *testdb.Env, table string) []string {
	t.Helper()
	ids := testdb.Column(t, ctx, e.RelayDB, "SELECT o.message_id FROM "+table+" o JOIN "+testdb.PendingTable(table)+" p ON p.id = o.id")
	sort.Strings(ids)
	return ids
}

// oldRow writes a row as a writer and a relay of a build before the
// pending set left it: status 0 pending, 1 sent, 2 dead (attempts and
// retry time as given, SQL expressions).
func oldRow(t *testing.T, ctx context.Context, e *testdb.Env, table, id, agg string, status, attempts int, retry string) {
	t.Helper()
	now := handwritten.Now(e.Target.Dialect)
	sent := "NULL"
	if status == 1 {
		sent = now
	}
	q := fmt.Sprintf("INSERT INTO %s (message_id, aggregate_type, aggregate_id, event_type, partition_key, content_type, payload, status, attempts, next_retry_at, created_at, updated_at, sent_at) "+
		"VALUES ('%s', 'acct', '%s', 't', %d, 'text/plain', %s, %d, %d, %s, %s, %s, %s)",
		table, id, agg, partition.Of("acct", agg, partition.DefaultCount), map[driver.Dialect]string{driver.Postgres: "'\\x78'::bytea", driver.MySQL: "'x'", driver.SQLite: "CAST('x' AS BLOB)"}[e.Target.Dialect],
		status, attempts, retry, now, now, sent)
	if _, err := e.RelayDB.ExecContext(ctx, q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// TestPendingSetKeptByTriggers: the pending set (schema version 9 on
// PostgreSQL, 8 on SQLite, 6 on MySQL/MariaDB) follows every way a row
// enters or leaves it without the writer knowing of it: an INSERT by hand
// with status 0 is pending and one with status 1 or 2 is not; dead
// (status 0 to 2) leaves it and retried (2 to 0) enters it again; a new
// partition_key follows; a DELETE removes the entry. The relay then
// publishes exactly the pending rows.
func TestPendingSetKeptByTriggers(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		never := map[driver.Dialect]string{driver.Postgres: "'infinity'::timestamptz", driver.MySQL: "'9999-12-31 23:59:59.999999'", driver.SQLite: "253402300799999"}[tg.Dialect]
		oldRow(t, ctx, e, e.Table, "hand-pending", "a", 0, 0, "NULL")
		oldRow(t, ctx, e, e.Table, "hand-sent", "b", 1, 1, "NULL")
		oldRow(t, ctx, e, e.Table, "hand-dead", "c", 2, 6, never)
		oldRow(t, ctx, e, e.Table, "goes-dead", "d", 0, 0, "NULL")
		oldRow(t, ctx, e, e.Table, "comes-back", "e", 2, 6, never)
		oldRow(t, ctx, e, e.Table, "deleted", "f", 0, 0, "NULL")
		exec := func(q string) {
			t.Helper()
			if _, err := e.RelayDB.ExecContext(ctx, q); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		exec("UPDATE " + e.Table + " SET status = 2, next_retry_at = " + never + " WHERE message_id = 'goes-dead'")
		exec("UPDATE " + e.Table + " SET status = 0, attempts = 0, next_retry_at = NULL WHERE message_id = 'comes-back'")
		exec("DELETE FROM " + e.Table + " WHERE message_id = 'deleted'")
		exec("UPDATE " + e.Table + " SET partition_key = 7 WHERE message_id = 'hand-pending'")
		if got, want := pendingIDs(t, ctx, e, e.Table), []string{"comes-back", "hand-pending"}; !slices.Equal(got, want) {
			t.Fatalf("pending set %v, want %v", got, want)
		}
		var part int
		if err := e.RelayDB.QueryRowContext(ctx, "SELECT p.partition_key FROM "+testdb.PendingTable(e.Table)+" p JOIN "+e.Table+" o ON o.id = p.id WHERE o.message_id = 'hand-pending'").Scan(&part); err != nil || part != 7 {
			t.Fatalf("hand-pending's partition in the pending set: %d, %v; want 7", part, err)
		}
		exec("UPDATE " + e.Table + " SET partition_key = " + fmt.Sprint(partition.Of("acct", "a", partition.DefaultCount)) + " WHERE message_id = 'hand-pending'")
		b := setupOn(t, e, nil)
		msgs, err := b.pub.WaitForCount(b.ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, m := range msgs {
			got = append(got, m.MessageID)
		}
		sort.Strings(got)
		if want := []string{"comes-back", "hand-pending"}; !slices.Equal(got, want) {
			t.Fatalf("published %v, want %v", got, want)
		}
		testdb.Eventually(t, ctx, "the pending set empty", func() bool { return len(pendingIDs(t, ctx, e, e.Table)) == 0 })
		st, err := relay.ReadStats(ctx, e.Outbox, e.RelayDB)
		if err != nil {
			t.Fatal(err)
		}
		if st.Pending != 0 || st.Sent != 3 || st.Dead != 2 {
			t.Errorf("stats: %d pending, %d sent, %d dead; want 0, 3 (hand-sent, hand-pending, comes-back), 2", st.Pending, st.Sent, st.Dead)
		}
	})
}

// TestUpgradeToThePendingSet upgrades a table an earlier build left (the
// schema version before the pending set, rows written with its
// semantics: status 0 pending, 1 sent, 2 dead): the migration puts
// exactly the pending rows in the pending set, reading the backlog and not
// the history; during a rolling upgrade a writer of the earlier build
// (a plain INSERT) and a relay of the earlier build (marking status 1)
// keep working; a relay of this build then publishes exactly what was
// pending, in order, and leaves the held aggregate held.
func TestUpgradeToThePendingSet(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		table := e.Table + "_old"
		d, err := dialect.New(dialect.Name(tg.Dialect), table)
		if err != nil {
			t.Fatal(err)
		}
		// The version before the pending set's migration (later ones,
		// such as PostgreSQL's optional dead_held_idx, follow it).
		before := 0
		for _, m := range d.Migrations() {
			if m.Name == "pending" {
				before = m.Version - 1
			}
		}
		if before == 0 {
			t.Fatalf("no pending set migration among %d", len(d.Migrations()))
		}
		if err := d.MigrateTo(ctx, e.RelayDB, before); err != nil {
			t.Fatal(err)
		}
		never := map[driver.Dialect]string{driver.Postgres: "'infinity'::timestamptz", driver.MySQL: "'9999-12-31 23:59:59.999999'", driver.SQLite: "253402300799999"}[tg.Dialect]
		due := map[driver.Dialect]string{driver.Postgres: "clock_timestamp() - interval '1 second'", driver.MySQL: "UTC_TIMESTAMP(6) - INTERVAL 1 SECOND", driver.SQLite: "CAST(unixepoch('subsec') * 1000 AS INTEGER) - 1000"}[tg.Dialect]
		for i := 1; i <= 3; i++ {
			oldRow(t, ctx, e, table, fmt.Sprintf("old-sent-%d", i), "A", 1, 1, "NULL")
		}
		oldRow(t, ctx, e, table, "old-dead-D", "D", 2, 6, never)
		oldRow(t, ctx, e, table, "old-held-D", "D", 0, 0, "NULL")
		oldRow(t, ctx, e, table, "old-retry-R", "R", 0, 1, due)
		for i := 1; i <= 5; i++ {
			oldRow(t, ctx, e, table, fmt.Sprintf("old-pend-%d", i), "A", 0, 0, "NULL")
		}

		ob, err := driver.New(driver.Config{Dialect: tg.Dialect, Table: table})
		if err != nil {
			t.Fatal(err)
		}
		if err := ob.Migrate(ctx, e.RelayDB); err != nil {
			t.Fatal(err)
		}
		if v, _, err := driver.SchemaVersion(ctx, e.RelayDB, ob.Config()); err != nil || v != d.LatestVersion() {
			t.Fatalf("after Migrate: version %d, %v; want %d", v, err, d.LatestVersion())
		}
		want := []string{"old-held-D", "old-pend-1", "old-pend-2", "old-pend-3", "old-pend-4", "old-pend-5", "old-retry-R"}
		if got := pendingIDs(t, ctx, e, table); !slices.Equal(got, want) {
			t.Fatalf("pending set after the upgrade %v, want %v", got, want)
		}
		// A relay of the earlier build marks old-pend-5 sent its way; a
		// writer of the earlier build writes a row its way.
		if _, err := e.RelayDB.ExecContext(ctx, "UPDATE "+table+" SET status = 1, attempts = attempts + 1, sent_at = "+handwritten.Now(tg.Dialect)+" WHERE message_id = 'old-pend-5'"); err != nil {
			t.Fatal(err)
		}
		oldRow(t, ctx, e, table, "old-writer-1", "A", 0, 0, "NULL")
		// And a writer of this build.
		_, wdb := e.OpenWriter(t, driver.Config{Table: table})
		wctx := outbox.NewContext(ctx)
		tx, err := wdb.BeginTx(wctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := outbox.Emit(wctx, outbox.Event{ID: "new-1", AggregateType: "acct", AggregateID: "A", Type: "t", ContentType: "text/plain", Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}

		pub := outboxtest.NewPublisher()
		r, err := relay.New(ob, e.RelayDB, relay.Config{Publisher: pub, PollInterval: 20 * time.Millisecond, Logger: quiet(),
			Observer: outboxtest.WatchOrder(t, nil)})
		if err != nil {
			t.Fatal(err)
		}
		run := make(chan error, 1)
		go func() { run <- r.Run(ctx) }()
		msgs, err := pub.WaitForCount(ctx, 7)
		if err != nil {
			t.Fatal(err)
		}
		sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
		defer scancel()
		if err := r.Stop(sctx); err != nil {
			t.Fatal(err)
		}
		if err := <-run; err != nil {
			t.Fatal(err)
		}
		var aOrder, all []string
		for _, m := range pub.Messages() {
			all = append(all, m.MessageID)
			if m.AggregateID == "A" {
				aOrder = append(aOrder, m.MessageID)
			}
		}
		sort.Strings(all)
		if want := []string{"new-1", "old-pend-1", "old-pend-2", "old-pend-3", "old-pend-4", "old-retry-R", "old-writer-1"}; !slices.Equal(all, want) || len(msgs) != 7 {
			t.Fatalf("published %v, want %v once each", all, want)
		}
		if want := []string{"old-pend-1", "old-pend-2", "old-pend-3", "old-pend-4", "old-writer-1", "new-1"}; !slices.Equal(aOrder, want) {
			t.Errorf("aggregate A in the order %v, want %v", aOrder, want)
		}
		if got := pendingIDs(t, ctx, e, table); !slices.Equal(got, []string{"old-held-D"}) {
			t.Errorf("pending set after the drain %v, want only the held old-held-D", got)
		}
	})
}

// TestDuplicateIDWhileInHistory: a message ID is refused
// (outbox.ErrDuplicateID) for as long as the row of its first event is in
// the outbox table: pending, sent (the history: marking an event sent
// since the pending set leaves its row in place), or dead; it is accepted
// again once retention removed the row, which is the first retention pass
// after the row is sent and older than RetentionConfig.After (counted from
// its created_at). Dead letters are never removed by retention. The
// boundary is checked on both sides: a sent row a minute younger than
// After stays (and its ID is refused), one a minute older goes (and its ID
// commits again).
func TestDuplicateIDWhileInHistory(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		const after = time.Hour
		b := setup(t, tg, func(c *relay.Config) { c.MaxAttempts = 1 })
		b.pub.FailWith(func(m relay.Message) error {
			if m.AggregateID == "dead" {
				return fmt.Errorf("%w: refused", relay.ErrPermanent)
			}
			return nil
		})
		ctx := b.ctx
		emit := func(id, agg string) error {
			wctx := outbox.NewContext(ctx)
			tx, err := b.e.DB.BeginTx(wctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback() //nolint:errcheck // no-op after Commit
			if err := outbox.Emit(wctx, outbox.Event{ID: id, AggregateType: "acct", AggregateID: agg, Type: "t", ContentType: "text/plain", Payload: []byte("x")}); err != nil {
				return err
			}
			return tx.Commit()
		}
		for _, id := range []string{"young", "old"} {
			if err := emit(id, "a"); err != nil {
				t.Fatal(err)
			}
		}
		if err := emit("dead", "dead"); err != nil {
			t.Fatal(err)
		}
		testdb.Eventually(t, ctx, "young and old sent, dead dead-lettered", func() bool {
			st, err := relay.ReadStats(ctx, b.e.Outbox, b.e.RelayDB)
			return err == nil && st.Pending == 0 && st.Sent == 2 && st.Dead == 1
		})
		for _, id := range []string{"young", "old", "dead"} {
			if err := emit(id, "b"); !errors.Is(err, outbox.ErrDuplicateID) {
				t.Fatalf("%s used again while its row is in the table: %v, want ErrDuplicateID", id, err)
			}
		}
		// young is a minute short of After, old a minute past it; the dead
		// letter is a day past it.
		shift := func(id string, by time.Duration) {
			t.Helper()
			q := map[driver.Dialect]string{
				driver.Postgres: fmt.Sprintf("UPDATE %s SET created_at = created_at - interval '%d seconds' WHERE message_id = $1", b.e.Table, int(by.Seconds())),
				driver.MySQL:    fmt.Sprintf("UPDATE %s SET created_at = created_at - INTERVAL %d SECOND WHERE message_id = ?", b.e.Table, int(by.Seconds())),
				driver.SQLite:   fmt.Sprintf("UPDATE %s SET created_at = created_at - %d WHERE message_id = ?", b.e.Table, by.Milliseconds()),
			}[tg.Dialect]
			if _, err := b.e.RelayDB.ExecContext(ctx, q, id); err != nil {
				t.Fatal(err)
			}
		}
		shift("young", after-time.Minute)
		shift("old", after+time.Minute)
		shift("dead", 24*time.Hour)
		ret, err := relay.NewRetention(b.e.Outbox, b.e.RelayDB, relay.RetentionConfig{After: after, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		if n, err := ret.RunOnce(ctx); err != nil || n != 1 {
			t.Fatalf("retention removed %d rows, %v; want 1 (old)", n, err)
		}
		if err := emit("old", "b"); err != nil {
			t.Errorf("old used again after retention removed its row: %v", err)
		}
		for _, id := range []string{"young", "dead"} {
			if err := emit(id, "b"); !errors.Is(err, outbox.ErrDuplicateID) {
				t.Errorf("%s used again while its row is in the table: %v, want ErrDuplicateID", id, err)
			}
		}
	})
}
