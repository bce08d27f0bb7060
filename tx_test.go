package outbox_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"modernc.org/sqlite"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
)

// openSQLite registers an outbox driver of its own (name) on a fresh
// SQLite file and migrates its table.
func openSQLite(t *testing.T, name string) *sql.DB {
	t.Helper()
	ob, err := driver.Register(name, &sqlite.Driver{}, driver.Config{Dialect: driver.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	dsn := "file:" + filepath.Join(t.TempDir(), "app.db") + "?_pragma=busy_timeout(5000)&_txlock=immediate"
	db, err := sql.Open(name, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	if err := ob.Migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE orders (id TEXT PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	return db
}

// TestInTx: InTx commits the rows and events of fn, rolls both back when
// fn fails or panics, and wraps BeginTx's error.
func TestInTx(t *testing.T) {
	t.Parallel()
	db := openSQLite(t, "outbox-sqlite-intx")
	errDomain := errors.New("domain refused")
	pay := func(id string) func(ctx context.Context, tx *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id) VALUES (?)", id); err != nil {
				return err
			}
			return outbox.Emit(ctx, outbox.Event{AggregateType: "order", AggregateID: id, Type: "order.paid", Payload: []byte(`{}`)})
		}
	}
	counts := func(t *testing.T, id string) (orders, events int) {
		t.Helper()
		if err := db.QueryRow("SELECT COUNT(*) FROM orders WHERE id = ?", id).Scan(&orders); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow("SELECT COUNT(*) FROM outbox_message WHERE aggregate_id = ?", id).Scan(&events); err != nil {
			t.Fatal(err)
		}
		return orders, events
	}
	for _, tc := range []struct {
		name    string
		fn      func(id string) func(ctx context.Context, tx *sql.Tx) error
		wantErr error
		panics  bool
		want    int // orders and events committed
	}{
		{name: "Commits", fn: pay, want: 1},
		{name: "ErrorRollsBack", fn: func(id string) func(ctx context.Context, tx *sql.Tx) error {
			return func(ctx context.Context, tx *sql.Tx) error {
				if err := pay(id)(ctx, tx); err != nil {
					return err
				}
				return fmt.Errorf("paying %s: %w", id, errDomain)
			}
		}, wantErr: errDomain},
		{name: "PanicRollsBack", fn: func(id string) func(ctx context.Context, tx *sql.Tx) error {
			return func(ctx context.Context, tx *sql.Tx) error {
				if err := pay(id)(ctx, tx); err != nil {
					return err
				}
				panic("domain bug")
			}
		}, panics: true},
		{name: "InvalidEventRefused", fn: func(id string) func(ctx context.Context, tx *sql.Tx) error {
			return func(ctx context.Context, tx *sql.Tx) error {
				return outbox.Emit(ctx, outbox.Event{AggregateType: "order", AggregateID: id})
			}
		}, wantErr: outbox.ErrInvalidEvent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Not parallel: the subtests share one SQLite connection.
			id := "o-" + tc.name
			var err error
			func() {
				defer func() {
					if r := recover(); (r != nil) != tc.panics {
						t.Errorf("recovered %v, want a panic: %v", r, tc.panics)
					}
				}()
				err = outbox.InTx(t.Context(), db, tc.fn(id))
			}()
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Errorf("InTx: %v, want %v", err, tc.wantErr)
			}
			if orders, events := counts(t, id); orders != tc.want || events != tc.want {
				t.Errorf("committed %d orders and %d events, want %d of each", orders, events, tc.want)
			}
		})
	}
	t.Run("BeginFails", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		called := false
		err := outbox.InTx(ctx, db, func(context.Context, *sql.Tx) error { called = true; return nil })
		if !errors.Is(err, context.Canceled) || !errors.Is(err, outbox.ErrBegin) || errors.Is(err, outbox.ErrCommit) || called {
			t.Errorf("InTx on a cancelled context: %v (fn called: %v), want context.Canceled and ErrBegin, fn not called", err, called)
		}
	})
	t.Run("CommitFails", func(t *testing.T) {
		// fn ends the transaction itself: InTx's Commit then fails.
		err := outbox.InTx(t.Context(), db, func(_ context.Context, tx *sql.Tx) error { return tx.Rollback() })
		if !errors.Is(err, sql.ErrTxDone) || !errors.Is(err, outbox.ErrCommit) || errors.Is(err, outbox.ErrBegin) {
			t.Errorf("InTx after fn rolled back: %v, want sql.ErrTxDone and ErrCommit", err)
		}
	})
}
