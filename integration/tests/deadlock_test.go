package tests

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// mysqlDeadlock is MySQL's ER_LOCK_DEADLOCK.
const mysqlDeadlock = 1213

func isDeadlock(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && me.Number == mysqlDeadlock
}

// deadlockVictims counts the statements the server rolled back as
// deadlock victims (error 1213) on the connections of victimDriver: the
// server's answer to each statement, not a log line.
type deadlockVictims struct {
	n atomic.Int64
}

func (v *deadlockVictims) note(err error) error {
	if isDeadlock(err) {
		v.n.Add(1)
	}
	return err
}

// mysqlConn is what go-sql-driver/mysql's connections implement.
type mysqlConn interface {
	sqldriver.Conn
	sqldriver.ConnBeginTx
	sqldriver.ConnPrepareContext
	sqldriver.ExecerContext
	sqldriver.QueryerContext
	sqldriver.Pinger
	sqldriver.SessionResetter
	sqldriver.Validator
	sqldriver.NamedValueChecker
}

// victimDriver is go-sql-driver/mysql with every statement's error noted.
type victimDriver struct{ v *deadlockVictims }

func (d victimDriver) Open(dsn string) (sqldriver.Conn, error) {
	c, err := (&mysql.MySQLDriver{}).Open(dsn)
	if err != nil {
		return nil, err
	}
	return victimConn{c.(mysqlConn), d.v}, nil
}

type victimConn struct {
	mysqlConn
	v *deadlockVictims
}

func (c victimConn) ExecContext(ctx context.Context, q string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	r, err := c.mysqlConn.ExecContext(ctx, q, args)
	return r, c.v.note(err)
}

func (c victimConn) QueryContext(ctx context.Context, q string, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	r, err := c.mysqlConn.QueryContext(ctx, q, args)
	return r, c.v.note(err)
}

func (c victimConn) PrepareContext(ctx context.Context, q string) (sqldriver.Stmt, error) {
	s, err := c.mysqlConn.PrepareContext(ctx, q)
	if err != nil {
		return nil, c.v.note(err)
	}
	return victimStmt{s.(mysqlStmt), c.v}, nil
}

func (c victimConn) Prepare(q string) (sqldriver.Stmt, error) {
	return c.PrepareContext(context.Background(), q)
}

type mysqlStmt interface {
	sqldriver.Stmt
	sqldriver.StmtExecContext
	sqldriver.StmtQueryContext
}

type victimStmt struct {
	mysqlStmt
	v *deadlockVictims
}

func (s victimStmt) ExecContext(ctx context.Context, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	r, err := s.mysqlStmt.ExecContext(ctx, args)
	return r, s.v.note(err)
}

func (s victimStmt) QueryContext(ctx context.Context, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	r, err := s.mysqlStmt.QueryContext(ctx, args)
	return r, s.v.note(err)
}

// innodbDeadlocks is the server's own count of deadlocks since it started
// (server-wide).
func innodbDeadlocks(t *testing.T, db *sql.DB) int64 {
	t.Helper()
	var name string
	var n int64
	if err := db.QueryRow("SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'").Scan(&name, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// latestDeadlock is the LATEST DETECTED DEADLOCK section of SHOW ENGINE
// INNODB STATUS ("" if the server has seen none).
func latestDeadlock(t *testing.T, db *sql.DB) string {
	t.Helper()
	var typ, name, status string
	if err := db.QueryRow("SHOW ENGINE INNODB STATUS").Scan(&typ, &name, &status); err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(status, "LATEST DETECTED DEADLOCK")
	if !ok {
		return ""
	}
	section, _, _ := strings.Cut(after, "\nTRANSACTIONS\n")
	return section
}

// TestNoDeadlocksAcrossLeaseHandovers runs three relays on one MariaDB
// table while writers commit 30,000 events, with short leases renewed
// every 100 ms and relays stopped and replaced again and again so that
// partitions really change hands (counted from the lease epochs). The
// server must count no deadlock (SHOW GLOBAL STATUS Innodb_deadlocks,
// delta 0). Renewal used to lock every lease row in one statement while
// the fence of a mark-sent held shared locks on lease rows in its rows'
// order: MariaDB reported "renewing leases: Error 1213 Deadlock" and
// "marking a published batch sent failed ... Deadlock", each costing a
// lease and a re-sent batch.
//
// Innodb_deadlocks is server-wide, and other tests (and, on a shared
// development server, other people) may deadlock beside this one in their
// own databases: their own business transactions do. Every deadlock rolls
// back a victim from its cycle, and a cycle through this test's private
// database is made of this test's connections only, so each of ours
// reaches one of them as error 1213: the test counts those statements (on
// every relay connection and in the writers) and fails on any. It also
// fails if the server counted deadlocks and the latest one it reports
// names this test's database; otherwise it logs the delta as another
// client's.
func TestNoDeadlocksAcrossLeaseHandovers(t *testing.T) {
	t.Parallel()
	tg := testdb.All[2]
	if tg.Dialect != driver.MySQL {
		t.Fatalf("testdb.All[2] is %s, want the MySQL target", tg.Name)
	}
	const total, perTx, writers, rounds = 30000, 10, 8, 6
	e := testdb.New(t, tg, driver.Config{})
	ctx := testCtx(t, 5*time.Minute)
	pub := outboxtest.NewPublisher()

	victims := &deadlockVictims{}
	drvName := "mysql-deadlock-victims-" + e.Schema
	sql.Register(drvName, victimDriver{victims})
	var relays []*runningRelay
	start := func(id string) *runningRelay {
		db, err := sql.Open(drvName, e.DSN)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		db.SetMaxOpenConns(2)
		return startRelayOn(t, e, db, relay.Config{Publisher: pub, PollInterval: 20 * time.Millisecond,
			BatchSize: 100, LeaseTTL: 2 * time.Second, LeaseHeartbeat: 100 * time.Millisecond, InstanceID: id, Logger: quietLogger()})
	}

	before := innodbDeadlocks(t, e.RelayDB)
	for i := 0; i < 3; i++ {
		relays = append(relays, start(fmt.Sprintf("relay-%d", i)))
	}
	testdb.Eventually(t, ctx, "three relays sharing the partitions", func() bool { return len(ownersOf(t, e)) == 3 })

	// Each writer owns its aggregates, so per aggregate the id order is
	// the commit order.
	var writerVictims atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < total/writers/perTx; i++ {
				err := inTx(ctx, e.DB, func(ctx context.Context, _ *sql.Tx) error {
					for k := 0; k < perTx; k++ {
						if err := outbox.Emit(ctx, ev(fmt.Sprintf("w%d-%02d", w, (i*perTx+k)%50), i*perTx+k)); err != nil {
							return err
						}
					}
					return nil
				})
				if isDeadlock(err) {
					writerVictims.Add(1)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}

	// Replace one relay per round while the writers run: a graceful stop
	// releases its partitions to the others, the newcomer takes its share
	// back from them.
	for round := 0; round < rounds; round++ {
		if _, err := pub.WaitForCount(ctx, total*(round+1)/(rounds+2)); err != nil {
			t.Fatal(err)
		}
		k := round % 3
		relays[k].stop(t)
		id := fmt.Sprintf("relay-%d-%d", k, round)
		relays[k] = start(id)
		testdb.Eventually(t, ctx, id+" owning partitions", func() bool { return ownersOf(t, e)[id] > 0 })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// A row is marked sent only after the broker acknowledged it.
	testdb.Eventually(t, ctx, "every row marked sent", func() bool { return rowCount(t, e, e.IsSent()) == total })
	after := innodbDeadlocks(t, e.RelayDB)
	msgs := pub.Messages()

	// Handovers: every acquisition raises a partition's epoch; the first
	// one of each partition is not a handover.
	var acquisitions int64
	if err := e.RelayDB.QueryRow("SELECT COALESCE(SUM(epoch), 0) FROM " + e.Table + "_lease").Scan(&acquisitions); err != nil {
		t.Fatal(err)
	}
	handovers := acquisitions - 32
	firsts, dups, disorder := map[string]bool{}, 0, 0
	last := map[string]int64{}
	for _, m := range msgs {
		if firsts[m.MessageID] {
			dups++
			continue
		}
		firsts[m.MessageID] = true
		if m.ID < last[m.AggregateID] {
			disorder++
		}
		last[m.AggregateID] = m.ID
	}
	t.Logf("%d events, %d published (%d duplicates), %d partition handovers, Innodb_deadlocks delta %d, deadlock victims here: relays %d, writers %d",
		total, len(msgs), dups, handovers, after-before, victims.n.Load(), writerVictims.Load())
	if handovers < rounds*3 {
		t.Fatalf("only %d partition handovers in %d rounds: the run did not exercise lease changes", handovers, rounds)
	}
	if n := victims.n.Load() + writerVictims.Load(); n > 0 {
		t.Fatalf("%d statements of this test were deadlock victims (server counted %d deadlocks)", n, after-before)
	}
	if delta := after - before; delta > 0 {
		if latest := latestDeadlock(t, e.RelayDB); strings.Contains(latest, e.Schema) {
			t.Fatalf("the server counted %d deadlocks; the latest is in this test's database:\n%s", delta, latest)
		}
		t.Logf("the server counted %d deadlocks during the run, none with a victim on this test's connections and the latest in another database: another client of the server", delta)
	}
	if len(firsts) != total || disorder != 0 {
		t.Fatalf("%d distinct events published, want %d; %d out of order", len(firsts), total, disorder)
	}
}
