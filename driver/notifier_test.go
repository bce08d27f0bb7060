package driver_test

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// pgTargets are the PostgreSQL targets: lib/pq, pgx (extended protocol,
// pgx's own statement cache) and pgx in simple-protocol mode (PgBouncer).
var pgTargets = []testdb.Target{testdb.All[0], testdb.All[1], testdb.PgxSimple}

// recConnector records, per connection, every statement text the outbox
// wrapper sends through it and whether the connection ran a transaction.
type recConnector struct {
	sqldriver.Connector
	mu    sync.Mutex
	conns []*recConn
}

func (rc *recConnector) Connect(ctx context.Context) (sqldriver.Conn, error) {
	c, err := rc.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	r := &recConn{Conn: c}
	rc.mu.Lock()
	rc.conns = append(rc.conns, r)
	rc.mu.Unlock()
	return r, nil
}

// statements returns the statements of connections that did (tx) or did
// not run a transaction.
func (rc *recConnector) statements(tx bool) []string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []string
	for _, c := range rc.conns {
		c.mu.Lock()
		if c.tx == tx {
			out = append(out, c.stmts...)
		}
		c.mu.Unlock()
	}
	return out
}

type recConn struct {
	sqldriver.Conn
	mu    sync.Mutex
	tx    bool
	stmts []string
}

func (c *recConn) record(q string, tx bool) {
	c.mu.Lock()
	c.stmts = append(c.stmts, q)
	c.tx = c.tx || tx
	c.mu.Unlock()
}

func (c *recConn) BeginTx(ctx context.Context, opts sqldriver.TxOptions) (sqldriver.Tx, error) {
	c.record("BEGIN", true)
	return c.Conn.(sqldriver.ConnBeginTx).BeginTx(ctx, opts)
}

func (c *recConn) PrepareContext(ctx context.Context, q string) (sqldriver.Stmt, error) {
	c.record(q, false)
	return c.Conn.(sqldriver.ConnPrepareContext).PrepareContext(ctx, q)
}

func (c *recConn) ExecContext(ctx context.Context, q string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	c.record(q, false)
	return c.Conn.(sqldriver.ExecerContext).ExecContext(ctx, q, args)
}

func (c *recConn) QueryContext(ctx context.Context, q string, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	c.record(q, false)
	return c.Conn.(sqldriver.QueryerContext).QueryContext(ctx, q, args)
}

// notifyEnv is a private schema and table (its own channel) on a
// PostgreSQL target, with a pool opened through a recording connector.
type notifyEnv struct {
	e       *testdb.Env
	rec     *recConnector
	db      *sql.DB
	channel string
	base    string // the table's name without its schema
}

func newNotifyEnv(t *testing.T, tg testdb.Target, cfg driver.Config) *notifyEnv {
	t.Helper()
	base := testdb.RandomName("n_")
	e := testdb.New(t, tg, driver.Config{Table: base})
	cfg.Dialect, cfg.Table = driver.Postgres, e.Table
	ob, err := driver.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rec := &recConnector{Connector: e.Connector()}
	db := sql.OpenDB(ob.WrapConnector(rec))
	db.SetMaxOpenConns(8)
	t.Cleanup(func() { db.Close() })
	if _, err := db.Exec("CREATE TABLE " + e.Q("orders") + " (id text PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	return &notifyEnv{e: e, rec: rec, db: db, channel: ob.Channel(), base: base}
}

func (ne *notifyEnv) commit(ctx context.Context, id string) error {
	ctx = outbox.NewContext(ctx)
	tx, err := ne.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+ne.e.Q("orders")+" (id) VALUES ($1)", id); err != nil {
		return err
	}
	if err := outbox.Emit(ctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: id, Type: "t", Payload: []byte(`{}`)}); err != nil {
		return err
	}
	return tx.Commit()
}

func waitNotification(t *testing.T, ctx context.Context, ch <-chan string, what string) string {
	t.Helper()
	select {
	case p := <-ch:
		return p
	case <-ctx.Done():
		t.Fatalf("no NOTIFY %s", what)
		return ""
	}
}

// TestNotifyOutsideWritersTransactions: the writers' transactions queue
// no NOTIFY (their statements never mention pg_notify, so they never take
// PostgreSQL's notification lock at COMMIT), yet a LISTENer hears of their
// commits, from the notifier's connection, which runs no transaction.
// On the code before issue 12 the hook's INSERT carried pg_notify: this
// fails without depending on timing.
func TestNotifyOutsideWritersTransactions(t *testing.T) {
	t.Parallel()
	for _, tg := range pgTargets {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			ne := newNotifyEnv(t, tg, driver.Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			heard := testdb.Listen(t, ctx, ne.e.DSN, ne.channel)
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for w := 0; w < 8; w++ {
				wg.Add(1)
				go func(w int) {
					defer wg.Done()
					for i := 0; i < 10; i++ {
						if err := ne.commit(ctx, fmt.Sprintf("%d-%d", w, i)); err != nil {
							errs <- err
							return
						}
					}
				}(w)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			waitNotification(t, ctx, heard, "after 80 commits")
			inserts, bad := 0, 0
			for _, q := range ne.rec.statements(true) {
				if strings.Contains(strings.ToLower(q), "notify") {
					if bad++; bad == 1 {
						t.Errorf("a writer's connection sent %q", q)
					}
				}
				if strings.Contains(strings.ToLower(q), "insert") && strings.Contains(q, ne.base) {
					inserts++
				}
			}
			if bad > 1 {
				t.Errorf("... and %d more statements mentioning NOTIFY on the writers' connections", bad-1)
			}
			if inserts == 0 {
				t.Error("recorded no event INSERT on the writers' connections")
			}
			var notifies int
			for _, q := range ne.rec.statements(false) {
				if strings.Contains(q, "pg_notify('"+ne.channel+"'") {
					notifies++
				}
			}
			if notifies == 0 || notifies > 80 {
				t.Errorf("the notifier's connection sent %d NOTIFYs for 80 commits, want 1..80", notifies)
			}
			t.Logf("%d NOTIFYs for 80 commits of 8 writers", notifies)
		})
	}
}

// TestNotifierSurvivesTerminatedConnection: after the notifier's backend
// is terminated, the next commit is still announced (the notifier
// reconnects at once), from a new backend.
func TestNotifierSurvivesTerminatedConnection(t *testing.T) {
	t.Parallel()
	for _, tg := range pgTargets {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			ne := newNotifyEnv(t, tg, driver.Config{})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			heard := testdb.Listen(t, ctx, ne.e.DSN, ne.channel)
			notifierPID := func() (pid int) {
				err := ne.e.RelayDB.QueryRowContext(ctx, "SELECT pid FROM pg_stat_activity WHERE query LIKE $1 AND pid <> pg_backend_pid()",
					"SELECT pg_notify('"+ne.channel+"'%").Scan(&pid)
				if err == sql.ErrNoRows {
					return 0
				}
				if err != nil {
					t.Fatal(err)
				}
				return pid
			}
			for round := 0; round < 3; round++ {
				if err := ne.commit(ctx, fmt.Sprintf("r%d", round)); err != nil {
					t.Fatal(err)
				}
				waitNotification(t, ctx, heard, fmt.Sprintf("for the commit of round %d", round))
				var pid int
				testdb.Eventually(t, ctx, "the notifier's backend in pg_stat_activity", func() bool { pid = notifierPID(); return pid != 0 })
				if _, err := ne.e.RelayDB.ExecContext(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
					t.Fatal(err)
				}
				testdb.Eventually(t, ctx, "the terminated backend gone", func() bool { return notifierPID() == 0 })
			}
		})
	}
}

// TestDisableNotifySendsNone: with Config.DisableNotify, and in the
// log-only mode (Config.LogOnly: its events are in no table to claim), no
// statement mentions pg_notify on any connection and a LISTENer hears
// nothing: the first notification it gets is the test's own, sent after
// the pool is closed (DB.Close would have flushed a NOTIFY still owed).
func TestDisableNotifySendsNone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  driver.Config
	}{{"DisableNotify", driver.Config{DisableNotify: true}}, {"LogOnly", driver.Config{LogOnly: true}}} {
		for _, tg := range pgTargets {
			t.Run(tc.name+"/"+tg.Name, func(t *testing.T) {
				t.Parallel()
				testNotifySendsNone(t, tg, tc.cfg)
			})
		}
	}
}

func testNotifySendsNone(t *testing.T, tg testdb.Target, cfg driver.Config) {
	ne := newNotifyEnv(t, tg, cfg)
	if cfg.LogOnly {
		// Log-only writers need a pgoutput slot of the database.
		testdb.RequireLogicalWAL(t, ne.e.RelayDB)
		slot := strings.ToLower(testdb.RandomName("outbox_test_"))
		if _, err := ne.e.RelayDB.Exec("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, err := ne.e.RelayDB.Exec("SELECT pg_drop_replication_slot($1)", slot); err != nil {
				t.Errorf("dropping the test's slot %s: %v", slot, err)
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	heard := testdb.Listen(t, ctx, ne.e.DSN, ne.channel)
	for i := 0; i < 20; i++ {
		if err := ne.commit(ctx, fmt.Sprint(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := ne.db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := ne.e.RelayDB.ExecContext(ctx, "SELECT pg_notify($1, 'sentinel')", ne.channel); err != nil {
		t.Fatal(err)
	}
	if p := waitNotification(t, ctx, heard, "sentinel"); p != "sentinel" {
		t.Errorf("heard %q before the sentinel: a NOTIFY was sent", p)
	}
	for _, tx := range []bool{true, false} {
		for _, q := range ne.rec.statements(tx) {
			if strings.Contains(strings.ToLower(q), "notify") {
				t.Errorf("sent %q", q)
			}
		}
	}
}

// TestCloseFlushesOwedNotify: DB.Close sends the NOTIFY still owed for
// the last commits before it returns, so a LISTENer hears of a commit
// that returned just before Close.
func TestCloseFlushesOwedNotify(t *testing.T) {
	t.Parallel()
	ne := newNotifyEnv(t, testdb.All[1], driver.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	heard := testdb.Listen(t, ctx, ne.e.DSN, ne.channel)
	if err := ne.commit(ctx, "last"); err != nil {
		t.Fatal(err)
	}
	if err := ne.db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := ne.e.RelayDB.ExecContext(ctx, "SELECT pg_notify($1, 'sentinel')", ne.channel); err != nil {
		t.Fatal(err)
	}
	if p := waitNotification(t, ctx, heard, "for the last commit"); p != "" {
		t.Errorf("first notification %q, want the notifier's (empty payload) before the sentinel", p)
	}
}
