package migrate_test

import (
	"context"
	"database/sql"
	"errors"
	"hash/fnv"
	"strings"
	"sync"
	"testing"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/migrate"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

type bundle struct {
	ctx  context.Context
	db   *sql.DB
	plan migrate.Plan
	item string // the table the migrations create, qualified
}

// setup returns a plan of two migrations (a table, then a column) on a
// private table of tg, not yet applied.
func setup(t *testing.T, tg testdb.Target) *bundle {
	t.Helper()
	e := testdb.New(t, tg, driver.Config{})
	base := testdb.RandomName("mig")
	q := func(id string) string {
		if tg.Dialect == driver.MySQL {
			return "`" + id + "`"
		}
		return `"` + id + `"`
	}
	qualify := func(id string) string {
		if e.Schema == "" {
			return q(id)
		}
		return q(e.Schema) + "." + q(id)
	}
	item := qualify(base)
	h := fnv.New64a()
	h.Write([]byte(base))
	key := int64(h.Sum64() >> 1)
	b := &bundle{ctx: t.Context(), db: e.RelayDB, item: item}
	b.plan = migrate.Plan{
		Flavor:   string(tg.Dialect),
		Table:    qualify(base + "_migrations"),
		LockKey:  key,
		LockName: migrate.LockName("migrate_test_", key),
		Migrations: []migrate.Migration{
			{Version: 1, Name: "table", Statements: []string{"CREATE TABLE " + item + " (id INTEGER PRIMARY KEY)"}},
			{Version: 2, Name: "column", Statements: []string{"ALTER TABLE " + item + " ADD COLUMN note VARCHAR(20)"}},
		},
	}
	return b
}

func (b *bundle) versions(t *testing.T) []int {
	t.Helper()
	rows, err := b.db.QueryContext(b.ctx, "SELECT version FROM "+b.plan.Table+" ORDER BY version")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []int
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func forEach(t *testing.T, fn func(t *testing.T, tg testdb.Target)) {
	for _, tg := range []testdb.Target{testdb.All[0], testdb.All[2], testdb.All[3]} { // pq, mysql, sqlite
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, tg)
		})
	}
}

// TestRun: every version applied once, whether Run runs twice or from
// several callers at once; a newer version recorded refuses to migrate;
// a failing statement names its version and records nothing of it
// (PostgreSQL and SQLite roll the whole run back); a
// Before error stops Run before anything is created.
func TestRun(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		t.Run("ConcurrentlyAndTwice", func(t *testing.T) {
			b := setup(t, tg)
			var wg sync.WaitGroup
			errs := make([]error, 4)
			for i := range errs {
				wg.Go(func() { errs[i] = migrate.Run(b.ctx, b.db, b.plan) })
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := migrate.Run(b.ctx, b.db, b.plan); err != nil {
				t.Fatalf("second Run: %v", err)
			}
			if got := b.versions(t); len(got) != 2 || got[0] != 1 || got[1] != 2 {
				t.Fatalf("versions %v, want [1 2]", got)
			}
			if _, err := b.db.ExecContext(b.ctx, "INSERT INTO "+b.item+" (id, note) VALUES (1, 'x')"); err != nil {
				t.Fatalf("the migrated table: %v", err)
			}
		})
		t.Run("TooNew", func(t *testing.T) {
			b := setup(t, tg)
			if err := migrate.Run(b.ctx, b.db, b.plan); err != nil {
				t.Fatal(err)
			}
			older := b.plan
			older.Migrations = older.Migrations[:1]
			errOld := errors.New("test: too new")
			older.TooNew = errOld
			if err := migrate.Run(b.ctx, b.db, older); !errors.Is(err, errOld) {
				t.Fatalf("Run of an older build: %v, want %v", err, errOld)
			}
			older.TooNew = nil
			if err := migrate.Run(b.ctx, b.db, older); !errors.Is(err, migrate.ErrTooNew) {
				t.Fatalf("Run of an older build: %v, want migrate.ErrTooNew", err)
			}
		})
		t.Run("FailingStatement", func(t *testing.T) {
			b := setup(t, tg)
			bad := b.plan
			bad.Migrations = append([]migrate.Migration(nil), bad.Migrations...)
			bad.Migrations[1].Statements = []string{"ALTER TABLE " + b.item + " ADD COLUMN"}
			err := migrate.Run(b.ctx, b.db, bad)
			if err == nil || !strings.Contains(err.Error(), "version 2 (column)") {
				t.Fatalf("Run with a bad statement: %v, want an error naming version 2", err)
			}
			if tg.Dialect == driver.MySQL {
				// DDL commits implicitly: version 1 stays, recorded.
				if got := b.versions(t); len(got) != 1 || got[0] != 1 {
					t.Fatalf("versions %v after the failure, want [1]", got)
				}
			} else if _, err := b.db.ExecContext(b.ctx, "SELECT version FROM "+b.plan.Table); err == nil {
				// Transactional DDL: nothing of the run is left.
				t.Fatal("migrations table left behind by a failed run")
			}
			if err := migrate.Run(b.ctx, b.db, b.plan); err != nil {
				t.Fatalf("Run after fixing the statement: %v", err)
			}
			if got := b.versions(t); len(got) != 2 {
				t.Fatalf("versions %v, want [1 2]", got)
			}
		})
		t.Run("BeforeFails", func(t *testing.T) {
			b := setup(t, tg)
			errBefore := errors.New("test: unsupported server")
			p := b.plan
			p.Before = func(context.Context, *sql.Conn) error { return errBefore }
			if err := migrate.Run(b.ctx, b.db, p); err != errBefore {
				t.Fatalf("Run: %v, want Before's error as is", err)
			}
			if _, err := b.db.ExecContext(b.ctx, "SELECT version FROM "+b.plan.Table); err == nil {
				t.Fatal("migrations table created although Before failed")
			}
		})
	})
}

// TestRunNilDB is an error, not a panic.
func TestRunNilDB(t *testing.T) {
	t.Parallel()
	if err := migrate.Run(context.Background(), nil, migrate.Plan{}); err == nil {
		t.Fatal("Run on a nil *sql.DB: no error")
	}
}
