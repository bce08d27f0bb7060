// Package ledger is the delivery ledger the integration suites judge a
// Kafka run by (integration/tests, integration/kafkafaults): writers that
// serialize per aggregate and number its events (Write,
// WriteSerialized), the committed rows read back (Read), the consumed
// records joined with them (Check: lost, ghosts, duplicates, order of
// first deliveries per aggregate), the explanation of a bad report
// (Explain), and an Observer that fails a test on any order violation the
// relay reports (WatchOrder).
package ledger

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
)

// Row is one committed outbox row, read back from the database.
type Row struct {
	// ID is the row's outbox id; MessageID its message_id.
	ID        int64
	MessageID string
	// AggregateID is the row's aggregate (aggregate type "order" for rows
	// the writers of this package commit).
	AggregateID string
	// Seq is the payload's "seq": the aggregate's counter when the row
	// was written (0 for a payload without one).
	Seq int
}

// Read returns e's committed rows in outbox id order; it fails t on any
// error and on a payload that is not a JSON object.
func Read(t testing.TB, e *testdb.Env) []Row {
	t.Helper()
	rows, err := e.RelayDB.Query("SELECT id, message_id, aggregate_id, payload FROM " + e.Table + " ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var r Row
		var p []byte
		if err := rows.Scan(&r.ID, &r.MessageID, &r.AggregateID, &p); err != nil {
			t.Fatal(err)
		}
		var body struct{ Seq int }
		if err := json.Unmarshal(p, &body); err != nil {
			t.Fatal(err)
		}
		r.Seq = body.Seq
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Report is what Check found.
type Report struct {
	// Delivered counts rows with at least one delivery; Duplicates the
	// deliveries of a message ID delivered before; Lost the rows never
	// delivered; Ghosts the deliveries that match no row.
	Delivered, Duplicates, Lost, Ghosts int
	// OrderViolations counts first deliveries that came after the first
	// delivery of a later row (higher outbox id or seq) of the same
	// aggregate.
	OrderViolations int
	// Violations describes each order violation: the aggregate, the two
	// rows (outbox id, seq) and where each was first delivered
	// (partition/offset, producer ID), so a failure says what happened.
	Violations []string
	// Violated lists the aggregates of the violations, for Explain.
	Violated []string
	// Missing lists the aggregates of the lost rows (one entry per lost
	// row), for Explain.
	Missing []string
}

// OK reports whether nothing was lost, no ghost delivered and no
// aggregate's first deliveries were out of order. Duplicates are allowed.
func (r Report) OK() bool { return r.Lost == 0 && r.Ghosts == 0 && r.OrderViolations == 0 }

// Check joins consumed records (in the order received, duplicates
// included) with committed rows by message ID: every row delivered,
// nothing else delivered, and per aggregate the first deliveries in
// outbox id order (which, for writers serialized by a row lock, is the
// seq order they committed in).
func Check(rows []Row, recs []kafkatest.Record) Report {
	var rep Report
	byID := make(map[string]Row, len(rows))
	for _, r := range rows {
		byID[r.MessageID] = r
	}
	seen := map[string]bool{}
	last := map[string]Row{}
	lastRec := map[string]kafkatest.Record{}
	for _, rec := range recs {
		id := rec.Headers[emit.HeaderMessageID]
		row, ok := byID[id]
		switch {
		case !ok:
			rep.Ghosts++
			continue
		case seen[id]:
			rep.Duplicates++
			continue
		}
		seen[id] = true
		rep.Delivered++
		if prev, ok := last[row.AggregateID]; ok && (row.ID < prev.ID || row.Seq < prev.Seq) {
			rep.OrderViolations++
			rep.Violated = append(rep.Violated, row.AggregateID)
			pr := lastRec[row.AggregateID]
			rep.Violations = append(rep.Violations, fmt.Sprintf("%s: id %d (seq %d, partition %d offset %d, producer %d) first delivered after id %d (seq %d, partition %d offset %d, producer %d)",
				row.AggregateID, row.ID, row.Seq, rec.Partition, rec.Offset, rec.ProducerID, prev.ID, prev.Seq, pr.Partition, pr.Offset, pr.ProducerID))
		}
		last[row.AggregateID] = row
		lastRec[row.AggregateID] = rec
	}
	rep.Lost = len(rows) - rep.Delivered
	if rep.Lost > 0 {
		for _, r := range rows {
			if !seen[r.MessageID] {
				rep.Missing = append(rep.Missing, r.AggregateID)
			}
		}
	}
	return rep
}

// Explain logs, for up to three aggregates of rep's order violations and
// up to three of its lost rows, the aggregate's rows as the table holds
// them now (id, partition, status, attempts, created, sent, updated,
// last error) and its records in the order the consumer received them
// (partition, offset, producer ID, outbox id, message ID, time
// received): what a report's counts cannot say about how the order broke
// or why a row was not delivered.
func Explain(t testing.TB, e *testdb.Env, rep Report, recs []kafkatest.Record) {
	t.Helper()
	explained := map[string]bool{}
	for _, list := range [][]string{rep.Violated, rep.Missing} {
		n := 0
		for _, agg := range list {
			if n == 3 {
				break
			}
			if explained[agg] {
				continue
			}
			explained[agg] = true
			n++
			explainAggregate(t, e, agg, recs)
		}
	}
}

func explainAggregate(t testing.TB, e *testdb.Env, agg string, recs []kafkatest.Record) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "aggregate %s, rows (id partition status attempts created sent updated message_id last_error):\n", agg)
	rows, err := e.RelayDB.Query("SELECT id, partition_key, status, attempts, created_at, sent_at, updated_at, message_id, last_error FROM "+e.Table+
		" WHERE aggregate_id = "+e.Placeholder(1)+" ORDER BY id", agg)
	if err != nil {
		t.Logf("reading the rows of %s: %v", agg, err)
		return
	}
	ids := map[string]int64{}
	for rows.Next() {
		var id, part, status, attempts int64
		var created, sent, updated, lastErr sql.NullString
		var mid string
		if err := rows.Scan(&id, &part, &status, &attempts, &created, &sent, &updated, &mid, &lastErr); err != nil {
			t.Logf("scanning a row of %s: %v", agg, err)
			break
		}
		ids[mid] = id
		fmt.Fprintf(&b, "  %d %d %d %d %s %s %s %s %q\n", id, part, status, attempts, created.String, sent.String, updated.String, mid, lastErr.String)
	}
	rows.Close()
	b.WriteString("records (partition offset producer id message_id received):\n")
	for _, r := range recs {
		mid := r.Headers[emit.HeaderMessageID]
		if id, ok := ids[mid]; ok {
			fmt.Fprintf(&b, "  %d %d %d %d %s %s\n", r.Partition, r.Offset, r.ProducerID, id, mid, r.Received.Format("15:04:05.000000"))
		}
	}
	t.Log(b.String())
}

// ReadSeq returns the events Writers with SeqIDs committed in e, from
// its aggregate_seq table (aggregate agg at seq n committed the events
// "agg-1" ... "agg-n"), in aggregate and seq order, with ID 0: for the
// log-only mode, whose events are in no table. Check then orders each
// aggregate's first deliveries by seq alone.
func ReadSeq(t testing.TB, e *testdb.Env) []Row {
	t.Helper()
	rows, err := e.RelayDB.Query("SELECT id, seq FROM " + e.Q("aggregate_seq") + " ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var agg string
		var n int
		if err := rows.Scan(&agg, &n); err != nil {
			t.Fatal(err)
		}
		for s := 1; s <= n; s++ {
			out = append(out, Row{MessageID: fmt.Sprintf("%s-%d", agg, s), AggregateID: agg, Seq: s})
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// WaitFor waits until cons has delivered every one of rows (or fails t
// when ctx ends, with the report so far).
func WaitFor(t testing.TB, ctx context.Context, e *testdb.Env, cons *kafkatest.Consumer, rows []Row) {
	t.Helper()
	recs, err := cons.Wait(ctx, func(r []kafkatest.Record) bool { return Check(rows, r).Lost == 0 })
	if err != nil {
		rep := Check(rows, recs)
		Explain(t, e, rep, recs)
		t.Fatalf("%v; ledger %+v", err, rep)
	}
}

// Wait reads the committed rows of e and waits until cons has delivered
// every one of them (or fails t when ctx ends, with the report so far);
// it returns the rows.
func Wait(t testing.TB, ctx context.Context, e *testdb.Env, cons *kafkatest.Consumer) []Row {
	t.Helper()
	rows := Read(t, e)
	recs, err := cons.Wait(ctx, func(r []kafkatest.Record) bool { return Check(rows, r).Lost == 0 })
	if err != nil {
		rep := Check(rows, recs)
		Explain(t, e, rep, recs)
		t.Fatalf("%v; ledger %+v", err, rep)
	}
	return rows
}

// Writers describes serialized writers: Writers goroutines that together
// commit Total events, one per transaction, over Aggregates aggregates
// ("agg-000", "agg-001", ...; aggregate type "order"). Each transaction
// locks its aggregate's row in a table aggregate_seq of the test's
// schema (SELECT ... FOR UPDATE; on SQLite BEGIN IMMEDIATE serializes all
// writers), increments the aggregate's seq and emits it ({"seq":n}), so
// per aggregate the seq order is the commit order, and the outbox id
// order too.
type Writers struct {
	Writers, Aggregates, Total int
	// Gate, if non-nil, holds the writers back: the n-th event (counting
	// from 1) is committed only once the gate's limit is at least n, so a
	// test can let bursts of commits through when it chooses, and end the
	// run below Total (Gate.Close). Nil: the writers commit as fast as the
	// database allows.
	Gate *Gate
	// Committed, if non-nil, is incremented after each commit.
	Committed *atomic.Int64
	// SeqIDs gives each event the message ID "<aggregate>-<seq>" instead
	// of a generated one, so that the events can be listed without the
	// table (ReadSeq: the log-only mode writes no rows).
	SeqIDs bool
}

// Gate holds Writers back (see Writers.Gate). Make it with NewGate; it is
// safe for concurrent use.
type Gate struct {
	mu     sync.Mutex
	limit  int64
	closed bool          // see Close
	raised chan struct{} // closed and replaced when the limit rises or the gate closes
}

// NewGate returns a Gate that lets the first limit events through.
func NewGate(limit int64) *Gate { return &Gate{limit: limit, raised: make(chan struct{})} }

// Open raises the limit to limit (a lower limit, or a closed gate,
// changes nothing).
func (g *Gate) Open(limit int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if limit > g.limit && !g.closed {
		g.limit = limit
		g.signal()
	}
}

// Close makes the limit final: it raises it to at least min, and the
// writers stop once they committed that many events (fewer than their
// Total, if the limit is lower). It returns the final limit.
func (g *Gate) Close(min int64) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.limit = max(g.limit, min)
		g.closed = true
		g.signal()
	}
	return g.limit
}

func (g *Gate) signal() {
	close(g.raised)
	g.raised = make(chan struct{})
}

// Limit is how many events the gate lets through.
func (g *Gate) Limit() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.limit
}

// wait returns true once the limit is at least n, false if the gate
// closed below n, or ctx's error.
func (g *Gate) wait(ctx context.Context, n int64) (bool, error) {
	for {
		g.mu.Lock()
		ok, closed, raised := n <= g.limit, g.closed, g.raised
		g.mu.Unlock()
		if ok || closed {
			return ok, nil
		}
		select {
		case <-raised:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// Write creates the aggregate table in e's schema and runs the writers
// until Total events are committed; it returns the first error (a
// deadlock or lock timeout is retried up to 20 times first) or ctx's.
// It calls no testing.TB method, so it may run on any goroutine.
func (w Writers) Write(ctx context.Context, e *testdb.Env) error {
	aggTable := e.Q("aggregate_seq")
	if _, err := e.RelayDB.ExecContext(ctx, "CREATE TABLE "+aggTable+" (id VARCHAR(64) PRIMARY KEY, seq INTEGER NOT NULL)"); err != nil {
		return err
	}
	for a := 0; a < w.Aggregates; a++ {
		if _, err := e.RelayDB.ExecContext(ctx, "INSERT INTO "+aggTable+" (id, seq) VALUES ("+e.Placeholder(1)+", 0)", fmt.Sprintf("agg-%03d", a)); err != nil {
			return err
		}
	}
	sel := "SELECT seq FROM " + aggTable + " WHERE id = " + e.Placeholder(1) + e.ForUpdate()
	upd := "UPDATE " + aggTable + " SET seq = " + e.Placeholder(1) + " WHERE id = " + e.Placeholder(2)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, w.Writers)
	for n := 0; n < w.Writers; n++ {
		wg.Add(1)
		go func(n int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(n), 7))
			for {
				slot := next.Add(1)
				if slot > int64(w.Total) {
					return
				}
				if w.Gate != nil {
					ok, err := w.Gate.wait(ctx, slot)
					if err != nil {
						errs <- err
						return
					}
					if !ok {
						return // the gate closed below this slot
					}
				}
				agg := fmt.Sprintf("agg-%03d", rng.IntN(w.Aggregates))
				var err error
				for try := 0; try < 20; try++ {
					err = InTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error {
						var seq int
						if err := tx.QueryRowContext(ctx, sel, agg).Scan(&seq); err != nil {
							return err
						}
						seq++
						if _, err := tx.ExecContext(ctx, upd, seq, agg); err != nil {
							return err
						}
						ev := outbox.Event{AggregateType: "order", AggregateID: agg, Type: "order.step",
							Payload: []byte(fmt.Sprintf(`{"seq":%d}`, seq))}
						if w.SeqIDs {
							ev.ID = fmt.Sprintf("%s-%d", agg, seq)
						}
						return outbox.Emit(ctx, ev)
					})
					if err == nil || !Retryable(err) {
						break
					}
					if errors.Is(err, outbox.ErrBegin) {
						// No connection now: give the server a moment.
						select {
						case <-ctx.Done():
						case <-time.After(time.Duration(try+1) * 50 * time.Millisecond):
						}
					}
				}
				if err != nil {
					errs <- err
					return
				}
				if w.Committed != nil {
					w.Committed.Add(1)
				}
			}
		}(n)
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// WriteSerialized runs Writers{writers, aggregates, total} (see Writers)
// and fails t on an error. Call it from the test's goroutine, or from
// another one only where t.Fatal ending that goroutine is what is wanted.
func WriteSerialized(t testing.TB, ctx context.Context, e *testdb.Env, writers, aggregates, total int) {
	t.Helper()
	if err := (Writers{Writers: writers, Aggregates: aggregates, Total: total}).Write(ctx, e); err != nil {
		t.Fatal(err)
	}
}

// Retryable reports deadlocks and lock timeouts, and transactions that
// never began (outbox.ErrBegin: a new connection refused or reset by a
// loaded server; nothing was written), which a writer retries.
func Retryable(err error) bool {
	if errors.Is(err, outbox.ErrBegin) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	s := err.Error()
	return strings.Contains(s, "Deadlock") || strings.Contains(s, "deadlock") || strings.Contains(s, "SQLITE_BUSY") ||
		strings.Contains(s, "database is locked") || strings.Contains(s, "Lock wait timeout")
}

// InTx runs fn in a transaction begun on db with a fresh emit scope and
// commits (outbox.InTx); an error from fn rolls back and is returned.
func InTx(ctx context.Context, db *sql.DB, fn func(ctx context.Context, tx *sql.Tx) error) error {
	return outbox.InTx(ctx, db, fn)
}
