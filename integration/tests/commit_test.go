package tests

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

func TestCommitPublishes(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		createOrders(t, e)
		pub := outboxtest.NewPublisher()
		startRelay(t, e, pub, func(c *relay.Config) { c.PollInterval = time.Hour }) // only the wake-up
		ctx := testCtx(t, 30*time.Second)
		want := []outbox.Event{
			{AggregateType: "order", AggregateID: "o-1", Type: "order.created", Payload: []byte(`{"z":1,  "a" : [1,2]}`),
				Headers: map[string]string{"trace-id": "abc", "unicode": "ünïcode värde ✓"}},
			{AggregateType: "order", AggregateID: "o-1", Type: "order.paid", Payload: []byte(`"paid"`), Topic: "payments"},
			{ID: "my-own-id-1", AggregateType: "order", AggregateID: "o-2", Type: "blob", ContentType: "application/octet-stream",
				Payload: []byte{0, 1, 2, 0xff, 0xfe}},
		}
		err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+e.Q("orders")+" (id, seq) VALUES ('o-1', 1)"); err != nil {
				return err
			}
			for _, ev := range want {
				if err := outbox.Emit(ctx, ev); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		got, err := pub.WaitForCount(ctx, len(want))
		if err != nil {
			t.Fatal(err)
		}
		for i, w := range want {
			g := got[i]
			if g.AggregateID != w.AggregateID || g.EventType != w.Type || !bytes.Equal(g.Payload, w.Payload) || g.Topic != w.Topic {
				t.Errorf("message %d = %+v, want %+v", i, g, w)
			}
			if len(g.Headers) != len(w.Headers) {
				t.Errorf("message %d headers = %v, want %v", i, g.Headers, w.Headers)
			}
			for k, v := range w.Headers {
				if g.Headers[k] != v {
					t.Errorf("message %d header %q = %q, want %q", i, k, g.Headers[k], v)
				}
			}
			if i > 0 && g.ID <= got[i-1].ID {
				t.Errorf("outbox ids not increasing: %d then %d", got[i-1].ID, g.ID)
			}
		}
		if got[2].MessageID != "my-own-id-1" || got[2].ContentType != "application/octet-stream" || got[0].ContentType != "application/json" {
			t.Errorf("ids/content types: %+v", got)
		}
		eventually(t, ctx, "rows marked sent", func() bool { return rowCount(t, e, e.IsSent()) == len(want) })
	})
}

func TestRollbackPublishesNothing(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		createOrders(t, e)
		pub := outboxtest.NewPublisher()
		startRelay(t, e, pub, nil)
		ctx := testCtx(t, 30*time.Second)

		// Explicit rollback.
		sctx := outbox.NewContext(ctx)
		tx, err := e.DB.BeginTx(sctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.ExecContext(sctx, "INSERT INTO "+e.Q("orders")+" (id, seq) VALUES ('gone', 1)"); err != nil {
			t.Fatal(err)
		}
		if err := outbox.Emit(sctx, ev("rolled-back", 1)); err != nil {
			t.Fatal(err)
		}
		if err := tx.Rollback(); err != nil {
			t.Fatal(err)
		}
		if err := outbox.Emit(sctx, ev("rolled-back", 2)); !errors.Is(err, outbox.ErrNoTransaction) {
			t.Errorf("Emit after rollback = %v, want ErrNoTransaction", err)
		}

		// Rollback by cancelling the BeginTx context (database/sql rolls back).
		cctx, cancel := context.WithCancel(outbox.NewContext(ctx))
		tx2, err := e.DB.BeginTx(cctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := outbox.Emit(cctx, ev("cancelled", 1)); err != nil {
			t.Fatal(err)
		}
		cancel()
		if err := tx2.Commit(); err == nil {
			t.Fatal("commit after cancel succeeded")
		}

		// A marker committed afterwards proves the relay ran past them.
		if err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error { return outbox.Emit(ctx, ev("marker", 1)) }); err != nil {
			t.Fatal(err)
		}
		got, err := pub.WaitForCount(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].AggregateID != "marker" {
			t.Fatalf("published %+v, want only the marker", got)
		}
		if n := rowCount(t, e, ""); n != 1 {
			t.Errorf("%d outbox rows, want 1", n)
		}
	})
}

// TestFailedCommitPublishesNothing: COMMIT itself fails (a deferred
// constraint, checked at COMMIT, after the outbox INSERT succeeded), so the
// events must not be published. MariaDB has no deferred constraints; its
// failing COMMIT is the connection cut in TestCommitConnectionCut.
func TestFailedCommitPublishesNothing(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		if tg.Dialect == driver.MySQL {
			t.Skip("SKIP: MySQL/MariaDB have no deferred constraints; see TestCommitConnectionCut")
		}
		e := testdb.New(t, tg, driver.Config{})
		pub := outboxtest.NewPublisher()
		startRelay(t, e, pub, nil)
		ctx := testCtx(t, 30*time.Second)
		var ddl []string
		if tg.Dialect == driver.Postgres {
			ddl = []string{
				"CREATE TABLE " + e.Q("parent") + " (id INTEGER PRIMARY KEY)",
				"CREATE TABLE " + e.Q("child") + " (id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES " + e.Q("parent") + " (id) DEFERRABLE INITIALLY DEFERRED)",
			}
		} else {
			ddl = []string{
				"CREATE TABLE parent (id INTEGER PRIMARY KEY)",
				"CREATE TABLE child (id INTEGER PRIMARY KEY, parent_id INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)",
			}
		}
		for _, q := range ddl {
			if _, err := e.RelayDB.Exec(q); err != nil {
				t.Fatal(err)
			}
		}
		err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+e.Q("child")+" (id, parent_id) VALUES (1, 42)"); err != nil {
				return fmt.Errorf("insert child: %w", err)
			}
			return outbox.Emit(ctx, ev("doomed", 1))
		})
		if err == nil {
			t.Fatal("COMMIT with a violated deferred constraint succeeded")
		}
		if errors.Is(err, driver.ErrWriteEvents) {
			t.Fatalf("failed at the outbox INSERT, not at COMMIT: %v", err)
		}
		if err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error { return outbox.Emit(ctx, ev("marker", 1)) }); err != nil {
			t.Fatal(err)
		}
		got, err := pub.WaitForCount(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 1 || got[0].AggregateID != "marker" {
			t.Fatalf("published %+v, want only the marker", got)
		}
	})
}

// TestInsertFailureRollsBack: when the outbox INSERT fails (a message ID
// already used by an earlier transaction), Commit returns ErrWriteEvents
// and the business change is rolled back with it.
func TestInsertFailureRollsBack(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		createOrders(t, e)
		ctx := testCtx(t, 30*time.Second)
		dup := outbox.Event{ID: "same-id", AggregateType: "order", AggregateID: "a", Type: "t", Payload: []byte(`1`)}
		if err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error { return outbox.Emit(ctx, dup) }); err != nil {
			t.Fatal(err)
		}
		err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+e.Q("orders")+" (id, seq) VALUES ('biz', 1)"); err != nil {
				return err
			}
			return outbox.Emit(ctx, dup)
		})
		if !errors.Is(err, driver.ErrWriteEvents) {
			t.Fatalf("Commit = %v, want ErrWriteEvents", err)
		}
		var n int
		if err := e.RelayDB.QueryRow("SELECT COUNT(*) FROM " + e.Q("orders")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Errorf("business row committed without its events")
		}
		if n := rowCount(t, e, ""); n != 1 {
			t.Errorf("%d outbox rows, want 1", n)
		}
		// The pool's connection is healthy afterwards.
		if err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error { return outbox.Emit(ctx, ev("after", 1)) }); err != nil {
			t.Fatal(err)
		}
	})
}

func TestEmitScopeErrors(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		ctx := testCtx(t, 30*time.Second)
		if err := outbox.Emit(ctx, ev("a", 1)); !errors.Is(err, outbox.ErrNoTransaction) {
			t.Errorf("no scope: %v", err)
		}
		sctx := outbox.NewContext(ctx)
		if err := outbox.Emit(sctx, ev("a", 1)); !errors.Is(err, outbox.ErrNoTransaction) {
			t.Errorf("scope, no tx: %v", err)
		}
		// A transaction begun without the scope does not bind.
		tx, err := e.DB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := outbox.Emit(sctx, ev("a", 1)); !errors.Is(err, outbox.ErrNoTransaction) {
			t.Errorf("tx begun without scope: %v", err)
		}
		_ = tx.Rollback()
		// Statements outside a transaction do not bind either.
		if _, err := e.DB.ExecContext(sctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		if err := outbox.Emit(sctx, ev("a", 1)); !errors.Is(err, outbox.ErrNoTransaction) {
			t.Errorf("after plain exec: %v", err)
		}
		if tg.Dialect != driver.SQLite { // SQLite allows one writer: a second BEGIN IMMEDIATE waits
			tx1, err := e.DB.BeginTx(sctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			tx2, err := e.DB.BeginTx(sctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := outbox.Emit(sctx, ev("a", 1)); !errors.Is(err, outbox.ErrConcurrentTransactions) {
				t.Errorf("two open: %v", err)
			}
			if err := tx2.Rollback(); err != nil {
				t.Fatal(err)
			}
			if err := outbox.Emit(sctx, ev("a", 1)); err != nil {
				t.Errorf("after closing one of two: %v", err)
			}
			if err := tx1.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		// Sequential transactions in one scope.
		for i := 0; i < 3; i++ {
			tx, err := e.DB.BeginTx(sctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := outbox.Emit(sctx, ev("seq", i)); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
		}
		if err := outbox.Emit(sctx, ev("a", 1)); !errors.Is(err, outbox.ErrNoTransaction) {
			t.Errorf("after commit: %v", err)
		}
		want := 3
		if tg.Dialect != driver.SQLite {
			want = 4
		}
		if n := rowCount(t, e, ""); n != want {
			t.Errorf("%d rows, want %d", n, want)
		}
	})
}

// TestRejectedEmitLeavesTransactionUsable: every bad input is refused at
// Emit with a matchable error, and the transaction still commits the good
// events around it.
func TestRejectedEmitLeavesTransactionUsable(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{Limits: outbox.Limits{MaxEvents: 3}})
		ctx := testCtx(t, 30*time.Second)
		bad := []struct {
			name string
			ev   outbox.Event
			want error
		}{
			{"missing aggregate id", outbox.Event{AggregateType: "order", Type: "t", Payload: []byte(`1`)}, outbox.ErrMissingField},
			{"not json", outbox.Event{AggregateType: "order", AggregateID: "a", Type: "t", Payload: []byte(`{`)}, outbox.ErrPayloadNotJSON},
			{"reserved header", outbox.Event{AggregateType: "order", AggregateID: "a", Type: "t", Payload: []byte(`1`), Headers: map[string]string{"Outbox-Message-Id": "x"}}, outbox.ErrReservedHeader},
			{"bad header", outbox.Event{AggregateType: "order", AggregateID: "a", Type: "t", Payload: []byte(`1`), Headers: map[string]string{"": "x"}}, outbox.ErrInvalidHeader},
			{"header value with CR LF (NATS cannot carry it)", outbox.Event{AggregateType: "order", AggregateID: "a", Type: "t", Payload: []byte(`1`), Headers: map[string]string{"h": "x\r\ny"}}, outbox.ErrInvalidHeader},
			{"header name NATS refuses", outbox.Event{AggregateType: "order", AggregateID: "a", Type: "t", Payload: []byte(`1`), Headers: map[string]string{"a:b": "x"}}, outbox.ErrInvalidHeader},
			{"too large", outbox.Event{AggregateType: "order", AggregateID: "a", Type: "t", Payload: append(append([]byte(`"`), bytes.Repeat([]byte("x"), 1<<20)...), '"')}, outbox.ErrRecordTooLarge},
			{"bad topic", outbox.Event{AggregateType: "order", AggregateID: "a", Type: "t", Payload: []byte(`1`), Topic: "no spaces"}, outbox.ErrInvalidField},
			{"duplicate id", outbox.Event{ID: "dup", AggregateType: "order", AggregateID: "a", Type: "t", Payload: []byte(`1`)}, outbox.ErrDuplicateID},
		}
		err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error {
			if err := outbox.Emit(ctx, outbox.Event{ID: "dup", AggregateType: "order", AggregateID: "a", Type: "t", Payload: []byte(`1`)}); err != nil {
				return err
			}
			for _, b := range bad {
				err := outbox.Emit(ctx, b.ev)
				if !errors.Is(err, b.want) || !errors.Is(err, outbox.ErrInvalidEvent) {
					t.Errorf("%s: Emit = %v, want %v", b.name, err, b.want)
				}
			}
			if err := outbox.Emit(ctx, ev("a", 2)); err != nil {
				return err
			}
			if err := outbox.Emit(ctx, ev("a", 3)); err != nil {
				return err
			}
			if err := outbox.Emit(ctx, ev("a", 4)); !errors.Is(err, outbox.ErrTooManyEvents) {
				t.Errorf("4th event with MaxEvents 3: %v", err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if n := rowCount(t, e, ""); n != 3 {
			t.Errorf("%d rows, want 3", n)
		}
	})
}

// TestLargeTransactionIsChunked: more events than one statement may carry
// (SQLite: 3,640 rows of 9 parameters) are written in id order.
func TestLargeTransactionIsChunked(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		const n = 8000
		e := testdb.New(t, tg, driver.Config{})
		ctx := testCtx(t, 60*time.Second)
		err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error {
			for i := 0; i < n; i++ {
				if err := outbox.Emit(ctx, ev("big", i)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		rows, err := e.RelayDB.Query("SELECT payload FROM " + e.Table + " ORDER BY id")
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		i := 0
		for rows.Next() {
			var p []byte
			if err := rows.Scan(&p); err != nil {
				t.Fatal(err)
			}
			if want := fmt.Sprintf(`{"n":%d}`, i); string(p) != want {
				t.Fatalf("row %d payload %s, want %s", i, p, want)
			}
			i++
		}
		if i != n {
			t.Fatalf("%d rows, want %d", i, n)
		}
	})
}
