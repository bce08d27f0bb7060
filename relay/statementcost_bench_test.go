package relay_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// serverThreadCPU returns the CPU time MariaDB's thread for conn has used
// so far (/proc/<mariadbd>/task/<tid>/schedstat, nanoseconds), from the
// TID information_schema.PROCESSLIST reports (MariaDB 10.5+). It needs the
// server on this host; ok is false otherwise.
func serverThreadCPU(b *testing.B, ctx context.Context, conn *sql.Conn) (read func() time.Duration, ok bool) {
	b.Helper()
	var tid int64
	if err := conn.QueryRowContext(ctx, "SELECT TID FROM information_schema.PROCESSLIST WHERE ID = CONNECTION_ID()").Scan(&tid); err != nil {
		return nil, false
	}
	matches, _ := findMariadbd()
	for _, pid := range matches {
		path := fmt.Sprintf("/proc/%s/task/%d/schedstat", pid, tid)
		if _, err := os.Stat(path); err == nil {
			return func() time.Duration {
				data, err := os.ReadFile(path)
				if err != nil {
					b.Fatal(err)
				}
				ns, err := strconv.ParseInt(strings.Fields(string(data))[0], 10, 64)
				if err != nil {
					b.Fatal(err)
				}
				return time.Duration(ns)
			}, true
		}
	}
	return nil, false
}

// findMariadbd lists the PIDs of processes named mariadbd or mysqld.
func findMariadbd() ([]string, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		comm, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err != nil {
			continue
		}
		if c := strings.TrimSpace(string(comm)); c == "mariadbd" || c == "mysqld" {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// BenchmarkMySQLStatementCost measures what each statement of the relay's
// cycle costs MariaDB alone, in the server thread's own CPU time (so other
// clients of a shared server and of the machine do not count), and the
// client's wall time: per op, a commit of 2,000 events through the
// wrapped driver (the commit hook's multi-row INSERTs), the claim of those
// 2,000 rows (with the ranges a relay remembers), and their fenced
// mark-sent (one statement, as the relay sends it). Metrics are per row.
//
//	go test -run XXX -bench MySQLStatementCost -benchtime 20x ./relay/
func BenchmarkMySQLStatementCost(b *testing.B) {
	const batch, owner = 2000, "cost-owner"
	tg := testdb.All[2]
	e := testdb.New(b, tg, driver.Config{Limits: outbox.Limits{MaxEvents: batch}})
	ctx := context.Background()
	d, err := dialect.New(dialect.MySQL, e.Table)
	if err != nil {
		b.Fatal(err)
	}
	parts := make([]any, 32)
	all := make([]int, 32)
	for i := range parts {
		parts[i], all[i] = i, i
	}
	if _, err := e.RelayDB.ExecContext(ctx, d.LeaseInit(32), parts...); err != nil {
		b.Fatal(err)
	}
	if _, err := e.RelayDB.ExecContext(ctx, "UPDATE "+d.LeaseTable()+" SET owner = ?, epoch = 1, expires_at = UTC_TIMESTAMP(6) + INTERVAL 1 HOUR", owner); err != nil {
		b.Fatal(err)
	}
	rconn, err := e.RelayDB.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer rconn.Close()
	wconn, err := e.DB.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer wconn.Close()
	relayCPU, ok1 := serverThreadCPU(b, ctx, rconn)
	writerCPU, ok2 := serverThreadCPU(b, ctx, wconn)
	if !ok1 || !ok2 {
		b.Skip("SKIP: the server's threads are not visible from here (needs MariaDB 10.5+ on this host)")
	}
	var commitCPU, claimCPU, markCPU, commitWall, claimWall, markWall time.Duration
	var sent [][2]int64
	rows := 0
	for b.Loop() {
		c0, t0 := writerCPU(), time.Now()
		tctx := outbox.NewContext(ctx)
		tx, err := wconn.BeginTx(tctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; i < batch; i++ {
			if err := outbox.Emit(tctx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("agg-%d", i%256), Type: "order.paid",
				Payload: []byte(`{"order_id":"o-000000","status":"paid","amount_cents":12345,"currency":"EUR","items":3}`)}); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
		commitCPU += writerCPU() - c0
		commitWall += time.Since(t0)

		q, _ := d.ClaimExcluding(all, nil, sent)
		c0, t0 = relayCPU(), time.Now()
		res, err := rconn.QueryContext(ctx, q, batch)
		if err != nil {
			b.Fatal(err)
		}
		var ids []int64
		for res.Next() {
			var m struct {
				id                                   int64
				mid, at, aid, et, topic, ct, headers string
				part, attempts                       int
				payload                              []byte
				age                                  int64
			}
			if err := res.Scan(&m.id, &m.mid, &m.at, &m.aid, &m.et, &m.topic, &m.part, &m.ct, &m.payload, &m.headers, &m.attempts, &m.age); err != nil {
				b.Fatal(err)
			}
			ids = append(ids, m.id)
		}
		if err := res.Err(); err != nil {
			b.Fatal(err)
		}
		res.Close()
		claimCPU += relayCPU() - c0
		claimWall += time.Since(t0)
		if len(ids) != batch {
			b.Fatalf("claimed %d rows, want %d", len(ids), batch)
		}

		mq, args := d.MarkSent(ids, owner)
		c0, t0 = relayCPU(), time.Now()
		r, err := rconn.ExecContext(ctx, mq, args...)
		if err != nil {
			b.Fatal(err)
		}
		markCPU += relayCPU() - c0
		markWall += time.Since(t0)
		if n, _ := r.RowsAffected(); n != batch {
			b.Fatalf("marked %d rows sent, want %d", n, batch)
		}
		sent = dialect.IDRanges(ids, sent)
		rows += batch
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 / float64(rows) }
	b.ReportMetric(per(commitCPU), "commit-server-µs/row")
	b.ReportMetric(per(commitWall), "commit-wall-µs/row")
	b.ReportMetric(per(claimCPU), "claim-server-µs/row")
	b.ReportMetric(per(claimWall), "claim-wall-µs/row")
	b.ReportMetric(per(markCPU), "mark-server-µs/row")
	b.ReportMetric(per(markWall), "mark-wall-µs/row")
}

// backendCPU returns the CPU time PostgreSQL's backend process for conn
// has used so far (/proc/<pid>/schedstat, nanoseconds), from
// pg_backend_pid(). It needs the server on this host; ok is false
// otherwise.
func backendCPU(b *testing.B, ctx context.Context, conn *sql.Conn) (read func() time.Duration, ok bool) {
	b.Helper()
	var pid int64
	if err := conn.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return nil, false
	}
	path := fmt.Sprintf("/proc/%d/schedstat", pid)
	if _, err := os.Stat(path); err != nil {
		return nil, false
	}
	return func() time.Duration {
		data, err := os.ReadFile(path)
		if err != nil {
			b.Fatal(err)
		}
		ns, err := strconv.ParseInt(strings.Fields(string(data))[0], 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		return time.Duration(ns)
	}, true
}

// BenchmarkPostgresStatementCost is BenchmarkMySQLStatementCost on
// PostgreSQL (lib/pq): per op, a commit of 2,000 events through the
// wrapped driver, the relay's claim of them (the claim function, from the
// floor a relay would have proven: the batch's first id) and their fenced
// mark-sent, each in the server backend's own CPU time (schedstat of its
// process, so the machine's other load does not count) and the client's
// wall time, per row. The table is never analyzed and autovacuum is off
// for it (and its pending set), as in examples/bench.
//
//	go test -run XXX -bench PostgresStatementCost -benchtime 20x ./relay/
func BenchmarkPostgresStatementCost(b *testing.B) {
	const batch, owner = 2000, "cost-owner"
	e := testdb.New(b, testdb.All[0], driver.Config{Limits: outbox.Limits{MaxEvents: batch}})
	ctx := context.Background()
	d, err := dialect.New(dialect.Postgres, e.Table)
	if err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{
		"ALTER TABLE " + e.Table + " SET (autovacuum_enabled = false, toast.autovacuum_enabled = false)",
		"ALTER TABLE IF EXISTS " + e.Table + "_pending SET (autovacuum_enabled = false)",
	} {
		if _, err := e.RelayDB.ExecContext(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	parts := make([]any, 32)
	all := make([]int, 32)
	for i := range parts {
		parts[i], all[i] = i, i
	}
	if _, err := e.RelayDB.ExecContext(ctx, d.LeaseInit(32), parts...); err != nil {
		b.Fatal(err)
	}
	if _, err := e.RelayDB.ExecContext(ctx, "UPDATE "+d.LeaseTable()+" SET owner = $1, epoch = 1, expires_at = clock_timestamp() + interval '1 hour'", owner); err != nil {
		b.Fatal(err)
	}
	var epoch int64
	if err := e.RelayDB.QueryRowContext(ctx, "SELECT floor_epoch FROM "+d.MetaTable()+" WHERE id = 1").Scan(&epoch); err != nil {
		b.Fatal(err)
	}
	rconn, err := e.RelayDB.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer rconn.Close()
	wconn, err := e.DB.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer wconn.Close()
	relayCPU, ok1 := backendCPU(b, ctx, rconn)
	writerCPU, ok2 := backendCPU(b, ctx, wconn)
	if !ok1 || !ok2 {
		b.Skip("SKIP: the server's backends are not visible from here (needs PostgreSQL on this host)")
	}
	var commitCPU, claimCPU, markCPU, commitWall, claimWall, markWall time.Duration
	rows := 0
	floor := int64(0)
	for b.Loop() {
		c0, t0 := writerCPU(), time.Now()
		tctx := outbox.NewContext(ctx)
		tx, err := wconn.BeginTx(tctx, nil)
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; i < batch; i++ {
			if err := outbox.Emit(tctx, outbox.Event{AggregateType: "order", AggregateID: fmt.Sprintf("agg-%d", i%256), Type: "order.paid",
				Payload: []byte(`{"order_id":"o-000000","status":"paid","amount_cents":12345,"currency":"EUR","items":3}`)}); err != nil {
				b.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			b.Fatal(err)
		}
		commitCPU += writerCPU() - c0
		commitWall += time.Since(t0)

		c0, t0 = relayCPU(), time.Now()
		res, err := rconn.QueryContext(ctx, d.ClaimFloor(), floor, epoch, batch, dialect.IDArray(nil), dialect.IntArray(all), nil, false)
		if err != nil {
			b.Fatal(err)
		}
		var ids []int64
		for res.Next() {
			var kind int16
			var m struct {
				id                                   int64
				mid, at, aid, et, topic, ct, headers string
				part, attempts                       int
				payload                              []byte
				age, fe, pmin, seq, xid              int64
				resolved                             bool
			}
			if err := res.Scan(&kind, &m.id, &m.mid, &m.at, &m.aid, &m.et, &m.topic, &m.part, &m.ct, &m.payload, &m.headers, &m.attempts, &m.age,
				&m.fe, &m.resolved, &m.pmin, &m.seq, &m.xid); err != nil {
				b.Fatal(err)
			}
			if kind == 1 {
				ids = append(ids, m.id)
			}
		}
		if err := res.Err(); err != nil {
			b.Fatal(err)
		}
		res.Close()
		claimCPU += relayCPU() - c0
		claimWall += time.Since(t0)
		if len(ids) != batch {
			b.Fatalf("claimed %d rows, want %d", len(ids), batch)
		}

		mq, args := d.MarkSent(ids, owner)
		c0, t0 = relayCPU(), time.Now()
		r, err := rconn.ExecContext(ctx, mq, args...)
		if err != nil {
			b.Fatal(err)
		}
		markCPU += relayCPU() - c0
		markWall += time.Since(t0)
		if n, _ := r.RowsAffected(); n != batch {
			b.Fatalf("marked %d rows sent, want %d", n, batch)
		}
		floor = ids[len(ids)-1] + 1
		rows += batch
	}
	per := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 / float64(rows) }
	b.ReportMetric(per(commitCPU), "commit-server-µs/row")
	b.ReportMetric(per(commitWall), "commit-wall-µs/row")
	b.ReportMetric(per(claimCPU), "claim-server-µs/row")
	b.ReportMetric(per(claimWall), "claim-wall-µs/row")
	b.ReportMetric(per(markCPU), "mark-server-µs/row")
	b.ReportMetric(per(markWall), "mark-wall-µs/row")
}
