package driver_test

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"modernc.org/sqlite"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/partition"
)

// meteredConn is the interface set modernc's SQLite connection has.
type meteredConn interface {
	sqldriver.Conn
	sqldriver.ConnBeginTx
	sqldriver.ConnPrepareContext
	sqldriver.ExecerContext
	sqldriver.QueryerContext
}

// meterDriver wraps modernc's SQLite driver and counts the statements that
// read the meta table (the stored partition count).
type meterDriver struct {
	sqldriver.Driver
	reads *atomic.Int64
}

func (d meterDriver) Open(name string) (sqldriver.Conn, error) {
	c, err := d.Driver.Open(name)
	if err != nil {
		return nil, err
	}
	return meterConn{meteredConn: c.(meteredConn), reads: d.reads}, nil
}

type meterConn struct {
	meteredConn
	reads *atomic.Int64
}

func (c meterConn) count(q string) {
	if strings.Contains(q, "_meta") {
		c.reads.Add(1)
	}
}

func (c meterConn) QueryContext(ctx context.Context, q string, a []sqldriver.NamedValue) (sqldriver.Rows, error) {
	c.count(q)
	return c.meteredConn.QueryContext(ctx, q, a)
}

func (c meterConn) PrepareContext(ctx context.Context, q string) (sqldriver.Stmt, error) {
	c.count(q)
	return c.meteredConn.PrepareContext(ctx, q)
}

// meteredDB opens path through ob's wrapper over meterDriver.
func meteredDB(t *testing.T, ob *driver.Outbox, path string, reads *atomic.Int64) *sql.DB {
	t.Helper()
	c, err := ob.Wrap(meterDriver{Driver: &sqlite.Driver{}, reads: reads}).(sqldriver.DriverContext).OpenConnector(testdb.SQLiteDSN(path))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return db
}

func commitOne(ctx context.Context, db *sql.DB, agg string) error {
	sctx := outbox.NewContext(ctx)
	tx, err := db.BeginTx(sctx, nil)
	if err != nil {
		return err
	}
	if err := outbox.Emit(sctx, outbox.Event{AggregateType: "a", AggregateID: agg, Type: "t", Payload: []byte("{}")}); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// TestCommitReadsStoredPartitionCountOnce: a writer's Outbox that never
// migrated reads the stored count once, at its first commit, on that
// commit's connection, and then hashes every row with it without another
// read; a failed read (table not migrated yet) fails that commit with
// ErrWriteEvents and is not cached, so the first commit after Migrate
// succeeds. An Outbox that migrated reads nothing at commit.
func TestCommitReadsStoredPartitionCountOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "p.db")
	var reads atomic.Int64
	writer, err := driver.New(driver.Config{Dialect: driver.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	db := meteredDB(t, writer, path, &reads)

	// Not migrated: the read fails, the commit fails, nothing is cached.
	if err := commitOne(ctx, db, "x"); !errors.Is(err, driver.ErrWriteEvents) {
		t.Fatalf("commit before Migrate = %v, want ErrWriteEvents", err)
	}
	if err := driver.Migrate(ctx, db, driver.Config{Dialect: driver.SQLite, Partitions: 8}); err != nil {
		t.Fatal(err)
	}
	reads.Store(0)
	for i := range 5 {
		if err := commitOne(ctx, db, string(rune('a'+i))); err != nil {
			t.Fatalf("commit %d: %v", i, err)
		}
	}
	if n := reads.Load(); n != 1 {
		t.Errorf("%d reads of the stored count over 5 commits, want 1 (the first)", n)
	}
	rows, err := db.Query("SELECT aggregate_id, partition_key FROM " + driver.DefaultTable)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var agg string
		var part int
		if err := rows.Scan(&agg, &part); err != nil {
			t.Fatal(err)
		}
		if want := partition.Of("a", agg, 8); part != want {
			t.Errorf("aggregate %s in partition %d, want %d of the stored 8", agg, part, want)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}

	// An Outbox that migrated (or checked) has the count already.
	var reads2 atomic.Int64
	migrated, err := driver.New(driver.Config{Dialect: driver.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	db2 := meteredDB(t, migrated, path, &reads2)
	if err := migrated.Check(ctx, db2); err != nil {
		t.Fatal(err)
	}
	reads2.Store(0)
	if err := commitOne(ctx, db2, "z"); err != nil {
		t.Fatal(err)
	}
	if n := reads2.Load(); n != 0 {
		t.Errorf("a checked Outbox read the stored count %d times at commit, want 0", n)
	}
}

// TestPartitionCountErrors: PartitionCount and Check name the reason a
// count cannot be used, matchable with errors.Is.
func TestPartitionCountErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := sql.Open("sqlite", testdb.SQLiteDSN(filepath.Join(t.TempDir(), "e.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ob, err := driver.New(driver.Config{Dialect: driver.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ob.PartitionCount(ctx, db); !errors.Is(err, driver.ErrSchemaMissing) {
		t.Errorf("PartitionCount on an empty database = %v, want ErrSchemaMissing", err)
	}
	if err := ob.Check(ctx, db); !errors.Is(err, driver.ErrSchemaMissing) {
		t.Errorf("Check on an empty database = %v, want ErrSchemaMissing", err)
	}
	if err := ob.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if n, err := ob.PartitionCount(ctx, db); err != nil || n != partition.DefaultCount {
		t.Errorf("PartitionCount = %d, %v; want %d", n, err, partition.DefaultCount)
	}
	if _, err := db.Exec("DELETE FROM " + driver.DefaultTable + "_meta"); err != nil {
		t.Fatal(err)
	}
	if _, err := ob.PartitionCount(ctx, db); !errors.Is(err, driver.ErrSchemaOutdated) {
		t.Errorf("PartitionCount without the row = %v, want ErrSchemaOutdated", err)
	}
	if _, err := db.Exec("INSERT INTO " + driver.DefaultTable + "_meta (id, partitions, updated_at) VALUES (1, 16, 0)"); err != nil {
		t.Fatal(err)
	}
	strict, err := driver.New(driver.Config{Dialect: driver.SQLite, Partitions: 32})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := strict.PartitionCount(ctx, db); !errors.Is(err, driver.ErrPartitionMismatch) {
		t.Errorf("PartitionCount with Partitions 32 on 16 = %v, want ErrPartitionMismatch", err)
	}
	if err := strict.Migrate(ctx, db); !errors.Is(err, driver.ErrPartitionMismatch) {
		t.Errorf("Migrate with Partitions 32 on 16 = %v, want ErrPartitionMismatch", err)
	}
	ddl, err := driver.DDL(driver.Config{Dialect: driver.Postgres, Partitions: 12})
	if err != nil || !strings.Contains(ddl, "ELSE 12 END") || !strings.Contains(ddl, "outbox_message_meta") {
		t.Errorf("DDL with Partitions 12 does not store 12 (%v):\n%s", err, ddl)
	}
}
