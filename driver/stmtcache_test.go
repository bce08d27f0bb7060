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
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"
	"modernc.org/sqlite"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// stmtRecord is what a stmtDriver saw: prepares, executions and closes of
// the outbox INSERT (the statement text holds the INSERT's column list),
// connection closes, and statements closed after their connection.
type stmtRecord struct {
	mu          sync.Mutex
	prefix      string
	prepared    int // PrepareContext of an outbox INSERT
	stmtExecs   int // executions of a prepared outbox INSERT
	directExecs int // ExecContext of an outbox INSERT on the connection
	stmtsClosed int
	connsClosed int
	lateCloses  int  // statements closed after their connection
	failNext    bool // the next prepared-INSERT execution fails
}

func (r *stmtRecord) counts() [5]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return [5]int{r.prepared, r.stmtExecs, r.directExecs, r.stmtsClosed, r.connsClosed}
}

// insertColumns begins the column list of the commit hook's INSERT.
const insertColumns = "message_id, aggregate_type, aggregate_id, event_type, topic"

// stmtDriver wraps modernc's SQLite driver and records into rec.
type stmtDriver struct {
	sqldriver.Driver
	rec     *stmtRecord
	minimal bool // hand out connections with only the driver.Conn methods
}

func (d stmtDriver) Open(name string) (sqldriver.Conn, error) {
	c, err := d.Driver.Open(name)
	if err != nil {
		return nil, err
	}
	sc := &stmtConn{fullConn: c.(fullConn), rec: d.rec}
	if d.minimal {
		return minimalConn{sc}, nil
	}
	return sc, nil
}

type stmtConn struct {
	fullConn
	rec    *stmtRecord
	closed bool
}

func (c *stmtConn) PrepareContext(ctx context.Context, q string) (sqldriver.Stmt, error) {
	s, err := c.fullConn.PrepareContext(ctx, q)
	if err != nil || !strings.Contains(q, c.rec.prefix) {
		return s, err
	}
	c.rec.mu.Lock()
	c.rec.prepared++
	c.rec.mu.Unlock()
	return &stmtStmt{Stmt: s, conn: c}, nil
}

func (c *stmtConn) Prepare(q string) (sqldriver.Stmt, error) {
	return c.PrepareContext(context.Background(), q)
}

func (c *stmtConn) ExecContext(ctx context.Context, q string, a []sqldriver.NamedValue) (sqldriver.Result, error) {
	if strings.Contains(q, c.rec.prefix) {
		c.rec.mu.Lock()
		c.rec.directExecs++
		c.rec.mu.Unlock()
	}
	return c.fullConn.ExecContext(ctx, q, a)
}

func (c *stmtConn) Close() error {
	c.rec.mu.Lock()
	c.rec.connsClosed++
	c.closed = true
	c.rec.mu.Unlock()
	return c.fullConn.Close()
}

type stmtStmt struct {
	sqldriver.Stmt
	conn *stmtConn
}

func (s *stmtStmt) ExecContext(ctx context.Context, a []sqldriver.NamedValue) (sqldriver.Result, error) {
	r := s.conn.rec
	r.mu.Lock()
	fail := r.failNext
	r.failNext = false
	r.stmtExecs++
	r.mu.Unlock()
	if fail {
		return nil, errors.New("injected execution failure")
	}
	return s.Stmt.(sqldriver.StmtExecContext).ExecContext(ctx, a)
}

func (s *stmtStmt) Close() error {
	r := s.conn.rec
	r.mu.Lock()
	r.stmtsClosed++
	if s.conn.closed {
		r.lateCloses++
	}
	r.mu.Unlock()
	return s.Stmt.Close()
}

// minimalConn has only driver.Conn's methods: no context variants, no
// Pinger, SessionResetter, Validator or NamedValueChecker.
type minimalConn struct{ c *stmtConn }

func (m minimalConn) Prepare(q string) (sqldriver.Stmt, error) { return m.c.Prepare(q) }
func (m minimalConn) Close() error                             { return m.c.Close() }

func (m minimalConn) Begin() (sqldriver.Tx, error) {
	return m.c.BeginTx(context.Background(), sqldriver.TxOptions{})
}

// stmtDB opens a wrapped pool of one SQLite connection through a
// stmtDriver, migrated, with a business table biz.
func stmtDB(t *testing.T, cfg driver.Config, minimal bool) (*sql.DB, *stmtRecord) {
	t.Helper()
	cfg.Dialect = driver.SQLite
	ob, err := driver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rec := &stmtRecord{prefix: insertColumns}
	wd := ob.Wrap(stmtDriver{Driver: &sqlite.Driver{}, rec: rec, minimal: minimal})
	c, err := wd.(sqldriver.DriverContext).OpenConnector(testdb.SQLiteDSN(filepath.Join(t.TempDir(), "s.db")))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	ctx := context.Background()
	if err := ob.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE biz (id INTEGER)"); err != nil {
		t.Fatal(err)
	}
	return db, rec
}

// beginner is *sql.DB or *sql.Conn.
type beginner interface {
	BeginTx(context.Context, *sql.TxOptions) (*sql.Tx, error)
}

// commitEvents runs one transaction on b in a new emit scope: bizInsert
// (unless empty), then n events of aggregate, then Commit.
func commitEvents(ctx context.Context, b beginner, bizInsert, aggregate string, n int) error {
	sctx := outbox.NewContext(ctx)
	tx, err := b.BeginTx(sctx, nil)
	if err != nil {
		return err
	}
	if bizInsert != "" {
		if _, err := tx.ExecContext(sctx, bizInsert); err != nil {
			_ = tx.Rollback()
			return err
		}
	}
	for range n {
		if err := outbox.Emit(sctx, outbox.Event{AggregateType: "a", AggregateID: aggregate, Type: "t", Payload: []byte("{}")}); err != nil {
			_ = tx.Rollback()
			return err
		}
	}
	return tx.Commit()
}

// emitTx runs one transaction on db: a business INSERT and n events.
func emitTx(ctx context.Context, db beginner, n int) error {
	return commitEvents(ctx, db, "INSERT INTO biz VALUES (1)", "1", n)
}

func mustEmitTx(t *testing.T, db *sql.DB, n int) {
	t.Helper()
	if err := emitTx(context.Background(), db, n); err != nil {
		t.Fatalf("transaction with %d events: %v", n, err)
	}
}

// TestStatementCacheReusesPreparedInsert: with the cache, three commits of
// the same shape prepare the INSERT once and execute it three times;
// without it, each commit sends the INSERT itself.
func TestStatementCacheReusesPreparedInsert(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		disable bool
		want    [5]int // prepared, stmtExecs, directExecs, stmtsClosed, connsClosed
	}{
		{"cache", false, [5]int{1, 3, 0, 0, 0}},
		{"disabled", true, [5]int{0, 0, 3, 0, 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db, rec := stmtDB(t, driver.Config{DisableStatementCache: c.disable}, false)
			for range 3 {
				mustEmitTx(t, db, 2)
			}
			if got := rec.counts(); got != c.want {
				t.Errorf("prepared, stmt execs, direct execs, stmts closed, conns closed = %v, want %v", got, c.want)
			}
			var n int
			if err := db.QueryRow("SELECT COUNT(*) FROM " + driver.DefaultTable).Scan(&n); err != nil || n != 6 {
				t.Errorf("%d rows (%v), want 6", n, err)
			}
		})
	}
}

// TestStatementCacheEvictsLeastRecentlyUsed: StatementCacheSize+1 shapes
// prepare that many statements and close the least recently used one; a
// recently used shape stays prepared.
func TestStatementCacheEvictsLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	db, rec := stmtDB(t, driver.Config{}, false)
	size := driver.StatementCacheSize
	for n := 1; n <= size; n++ {
		mustEmitTx(t, db, n)
	}
	mustEmitTx(t, db, 1) // 1 is now the most recently used; 2 the least
	mustEmitTx(t, db, size+1)
	if got := rec.counts(); got[0] != size+1 || got[3] != 1 {
		t.Fatalf("after %d shapes: prepared %d, closed %d; want %d, 1", size+1, got[0], got[3], size+1)
	}
	mustEmitTx(t, db, 1) // still cached
	if got := rec.counts(); got[0] != size+1 {
		t.Errorf("1-row INSERT prepared again (%d prepares): the recently used statement was evicted", got[0])
	}
	mustEmitTx(t, db, 2) // evicted: prepared again, evicting 3
	if got := rec.counts(); got[0] != size+2 || got[3] != 2 {
		t.Errorf("2-row INSERT after eviction: prepared %d, closed %d; want %d, 2", got[0], got[3], size+2)
	}
}

// TestStatementCacheClosedWithConnection: closing the pool closes every
// cached statement, before its connection (SQLite keeps a connection with
// unfinalized statements open as a zombie).
func TestStatementCacheClosedWithConnection(t *testing.T) {
	t.Parallel()
	db, rec := stmtDB(t, driver.Config{}, false)
	for n := 1; n <= 3; n++ {
		mustEmitTx(t, db, n)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	got := rec.counts()
	if got[0] != 3 || got[3] != 3 || got[4] != 1 {
		t.Errorf("prepared %d, closed %d, connections closed %d; want 3, 3, 1", got[0], got[3], got[4])
	}
	if rec.lateCloses != 0 {
		t.Errorf("%d statements closed after their connection", rec.lateCloses)
	}
}

// TestStatementCacheDropsFailedStatement: a failed execution rolls the
// transaction back with ErrWriteEvents and drops the statement; the next
// commit prepares it again and succeeds.
func TestStatementCacheDropsFailedStatement(t *testing.T) {
	t.Parallel()
	db, rec := stmtDB(t, driver.Config{}, false)
	mustEmitTx(t, db, 1)
	rec.mu.Lock()
	rec.failNext = true
	rec.mu.Unlock()
	if err := emitTx(context.Background(), db, 1); !errors.Is(err, driver.ErrWriteEvents) {
		t.Fatalf("commit with a failing INSERT: %v, want ErrWriteEvents", err)
	}
	mustEmitTx(t, db, 1)
	if got := rec.counts(); got[0] != 2 || got[3] != 1 {
		t.Errorf("prepared %d, closed %d; want 2 (prepared again), 1 (the failed one)", got[0], got[3])
	}
	var biz, events int
	if err := db.QueryRow("SELECT (SELECT COUNT(*) FROM biz), (SELECT COUNT(*) FROM "+driver.DefaultTable+")").Scan(&biz, &events); err != nil {
		t.Fatal(err)
	}
	if biz != 2 || events != 2 {
		t.Errorf("business rows %d, events %d; want 2 and 2 (the failed transaction rolled back)", biz, events)
	}
}

// TestCachingConnWithoutOptionalInterfaces: a driver whose connections
// have only driver.Conn's methods works through the cache's connection
// wrapper as through database/sql alone: statements, pings and commits
// work, and options it cannot honour are refused, not dropped.
func TestCachingConnWithoutOptionalInterfaces(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name    string
		minimal bool
	}{{"full", false}, {"minimal", true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			db, rec := stmtDB(t, driver.Config{}, c.minimal)
			ctx := context.Background()
			if err := db.PingContext(ctx); err != nil {
				t.Fatalf("ping: %v", err)
			}
			mustEmitTx(t, db, 3)
			mustEmitTx(t, db, 3)
			var n int
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM biz WHERE id = ?", 1).Scan(&n); err != nil || n != 2 {
				t.Fatalf("query with an argument: %d, %v", n, err)
			}
			if got := rec.counts(); got[0] != 1 {
				t.Errorf("INSERT prepared %d times, want 1", got[0])
			}
			tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
			if c.minimal {
				if err == nil {
					_ = tx.Rollback()
					t.Fatal("read-only transaction begun on a driver without BeginTx; database/sql refuses it")
				}
				return
			}
			if err != nil {
				t.Fatalf("read-only transaction: %v", err)
			}
			_ = tx.Rollback()
		})
	}
}

// TestStatementCachePreparesOncePerConnection: on the servers, a pinned
// connection's three commits prepare the event INSERT once. MySQL counts
// prepares per session (Com_stmt_prepare: 3 without the cache, as
// go-sql-driver/mysql prepares, executes and closes); PostgreSQL lists the
// session's prepared statements (lib/pq had none: it used the unnamed
// statement; pgx's are its own cache's, which ours leaves alone). SQLite
// has no such view; the stmtDriver tests cover it.
func TestStatementCachePreparesOncePerConnection(t *testing.T) {
	t.Parallel()
	for _, tg := range testdb.All {
		if tg.Dialect == driver.SQLite {
			continue
		}
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			e := testdb.New(t, tg, driver.Config{})
			ctx := context.Background()
			conn, err := e.DB.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			prepares := func() int {
				t.Helper()
				var n int
				var err error
				if tg.Dialect == driver.MySQL {
					var name string
					err = conn.QueryRowContext(ctx, "SHOW SESSION STATUS LIKE 'Com_stmt_prepare'").Scan(&name, &n)
				} else {
					err = conn.QueryRowContext(ctx, "SELECT COUNT(*) FROM pg_prepared_statements WHERE statement LIKE '%"+insertColumns+"%'").Scan(&n)
				}
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			before := prepares()
			for range 3 {
				if err := commitEvents(ctx, conn, "", "1", 2); err != nil {
					t.Fatal(err)
				}
			}
			if got := prepares() - before; got != 1 {
				t.Errorf("event INSERT prepared %d times on one connection over 3 commits, want 1", got)
			}
			var n int
			if err := e.RelayDB.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+e.Table).Scan(&n); err != nil || n != 6 {
				t.Errorf("%d rows (%v), want 6", n, err)
			}
		})
	}
}

// TestStatementCacheRecoversFromDeallocateAll: PostgreSQL's DEALLOCATE ALL
// drops the cached statement behind the driver's back. The next commit
// fails with ErrWriteEvents and commits nothing (business changes roll
// back with the events: PostgreSQL aborts the transaction at the failed
// statement, so it cannot be retried inside it); the one after prepares
// again and commits.
func TestStatementCacheRecoversFromDeallocateAll(t *testing.T) {
	t.Parallel()
	for _, tg := range testdb.All {
		if tg.Dialect != driver.Postgres {
			continue
		}
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			e := testdb.New(t, tg, driver.Config{})
			ctx := context.Background()
			biz := e.Q("biz")
			if _, err := e.DB.ExecContext(ctx, "CREATE TABLE "+biz+" (id INTEGER)"); err != nil {
				t.Fatal(err)
			}
			conn, err := e.DB.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			commit := func(id int) error {
				return commitEvents(ctx, conn, "INSERT INTO "+biz+" VALUES ("+fmt.Sprint(id)+")", fmt.Sprint(id), 1)
			}
			if err := commit(1); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.ExecContext(ctx, "DEALLOCATE ALL"); err != nil {
				t.Fatal(err)
			}
			// pgx's own statement cache behaves the same way without ours.
			if err := commit(2); !errors.Is(err, driver.ErrWriteEvents) {
				t.Fatalf("commit after DEALLOCATE ALL: %v, want ErrWriteEvents", err)
			}
			if err := commit(3); err != nil {
				t.Fatalf("second commit after DEALLOCATE ALL: %v", err)
			}
			var bizRows, events int
			if err := e.RelayDB.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM "+biz+"), (SELECT COUNT(*) FROM "+e.Table+")").Scan(&bizRows, &events); err != nil {
				t.Fatal(err)
			}
			if bizRows != 2 || events != 2 {
				t.Errorf("business rows %d, events %d; want 2 each (commits 1 and 3)", bizRows, events)
			}
		})
	}
}

// TestStatementCacheCloseDoesNotWaitOnServer: closing a pool whose server
// went silent (no reset) returns at once, as without the cache. A first
// version closed the cached statements before the connection, and lib/pq's
// statement Close waits for the server's reply without a deadline: Close
// hung until TCP gave up.
func TestStatementCacheCloseDoesNotWaitOnServer(t *testing.T) {
	t.Parallel()
	for _, tg := range testdb.All {
		if tg.Name != "pq" && tg.Name != "mysql" {
			continue // pgx is not cached by us; SQLite has no network
		}
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			e := testdb.New(t, tg, driver.Config{})
			server := "127.0.0.1:5432"
			if tg.Dialect == driver.MySQL {
				server = "127.0.0.1:3306"
			}
			if !strings.Contains(e.DSN, server) {
				t.Fatalf("test DSN does not name %s; the proxy needs the address", server)
			}
			p, err := faultproxy.Start(server)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			dsn := strings.Replace(e.DSN, server, p.Addr(), 1)
			var conn sqldriver.Connector
			if tg.Name == "pq" {
				conn, err = pq.NewConnector(dsn)
			} else {
				var mc *mysql.Config
				if mc, err = mysql.ParseDSN(dsn); err == nil {
					conn, err = mysql.NewConnector(mc)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			db := sql.OpenDB(e.Outbox.WrapConnector(conn))
			db.SetMaxOpenConns(1)
			ctx := context.Background()
			for n := 1; n <= 3; n++ { // three cached statements
				if err := commitEvents(ctx, db, "", "1", n); err != nil {
					t.Fatal(err)
				}
			}
			p.Stall(true)
			done := make(chan error, 1)
			go func() { done <- db.Close() }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				p.Close() // unblock it
				<-done
				t.Fatal("db.Close blocked on a silent server for 10 s")
			}
		})
	}
}

// TestStatementCacheFollowsCurrentSchema: with an unqualified table, the
// events go where the session's current schema says, as the
// transaction's own statements do: after USE on MySQL/MariaDB (whose
// prepared statements keep the database they were prepared in, so the
// cache is off there for unqualified tables) and after SET search_path on
// PostgreSQL (which re-resolves prepared statements).
func TestStatementCacheFollowsCurrentSchema(t *testing.T) {
	t.Parallel()
	for _, tg := range testdb.All {
		if tg.Dialect == driver.SQLite {
			continue // no schemas to switch between on one connection
		}
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			// e provides two private schemas (its own and one more) and a
			// pool with an unqualified table bound to them.
			e := testdb.New(t, tg, driver.Config{})
			other := testdb.New(t, tg, driver.Config{})
			ob, err := driver.New(driver.Config{Dialect: tg.Dialect})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			use := func(schema string) string {
				if tg.Dialect == driver.MySQL {
					return "USE " + schema
				}
				return "SET search_path TO " + schema
			}
			for _, env := range []*testdb.Env{e, other} {
				c, err := env.RelayDB.Conn(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := c.ExecContext(ctx, use(env.Schema)); err != nil {
					t.Fatal(err)
				}
				stmts := strings.Split(ob.DDL(), ";\n")
				if tg.Dialect == driver.Postgres {
					// The claim function's body has semicolons of its
					// own; PostgreSQL runs the whole script at once.
					stmts = []string{ob.DDL()}
				}
				for _, stmt := range stmts {
					if strings.TrimSpace(stmt) == "" {
						continue
					}
					if _, err := c.ExecContext(ctx, stmt); err != nil {
						t.Fatalf("%s: %v", stmt, err)
					}
				}
				c.Close()
			}
			var conn sqldriver.Connector
			switch tg.Name {
			case "pq":
				conn, err = pq.NewConnector(e.DSN)
			case "pgx":
				var pc *pgx.ConnConfig
				if pc, err = pgx.ParseConfig(e.DSN); err == nil {
					conn = stdlib.GetConnector(*pc)
				}
			case "mysql":
				var mc *mysql.Config
				if mc, err = mysql.ParseDSN(e.DSN); err == nil {
					conn, err = mysql.NewConnector(mc)
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			db := sql.OpenDB(ob.WrapConnector(conn))
			defer db.Close()
			pinned, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer pinned.Close()
			for _, env := range []*testdb.Env{e, other, e} {
				if _, err := pinned.ExecContext(ctx, use(env.Schema)); err != nil {
					t.Fatal(err)
				}
				if err := commitEvents(ctx, pinned, "", env.Schema, 1); err != nil {
					t.Fatal(err)
				}
			}
			for _, c := range []struct {
				env  *testdb.Env
				want int
			}{{e, 2}, {other, 1}} {
				var n int
				q := "SELECT COUNT(*) FROM " + c.env.Schema + "." + driver.DefaultTable + " WHERE aggregate_id = '" + c.env.Schema + "'"
				if err := e.RelayDB.QueryRowContext(ctx, q).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != c.want {
					t.Errorf("%s: %d events written while it was the current schema, want %d", c.env.Schema, n, c.want)
				}
			}
		})
	}
}
