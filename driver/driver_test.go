package driver_test

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"
	"modernc.org/sqlite"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/partition"
)

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		cfg  driver.Config
		ok   bool
	}{
		{"defaults", driver.Config{Dialect: driver.Postgres}, true},
		{"schema table", driver.Config{Dialect: driver.MySQL, Table: "app.outbox"}, true},
		{"no dialect", driver.Config{}, false},
		{"unknown dialect", driver.Config{Dialect: "oracle"}, false},
		{"injection", driver.Config{Dialect: driver.SQLite, Table: "x; DROP TABLE y"}, false},
		{"three parts", driver.Config{Dialect: driver.Postgres, Table: "a.b.c"}, false},
		{"negative partitions", driver.Config{Dialect: driver.Postgres, Partitions: -1}, false},
		{"too many partitions", driver.Config{Dialect: driver.Postgres, Partitions: partition.MaxCount + 1}, false},
		{"negative limit", driver.Config{Dialect: driver.Postgres, Limits: outbox.Limits{MaxEvents: -1}}, false},
		{"bytes below record", driver.Config{Dialect: driver.Postgres, Limits: outbox.Limits{MaxBytes: 10, MaxRecordBytes: 100}}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ob, err := driver.New(c.cfg)
			if c.ok {
				if err != nil {
					t.Fatal(err)
				}
				got := ob.Config()
				// Partitions stays 0: the count is read from the table.
				if got.Table == "" || got.Partitions != c.cfg.Partitions {
					t.Errorf("defaults not applied: %+v", got)
				}
				return
			}
			if !errors.Is(err, driver.ErrInvalidConfig) {
				t.Fatalf("err = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

func TestDDL(t *testing.T) {
	t.Parallel()
	for _, d := range []driver.Dialect{driver.Postgres, driver.MySQL, driver.SQLite} {
		ddl, err := driver.DDL(driver.Config{Dialect: d, Table: "events"})
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"CREATE TABLE IF NOT EXISTS", "events", "message_id", "payload", "partition_key", "next_retry_at"} {
			if !strings.Contains(ddl, want) {
				t.Errorf("%s DDL lacks %q", d, want)
			}
		}
		if strings.Contains(ddl, "jsonb") || strings.Contains(ddl, " JSON") {
			t.Errorf("%s DDL uses a JSON column type; payload bytes would not round-trip", d)
		}
	}
	if _, err := driver.DDL(driver.Config{Dialect: "nope"}); !errors.Is(err, driver.ErrInvalidConfig) {
		t.Errorf("DDL with a bad dialect: %v", err)
	}
}

// TestMigrateConcurrentlyAndTwice: eight migrations of a new table at once,
// then once more, all succeed and leave the latest version.
func TestMigrateConcurrentlyAndTwice(t *testing.T) {
	t.Parallel()
	for _, tg := range testdb.All {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			e := testdb.New(t, tg, driver.Config{})
			table := "second_outbox"
			if e.Schema != "" {
				table = e.Schema + "." + table
			}
			cfg := driver.Config{Dialect: tg.Dialect, Table: table}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for i := 0; i < 8; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs <- driver.Migrate(ctx, e.RelayDB, cfg)
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := driver.Migrate(ctx, e.DB, cfg); err != nil {
				t.Fatal(err)
			}
			var n int
			if err := e.RelayDB.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+table+"_migrations").Scan(&n); err != nil {
				t.Fatal(err)
			}
			ddl, _ := driver.DDL(cfg)
			if want := strings.Count(ddl, "-- outbox schema version "); n != want {
				t.Errorf("%d recorded versions, want %d", n, want)
			}
		})
	}
}

func TestRegister(t *testing.T) {
	t.Parallel()
	name := fmt.Sprintf("outbox-test-register-%d", time.Now().UnixNano())
	ob, err := driver.Register(name, &sqlite.Driver{}, driver.Config{Dialect: driver.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := driver.Register(name, &sqlite.Driver{}, driver.Config{Dialect: driver.SQLite}); !errors.Is(err, driver.ErrDriverRegistered) {
		t.Errorf("second Register = %v, want ErrDriverRegistered", err)
	}
	if err := ob.Register("", &sqlite.Driver{}); !errors.Is(err, driver.ErrInvalidConfig) {
		t.Errorf("empty name: %v", err)
	}
	if err := ob.Register(name+"-nil", nil); !errors.Is(err, driver.ErrInvalidConfig) {
		t.Errorf("nil driver: %v", err)
	}
	db, err := sql.Open(name, testdb.SQLiteDSN(filepath.Join(t.TempDir(), "r.db")))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	if err := ob.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	wake := ob.Wakeup()
	sctx := outbox.NewContext(ctx)
	tx, err := db.BeginTx(sctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Emit(sctx, outbox.Event{AggregateType: "a", AggregateID: "1", Type: "t", Payload: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
		t.Fatal("woken before COMMIT")
	default:
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wake:
	default:
		t.Fatal("not woken after COMMIT")
	}
}

// countingDriver counts the statements its connections run.
type countingDriver struct {
	sqldriver.Driver
	n *atomic.Int64
}

func (d countingDriver) Open(name string) (sqldriver.Conn, error) {
	c, err := d.Driver.Open(name)
	if err != nil {
		return nil, err
	}
	return countingConn{c.(fullConn), d.n}, nil
}

type fullConn interface {
	sqldriver.Conn
	sqldriver.ConnBeginTx
	sqldriver.ExecerContext
	sqldriver.QueryerContext
	sqldriver.ConnPrepareContext
}

type countingConn struct {
	fullConn
	n *atomic.Int64
}

func (c countingConn) ExecContext(ctx context.Context, q string, a []sqldriver.NamedValue) (sqldriver.Result, error) {
	c.n.Add(1)
	return c.fullConn.ExecContext(ctx, q, a)
}

func (c countingConn) PrepareContext(ctx context.Context, q string) (sqldriver.Stmt, error) {
	c.n.Add(1)
	return c.fullConn.PrepareContext(ctx, q)
}

// TestNoEventsNoExtraStatements: a transaction bound to a scope that
// emitted nothing runs no statement beyond the application's own, and does
// not wake relays; one that emitted 50 events runs exactly one more.
func TestNoEventsNoExtraStatements(t *testing.T) {
	t.Parallel()
	var n atomic.Int64
	ob, err := driver.New(driver.Config{Dialect: driver.SQLite})
	if err != nil {
		t.Fatal(err)
	}
	wd := ob.Wrap(countingDriver{&sqlite.Driver{}, &n})
	db := sql.OpenDB(dsnConnector{wd, testdb.SQLiteDSN(filepath.Join(t.TempDir(), "c.db"))})
	defer db.Close()
	ctx := context.Background()
	if err := ob.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE biz (id INTEGER)"); err != nil {
		t.Fatal(err)
	}
	wake := ob.Wakeup()
	run := func(events int) int64 {
		sctx := outbox.NewContext(ctx)
		tx, err := db.BeginTx(sctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		before := n.Load()
		if _, err := tx.ExecContext(sctx, "INSERT INTO biz VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < events; i++ {
			if err := outbox.Emit(sctx, outbox.Event{AggregateType: "a", AggregateID: "1", Type: "t", Payload: []byte("{}")}); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		return n.Load() - before
	}
	if got := run(0); got != 1 {
		t.Errorf("no events: %d statements, want 1 (the application's INSERT)", got)
	}
	select {
	case <-wake:
		t.Error("relay woken by a transaction without events")
	default:
	}
	if got := run(50); got != 2 {
		t.Errorf("50 events: %d statements, want 2 (one multi-row INSERT)", got)
	}
}

type dsnConnector struct {
	d   sqldriver.Driver
	dsn string
}

func (c dsnConnector) Connect(context.Context) (sqldriver.Conn, error) { return c.d.Open(c.dsn) }
func (c dsnConnector) Driver() sqldriver.Driver                        { return c.d }

// oldServer is a target's driver whose server reports an unsupported
// version to the dialect's version query (PostgreSQL 9.6, MySQL 5.7,
// SQLite 3.30.1); every other statement reaches the real server.
type oldServer struct {
	drv sqldriver.Driver
	dsn string
}

func (c oldServer) Connect(context.Context) (sqldriver.Conn, error) {
	conn, err := c.drv.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return oldConn{conn.(fullConn)}, nil
}

func (c oldServer) Driver() sqldriver.Driver { return c.drv }

type oldConn struct{ fullConn }

func oldVersion(q string) string {
	switch {
	case strings.Contains(q, "server_version_num"):
		return "SELECT 90600"
	case strings.Contains(q, "VERSION()"):
		return "SELECT '5.7.44'"
	case strings.Contains(q, "sqlite_version()"):
		return "SELECT '3.30.1'"
	}
	return q
}

func (c oldConn) QueryContext(ctx context.Context, q string, a []sqldriver.NamedValue) (sqldriver.Rows, error) {
	return c.fullConn.QueryContext(ctx, oldVersion(q), a)
}

func (c oldConn) PrepareContext(ctx context.Context, q string) (sqldriver.Stmt, error) {
	return c.fullConn.PrepareContext(ctx, oldVersion(q))
}

// TestUnsupportedServerRefused: on every target, Migrate refuses a server
// older than the supported minimum before creating anything, and the
// commit hook refuses to write events there (the relay would never
// publish them), rolling the transaction back.
func TestUnsupportedServerRefused(t *testing.T) {
	t.Parallel()
	for _, tg := range testdb.All {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			e := testdb.New(t, tg, driver.Config{}) // a table migrated by a supported server
			var drv sqldriver.Driver
			switch tg.Name {
			case "pq":
				drv = &pq.Driver{}
			case "pgx":
				drv = stdlib.GetDefaultDriver()
			case "mysql":
				drv = &mysql.MySQLDriver{}
			default:
				drv = &sqlite.Driver{}
			}
			open := func(table string) (*driver.Outbox, *sql.DB) {
				ob, err := driver.New(driver.Config{Dialect: tg.Dialect, Table: table})
				if err != nil {
					t.Fatal(err)
				}
				db := sql.OpenDB(ob.WrapConnector(oldServer{drv: drv, dsn: e.DSN}))
				t.Cleanup(func() { db.Close() })
				if tg.Dialect == driver.SQLite {
					db.SetMaxOpenConns(1)
				}
				return ob, db
			}
			fresh := e.Q("never_migrated")
			ob, db := open(fresh)
			if err := ob.Migrate(ctx, db); !errors.Is(err, driver.ErrUnsupportedServer) {
				t.Fatalf("Migrate on an old server = %v, want ErrUnsupportedServer", err)
			}
			if v, _, err := driver.SchemaVersion(ctx, e.RelayDB, driver.Config{Dialect: tg.Dialect, Table: fresh}); err != nil || v != 0 {
				t.Fatalf("schema version %d (%v) after the refused Migrate, want 0: nothing created", v, err)
			}
			_, db = open(e.Table)
			sctx := outbox.NewContext(ctx)
			tx, err := db.BeginTx(sctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := outbox.Emit(sctx, outbox.Event{AggregateType: "a", AggregateID: "1", Type: "t", Payload: []byte(`{}`)}); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); !errors.Is(err, driver.ErrUnsupportedServer) || !errors.Is(err, driver.ErrWriteEvents) {
				t.Fatalf("commit on an old server = %v, want ErrWriteEvents and ErrUnsupportedServer", err)
			}
			var n int
			if err := e.RelayDB.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+e.Table).Scan(&n); err != nil || n != 0 {
				t.Fatalf("%d events written (%v), want none", n, err)
			}
		})
	}
}
