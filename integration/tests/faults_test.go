package tests

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// openThroughProxy opens e's database through a fault proxy, wrapped by
// e's outbox, and returns the DB, the proxy and the COMMIT pattern the
// target's driver sends.
func openThroughProxy(t *testing.T, e *testdb.Env) (*sql.DB, *faultproxy.Proxy, []byte) {
	t.Helper()
	var target string
	var open func(addr string) *sql.DB
	var pattern []byte
	switch e.Target.Name {
	case "mysql":
		mc, err := mysql.ParseDSN(e.DSN)
		if err != nil {
			t.Fatal(err)
		}
		target = mc.Addr
		pattern = []byte("\x03COMMIT") // COM_QUERY "COMMIT"
		open = func(addr string) *sql.DB {
			c := mc.Clone()
			c.Addr = addr
			conn, err := mysql.NewConnector(c)
			if err != nil {
				t.Fatal(err)
			}
			return sql.OpenDB(e.Outbox.WrapConnector(conn))
		}
	case "pq", "pgx":
		u, err := url.Parse(e.DSN)
		if err != nil {
			t.Fatal(err)
		}
		target = u.Host
		if e.Target.Name == "pq" {
			pattern = []byte("COMMIT\x00") // simple Query message
		} else {
			pattern = []byte("commit\x00")
		}
		open = func(addr string) *sql.DB {
			v := *u
			v.Host = addr
			if e.Target.Name == "pq" {
				c, err := pq.NewConnector(v.String())
				if err != nil {
					t.Fatal(err)
				}
				return sql.OpenDB(e.Outbox.WrapConnector(c))
			}
			pc, err := pgx.ParseConfig(v.String())
			if err != nil {
				t.Fatal(err)
			}
			return sql.OpenDB(e.Outbox.WrapConnector(stdlib.GetConnector(*pc)))
		}
	default:
		t.Skipf("SKIP: %s is embedded; no connection to cut", e.Target.Name)
	}
	p, err := faultproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	db := open(p.Addr())
	db.SetMaxIdleConns(0)
	t.Cleanup(func() { db.Close() })
	return db, p, pattern
}

// TestCommitConnectionCut cuts the connection at COMMIT. Before the
// server sees COMMIT: nothing is committed and nothing is published.
// After it (the outcome unknown to the client): the row decides; the
// relay publishes the events exactly if their rows exist.
func TestCommitConnectionCut(t *testing.T) {
	t.Parallel()
	for _, action := range []faultproxy.Action{faultproxy.CutBefore, faultproxy.CutAfter} {
		name := map[faultproxy.Action]string{faultproxy.CutBefore: "BeforeServerSeesCommit", faultproxy.CutAfter: "AfterServerGotCommit"}[action]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			forEachTarget(t, func(t *testing.T, tg testdb.Target) {
				if tg.Dialect == driver.SQLite {
					t.Skip("SKIP: SQLite is embedded; there is no connection to cut")
				}
				e := testdb.New(t, tg, driver.Config{})
				db, proxy, pattern := openThroughProxy(t, e)
				pub := outboxtest.NewPublisher()
				startRelay(t, e, pub, nil)
				ctx := testCtx(t, 30*time.Second)

				proxy.Arm(pattern, action)
				sctx := outbox.NewContext(ctx)
				tx, err := db.BeginTx(sctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if err := outbox.Emit(sctx, ev("cut", 1)); err != nil {
					t.Fatal(err)
				}
				if err := outbox.Emit(sctx, ev("cut", 2)); err != nil {
					t.Fatal(err)
				}
				session := sessionID(t, sctx, tx, e)
				cerr := tx.Commit()
				if proxy.Tripped.Load() != 1 {
					t.Fatalf("proxy never saw COMMIT (commit err %v)", cerr)
				}
				if cerr == nil {
					t.Fatal("Commit succeeded through a cut connection")
				}
				if errors.Is(cerr, driver.ErrWriteEvents) {
					t.Fatalf("cut hit the INSERT, not COMMIT: %v", cerr)
				}
				// The server may not even have started the COMMIT it
				// received (under load it reads it late): wait until the
				// cut session itself is gone, which it is only after the
				// server acted on the COMMIT (or never got it), before
				// reading the verdict.
				eventually(t, ctx, "the server to end the cut session", func() bool {
					return sessionGone(t, e, session)
				})
				rows := rowCount(t, e, "aggregate_id = 'cut'")
				if action == faultproxy.CutBefore && rows != 0 {
					t.Fatalf("%d rows committed although COMMIT never reached the server", rows)
				}
				if err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error { return outbox.Emit(ctx, ev("marker", 1)) }); err != nil {
					t.Fatal(err)
				}
				got, err := pub.Wait(ctx, func(m []relay.Message) bool { return len(m) > 0 && m[len(m)-1].AggregateID == "marker" })
				if err != nil {
					t.Fatal(err)
				}
				published := 0
				for _, m := range got {
					if m.AggregateID == "cut" {
						published++
					}
				}
				if published != rows {
					t.Fatalf("published %d events of the cut transaction, but %d rows exist: the row must decide", published, rows)
				}
				t.Logf("commit error %q; rows committed %d; published %d", cerr, rows, published)
			})
		})
	}
}

// sessionID returns the server's id of tx's session (PostgreSQL's backend
// pid, MySQL's connection id).
func sessionID(t *testing.T, ctx context.Context, tx *sql.Tx, e *testdb.Env) int64 {
	t.Helper()
	q := "SELECT pg_backend_pid()"
	if e.Target.Dialect == driver.MySQL {
		q = "SELECT CONNECTION_ID()"
	}
	var id int64
	if err := tx.QueryRowContext(ctx, q).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

// sessionGone reports whether the server has ended the session with id
// (sessionID): a session whose client is gone ends once the server tried
// to answer its last command, so its COMMIT, if the server got it, was
// acted on.
func sessionGone(t *testing.T, e *testdb.Env, id int64) bool {
	t.Helper()
	q := "SELECT COUNT(*) FROM pg_stat_activity WHERE pid = $1"
	if e.Target.Dialect == driver.MySQL {
		q = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = ?"
	}
	var n int
	if err := e.RelayDB.QueryRow(q, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 0
}
