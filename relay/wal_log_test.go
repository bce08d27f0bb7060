package relay_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/logmsg"
	"github.com/sqloutbox/outbox/internal/testkit/privateserver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// logEnv is walEnv for the log-only mode: the Outbox writes logical
// decoding messages instead of rows (driver.Config.LogOnly).
func logEnv(t *testing.T) (*testdb.Env, relay.WALConfig) {
	t.Helper()
	return logEnvOn(t, walTarget)
}

// logEnvOn is logEnv on target tg (a PostgreSQL driver).
func logEnvOn(t *testing.T, tg testdb.Target) (*testdb.Env, relay.WALConfig) {
	t.Helper()
	e := testdb.New(t, tg, driver.Config{LogOnly: true})
	testdb.RequireLogicalWAL(t, e.RelayDB)
	cfg := relay.WALConfig{DSN: e.DSN, Slot: strings.ToLower(testdb.RandomName("outbox_test_"))}
	dropWAL(t, e, cfg)
	return e, cfg
}

// rows counts the outbox table's rows (log-only mode: only what the relay
// wrote there).
func rows(t *testing.T, e *testdb.Env) int {
	t.Helper()
	var n int
	if err := e.RelayDB.QueryRow("SELECT count(*) FROM " + e.Table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestWALLogOnlyPublishesFromTheStream: in log-only mode the commit writes
// no row; the relay publishes every event from the slot, in order per
// aggregate, the table stays empty, and the slot's position moves past
// the events.
func TestWALLogOnlyPublishesFromTheStream(t *testing.T) {
	t.Parallel()
	e, wal := logEnv(t)
	b := walSetup(t, e, wal, nil)
	waitStreaming(t, b, wal.Slot)
	var before string
	if err := e.RelayDB.QueryRow("SELECT pg_current_wal_lsn()::text").Scan(&before); err != nil {
		t.Fatal(err)
	}
	const n = 20
	for i := 1; i <= n; i++ {
		ev := event("B", i)
		ev.Headers = map[string]string{"k": fmt.Sprint(i)}
		ev.Topic = "t.b"
		b.emit(t, event("A", i), ev)
	}
	msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) == n && len(order(m, "B")) == n })
	if err != nil {
		t.Fatal(err)
	}
	for _, agg := range []string{"A", "B"} {
		var want []string
		for i := 1; i <= n; i++ {
			want = append(want, fmt.Sprintf("%s-%d", agg, i))
		}
		if got := order(msgs, agg); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s delivered as %v", agg, got)
		}
	}
	for _, m := range msgs {
		if m.ID != 0 || m.Epoch == 0 || string(m.Payload) == "" || m.AggregateType != "acct" {
			t.Errorf("message %+v: want ID 0, a lease epoch and the emitted fields", m)
		}
		if m.AggregateID == "B" && (m.Topic != "t.b" || m.Headers["k"] == "") {
			t.Errorf("message %+v lost its topic or headers", m)
		}
	}
	if got := rows(t, e); got != 0 {
		t.Errorf("%d rows in the table, want none (log-only)", got)
	}
	eventually(t, b.ctx, "the slot confirmed past the events", func() bool {
		var past bool
		err := e.RelayDB.QueryRow("SELECT confirmed_flush_lsn > $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1", wal.Slot, before).Scan(&past)
		return err == nil && past
	})
}

// TestWALLogOnlyNeedsASlot: with no pgoutput slot in the database a
// log-only commit with events fails (ErrWriteEvents, ErrNoSlot) and
// commits nothing; one without events commits.
func TestWALLogOnlyNeedsASlot(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, walTarget, driver.Config{LogOnly: true})
	testdb.RequireLogicalWAL(t, e.RelayDB)
	var slots int
	if err := e.RelayDB.QueryRow("SELECT count(*) FROM pg_replication_slots WHERE database = current_database() AND plugin = 'pgoutput'").Scan(&slots); err != nil {
		t.Fatal(err)
	}
	if slots > 0 {
		t.Skipf("another test's slot exists in this database (%d): the check passes by design; covered when run alone", slots)
	}
	ctx := outbox.NewContext(context.Background())
	tx, err := e.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Emit(ctx, event("A", 1)); err != nil {
		t.Fatal(err)
	}
	err = tx.Commit()
	if !errors.Is(err, driver.ErrWriteEvents) || !errors.Is(err, driver.ErrNoSlot) {
		t.Fatalf("commit: %v, want ErrWriteEvents wrapping ErrNoSlot", err)
	}
}

// TestWALLogOnlyDropsWhatRolledBack: events of a rolled-back transaction
// and of a rolled-back savepoint are not published; so are not, on the
// server's side, logical decoding messages written (by hand, in the
// driver's format) inside a savepoint rolled back or a transaction rolled
// back: PostgreSQL's decoder discards an aborted subtransaction's
// transactional messages. Those of a released savepoint are published.
func TestWALLogOnlyDropsWhatRolledBack(t *testing.T) {
	t.Parallel()
	e, wal := logEnv(t)
	b := walSetup(t, e, wal, nil)
	waitStreaming(t, b, wal.Slot)
	ctx := outbox.NewContext(b.ctx)

	// Through the driver: a rolled-back transaction, then a savepoint.
	tx, err := e.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := outbox.Emit(ctx, event("R", 1)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	ctx = outbox.NewContext(b.ctx)
	tx, err = e.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustExec := func(q string, args ...any) {
		t.Helper()
		if _, err := tx.ExecContext(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}
	mustExec("SAVEPOINT s1")
	if err := outbox.Emit(ctx, event("S", 1)); err != nil {
		t.Fatal(err)
	}
	mustExec("ROLLBACK TO SAVEPOINT s1")
	if err := outbox.Emit(ctx, event("S", 2)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	// By hand, on the server: messages in the driver's format.
	msg := func(id string) []byte {
		return logmsg.Encode(nil, []logmsg.Event{{MessageID: id, AggregateType: "acct", AggregateID: "H", EventType: "t", ContentType: "text/plain", Payload: []byte(id)}})
	}
	raw, err := e.RelayDB.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	prefix := logmsg.Prefix(e.Outbox.Config().Table)
	for _, q := range []struct {
		sql string
		id  string
	}{
		{"SAVEPOINT a", ""}, {"", "H-aborted-sub"}, {"ROLLBACK TO SAVEPOINT a", ""},
		{"SAVEPOINT b", ""}, {"", "H-released-sub"}, {"RELEASE SAVEPOINT b", ""},
	} {
		if q.sql != "" {
			_, err = raw.ExecContext(b.ctx, q.sql)
		} else {
			_, err = raw.ExecContext(b.ctx, "SELECT pg_logical_emit_message(true, $1, $2::bytea)", prefix, msg(q.id))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := raw.Commit(); err != nil {
		t.Fatal(err)
	}
	raw, err = e.RelayDB.BeginTx(b.ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.ExecContext(b.ctx, "SELECT pg_logical_emit_message(true, $1, $2::bytea)", prefix, msg("H-aborted-tx")); err != nil {
		t.Fatal(err)
	}
	if err := raw.Rollback(); err != nil {
		t.Fatal(err)
	}
	// A marker committed last: once it is out, everything before it is.
	b.emit(t, event("Z", 1))
	msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "Z")) == 1 })
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range msgs {
		got = append(got, m.MessageID)
	}
	if fmt.Sprint(got) != "[S-2 H-released-sub Z-1]" {
		t.Errorf("published %v, want [S-2 H-released-sub Z-1]", got)
	}
}

// TestWALLogOnlyFailuresGoToTheTable: an event that fails is written to
// the table with its attempt and retried from there; the later events of
// its aggregate wait behind it in the table, in order; other aggregates
// are published from the stream and never touch the table.
func TestWALLogOnlyFailuresGoToTheTable(t *testing.T) {
	t.Parallel()
	e, wal := logEnv(t)
	var fails atomic.Int64
	b := walSetup(t, e, wal, func(c *relay.Config) { c.PollInterval = 50 * time.Millisecond })
	b.pub.FailWith(func(m relay.Message) error {
		if m.MessageID == "A-1" && fails.Add(1) <= 2 {
			return errors.New("transient")
		}
		return nil
	})
	waitStreaming(t, b, wal.Slot)
	b.emit(t, event("A", 1), event("B", 1))
	eventually(t, b.ctx, "A-1 failed once", func() bool { return fails.Load() >= 1 })
	b.emit(t, event("A", 2), event("B", 2))
	b.emit(t, event("A", 3), event("B", 3))
	msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 3 && len(order(m, "B")) == 3 })
	if err != nil {
		t.Fatal(err)
	}
	if got := order(msgs, "A"); fmt.Sprint(got) != "[A-1 A-2 A-3]" {
		t.Errorf("A delivered as %v", got)
	}
	if got := order(msgs, "B"); fmt.Sprint(got) != "[B-1 B-2 B-3]" {
		t.Errorf("B delivered as %v", got)
	}
	eventually(t, b.ctx, "A-1 marked sent in the table after a failed attempt", func() bool {
		s, attempts := b.status(t, "A-1")
		return s == 1 && attempts >= 1
	})
	var inTable int
	if err := e.RelayDB.QueryRow("SELECT count(*) FROM " + e.Table + " WHERE aggregate_id = 'B'").Scan(&inTable); err != nil {
		t.Fatal(err)
	}
	if inTable != 0 {
		t.Errorf("%d events of B in the table, want none: nothing of B failed", inTable)
	}
}

// TestWALLogOnlyReportsALostSlot: the slot is dropped by an operator while
// the relay is cut off from it; events committed meanwhile are lost. The
// relay creates a new slot (later events flow), records the window, and is
// not ready (ErrWALLoss) until AckWALLoss; ReadWALStatus shows the window.
func TestWALLogOnlyReportsALostSlot(t *testing.T) {
	t.Parallel()
	e, wal := logEnv(t)
	b := walSetup(t, e, wal, func(c *relay.Config) { c.HealthInterval = 50 * time.Millisecond })
	waitStreaming(t, b, wal.Slot)
	b.emit(t, event("A", 1))
	if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 1 }); err != nil {
		t.Fatal(err)
	}
	eventually(t, b.ctx, "the relay is ready", func() bool { return b.r.Ready() == nil })
	// The operator's drop: terminate the reader and drop the slot before
	// the relay reconnects (it waits 100 ms at least).
	eventually(t, b.ctx, "the slot dropped", func() bool {
		_, _ = e.RelayDB.ExecContext(b.ctx, "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL", wal.Slot)
		_, err := e.RelayDB.ExecContext(b.ctx, "SELECT pg_drop_replication_slot($1)", wal.Slot)
		return err == nil
	})
	eventually(t, b.ctx, "the relay reports the loss", func() bool { return errors.Is(b.r.Ready(), relay.ErrWALLoss) })
	st, err := relay.ReadWALStatus(b.ctx, e.Outbox, e.RelayDB, wal)
	if err != nil {
		t.Fatal(err)
	}
	if st.Loss == nil || st.Loss.From == "" || st.Loss.To == "" || st.Loss.Reason != "missing (dropped)" {
		t.Fatalf("status loss %+v, want the window", st.Loss)
	}
	b.emit(t, event("A", 2))
	if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 2 }); err != nil {
		t.Fatal(err)
	}
	loss, err := relay.AckWALLoss(b.ctx, e.Outbox, e.RelayDB, wal)
	if err != nil || loss == nil || loss.From != st.Loss.From {
		t.Fatalf("AckWALLoss: %+v, %v; want the window %+v", loss, err, st.Loss)
	}
	eventually(t, b.ctx, "the relay is ready again", func() bool { return b.r.Ready() == nil })
	if loss, err := relay.AckWALLoss(b.ctx, e.Outbox, e.RelayDB, wal); err != nil || loss != nil {
		t.Fatalf("second AckWALLoss: %+v, %v; want none", loss, err)
	}
}

// TestLogOnlyNeedsPostgres: the log-only mode is PostgreSQL's (logical
// decoding messages); other dialects refuse it.
func TestLogOnlyNeedsPostgres(t *testing.T) {
	t.Parallel()
	for _, d := range []driver.Dialect{driver.MySQL, driver.SQLite} {
		if _, err := driver.New(driver.Config{Dialect: d, LogOnly: true}); !errors.Is(err, driver.ErrInvalidConfig) {
			t.Errorf("driver.New(%s, LogOnly): %v, want ErrInvalidConfig", d, err)
		}
	}
}

// TestWALLogOnlyExactlyOnce: the exactly-once mode (a Reconciler
// publisher) with log-only writers. Its manifests name events by outbox
// id, so the relay writes every event it takes from the stream to the
// table and publishes the rows (none straight from the stream): every
// event is delivered once, in order per aggregate, with an outbox id,
// each after its partition was reconciled under the message's epoch; the
// table holds every event, sent; the slot's position moves past them.
// Before, New refused the pair with ErrInvalidConfig when the relay's
// Outbox was log-only; and when it was not (the case "relay's Outbox in
// table mode"), the exactly-once relay's reader did not decode messages,
// so the slot's position passed the writers' events and none went out.
func TestWALLogOnlyExactlyOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		logOnly bool // the relay's Outbox
	}{{"relay's Outbox log-only", true}, {"relay's Outbox in table mode", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e, wal := logEnv(t)
			if !tc.logOnly {
				ob, err := driver.New(driver.Config{Dialect: driver.Postgres, Table: e.Table})
				if err != nil {
					t.Fatal(err)
				}
				relayEnv := *e
				relayEnv.Outbox = ob
				e = &relayEnv // the writers keep e.DB, bound to the log-only Outbox
			}
			broker := newTxnBroker()
			b := walSetup(t, e, wal, func(c *relay.Config) { c.Publisher = broker })
			waitStreaming(t, b, wal.Slot)
			var before string
			if err := e.RelayDB.QueryRow("SELECT pg_current_wal_lsn()::text").Scan(&before); err != nil {
				t.Fatal(err)
			}
			const n = 30
			for i := 1; i <= n; i++ {
				b.emit(t, event("A", i), event("B", i))
			}
			eventually(t, b.ctx, fmt.Sprintf("%d events delivered", 2*n), func() bool {
				d, _, _ := broker.get()
				return len(d) >= 2*n
			})
			eventually(t, b.ctx, "every event sent in the table", func() bool {
				st, err := relay.ReadStats(b.ctx, e.Outbox, e.RelayDB)
				return err == nil && st.Pending == 0 && st.Sent == 2*n
			})
			delivered, early, _ := broker.get()
			if dup := duplicates(delivered); len(dup) > 0 || len(delivered) != 2*n {
				t.Errorf("delivered %d messages, duplicates %v; want %d, none", len(delivered), dup, 2*n)
			}
			if len(early) > 0 {
				t.Errorf("published before reconciling: %v", early)
			}
			broker.mu.Lock()
			for i, id := range broker.ids {
				if id <= 0 {
					t.Errorf("%s published with outbox id %d: a manifest cannot name it", broker.delivered[i], id)
				}
			}
			broker.mu.Unlock()
			for _, agg := range []string{"A", "B"} {
				var got, want []string
				for i := 1; i <= n; i++ {
					want = append(want, fmt.Sprintf("%s-%d", agg, i))
				}
				for _, id := range delivered {
					if strings.HasPrefix(id, agg+"-") {
						got = append(got, id)
					}
				}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("%s delivered as %v", agg, got)
				}
			}
			eventually(t, b.ctx, "the slot confirmed past the events", func() bool {
				var past bool
				err := e.RelayDB.QueryRow("SELECT confirmed_flush_lsn > $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1", wal.Slot, before).Scan(&past)
				return err == nil && past
			})
		})
	}
}

// downPublisher fails every batch as a whole while down is set.
type downPublisher struct {
	relay.Publisher
	down atomic.Bool
}

func (p *downPublisher) Publish(ctx context.Context, msgs []relay.Message) error {
	if p.down.Load() {
		return errors.New("broker unreachable")
	}
	return p.Publisher.Publish(ctx, msgs)
}

// TestWALLogOnlyOutageMovesEventsToTheTable: while the broker is down the
// relay's cycles fail; past WALConfig.SpillAfter the events committed
// meanwhile are moved from the stream to the table, so the slot's
// position moves on (the server's WAL does not pile up for the outage).
// Once the broker is back every event goes out, in order per aggregate.
func TestWALLogOnlyOutageMovesEventsToTheTable(t *testing.T) {
	t.Parallel()
	e, wal := logEnv(t)
	wal.SpillAfter = 50 * time.Millisecond
	var pub *downPublisher
	b := walSetup(t, e, wal, func(c *relay.Config) {
		pub = &downPublisher{Publisher: c.Publisher}
		c.Publisher = pub
	})
	waitStreaming(t, b, wal.Slot)
	pub.down.Store(true)
	const n = 30
	for i := 1; i <= n; i++ {
		b.emit(t, event("A", i), event("B", i))
	}
	var after string
	if err := e.RelayDB.QueryRow("SELECT pg_current_wal_lsn()::text").Scan(&after); err != nil {
		t.Fatal(err)
	}
	eventually(t, b.ctx, "the events moved to the table and the slot confirmed past them while the broker is down", func() bool {
		var past bool
		err := e.RelayDB.QueryRow("SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1", wal.Slot, after).Scan(&past)
		return err == nil && past && rows(t, e) == 2*n
	})
	if got := len(b.pub.Messages()); got != 0 {
		t.Fatalf("%d messages published while the broker was down", got)
	}
	pub.down.Store(false)
	msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) >= n && len(order(m, "B")) >= n })
	if err != nil {
		t.Fatal(err)
	}
	for _, agg := range []string{"A", "B"} {
		var want []string
		for i := 1; i <= n; i++ {
			want = append(want, fmt.Sprintf("%s-%d", agg, i))
		}
		if got := dedupe(order(msgs, agg)); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s delivered as %v", agg, got)
		}
	}
}

// TestWALLogOnlyMixedBatchKeepsCommitOrder: writers of one aggregate in
// both modes (a row writer beside the log-only one, as while a service is
// switched over) commit A-1 as a row, A-2 as a message, A-3 as a row and
// A-4 as a message while the relay is held in a publish, so that the next
// batch it takes from the stream holds all four: they go out in commit
// order, not rows first.
func TestWALLogOnlyMixedBatchKeepsCommitOrder(t *testing.T) {
	t.Parallel()
	e, wal := logEnv(t)
	_, rowDB := e.OpenWriter(t, driver.Config{})
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	b := walSetup(t, e, wal, nil)
	b.pub.FailWith(func(m relay.Message) error {
		if m.MessageID == "Z-1" {
			once.Do(func() {
				close(entered)
				<-release
			})
		}
		return nil
	})
	waitStreaming(t, b, wal.Slot)
	b.emit(t, event("Z", 1))
	select {
	case <-entered:
	case <-b.ctx.Done():
		t.Fatal("Z-1 never published")
	}
	emitOn := func(db *sql.DB, ev outbox.Event) {
		ctx := outbox.NewContext(b.ctx)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := outbox.Emit(ctx, ev); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	emitOn(rowDB, event("A", 1))
	emitOn(e.DB, event("A", 2))
	emitOn(rowDB, event("A", 3))
	emitOn(e.DB, event("A", 4))
	var lsn string
	if err := e.RelayDB.QueryRow("SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		t.Fatal(err)
	}
	// Released once the reader has buffered all four (the slot's
	// walsender has sent past their commits).
	eventually(t, b.ctx, "the stream read past A-4's commit", func() bool {
		var past bool
		err := e.RelayDB.QueryRow("SELECT sent_lsn >= $1::pg_lsn FROM pg_stat_replication WHERE application_name LIKE 'outbox-relay%' AND pid = (SELECT active_pid FROM pg_replication_slots WHERE slot_name = $2)", lsn, wal.Slot).Scan(&past)
		return err == nil && past
	})
	close(release)
	msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) >= 4 })
	if err != nil {
		t.Fatal(err)
	}
	if got := order(msgs, "A"); fmt.Sprint(got) != "[A-1 A-2 A-3 A-4]" {
		t.Errorf("A delivered as %v, want commit order", got)
	}
	for _, m := range msgs {
		if m.AggregateID == "A" && (m.ID == 0) != (m.MessageID == "A-2" || m.MessageID == "A-4") {
			t.Errorf("%s has ID %d: rows carry their id, messages 0", m.MessageID, m.ID)
		}
	}
}

// TestWALLogOnlyUnroutableDeadLetters: the unroutable policy
// (Config.DeadLetterUnroutableAfter) serves events of the log-only mode as
// it serves rows: X-1's topic is refused, so behind it are
// written to the table while Y flows from the stream; once the route has
// failed for the set time (the relay's clock moved) with Y acknowledged
// meanwhile, X-1 is dead-lettered with the route named and holds X-2.
func TestWALLogOnlyUnroutableDeadLetters(t *testing.T) {
	t.Parallel()
	e, wal := logEnv(t)
	clock := &shiftClock{}
	seen := &refusals{id: "X-1"}
	b := walSetup(t, e, wal, func(c *relay.Config) {
		c.Clock = clock
		c.Observer = seen
		c.DeadLetterUnroutableAfter = time.Minute
		c.PollInterval = 50 * time.Millisecond
	})
	b.pub.FailWith(func(m relay.Message) error {
		if m.Topic == "fu.nowhere" {
			return fmt.Errorf("%w: no stream binds subject fu.nowhere", relay.ErrUnavailable)
		}
		return nil
	})
	waitStreaming(t, b, wal.Slot)
	x1 := event("X", 1)
	x1.Topic = "fu.nowhere"
	b.emit(t, x1, event("X", 2), event("Y", 1))
	if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "Y")) >= 1 }); err != nil {
		t.Fatal(err)
	}
	eventually(t, b.ctx, "X-1's refusal recorded", func() bool { return seen.n.Load() >= 1 })
	clock.off.Store(int64(2 * time.Minute))
	b.emit(t, event("Y", 2))
	eventually(t, b.ctx, "X-1 dead-lettered in the table", func() bool { s, _ := b.status(t, "X-1"); return s == 2 })
	if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(dedupe(order(m, "Y"))) == 2 }); err != nil {
		t.Fatal(err)
	}
	var lastErr string
	if err := e.RelayDB.QueryRow("SELECT last_error FROM " + e.Table + " WHERE message_id = 'X-1'").Scan(&lastErr); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(lastErr, "topic fu.nowhere unavailable for") {
		t.Errorf("X-1's last error %q does not name the route", lastErr)
	}
	if s, _ := b.status(t, "X-2"); s != 0 || len(order(b.pub.Messages(), "X")) != 0 {
		t.Errorf("X-2 status %d, X published %v: a dead letter holds its aggregate", s, order(b.pub.Messages(), "X"))
	}
	if got := rows(t, e); got != 2 {
		t.Errorf("%d rows in the table, want X-1 and X-2 only (Y flows from the stream)", got)
	}
}

// TestWALLogOnlyRefusedRouteKeepsTheStream: X-1's topic is refused
// (ErrUnavailable) with no policy to dead-letter it: X-1 waits in the
// table and is retried there, X-2 and X-3 (committed later) wait behind
// it, and every other aggregate keeps flowing from the stream: nothing of
// Y is written to the table (before, the loop claimed the table after
// every failed cycle, so Y waited for WALConfig.SpillAfter and then went
// through the table). Once the route is fixed, X goes out in order.
func TestWALLogOnlyRefusedRouteKeepsTheStream(t *testing.T) {
	t.Parallel()
	for _, inOrder := range []bool{false, true} {
		name := "PublishErrors"
		if inOrder {
			name = "PublishInOrder" // a table claim of X alone fails as a whole
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			refusedRouteKeepsTheStream(t, inOrder)
		})
	}
}

func refusedRouteKeepsTheStream(t *testing.T, inOrder bool) {
	e, wal := logEnv(t)
	var fixed atomic.Bool
	var refusedX atomic.Int64
	fail := func(m relay.Message) error {
		if m.Topic == "fu.nowhere" && !fixed.Load() {
			refusedX.Add(1)
			return fmt.Errorf("%w: no stream binds subject fu.nowhere", relay.ErrUnavailable)
		}
		return nil
	}
	b := walSetup(t, e, wal, func(c *relay.Config) {
		c.PollInterval = 300 * time.Millisecond
		if inOrder {
			c.Publisher = &inOrderPublisher{inner: c.Publisher.(*outboxtest.Publisher), fail: fail}
		}
	})
	if !inOrder {
		b.pub.FailWith(fail)
	}
	waitStreaming(t, b, wal.Slot)
	x1 := event("X", 1)
	x1.Topic = "fu.nowhere"
	b.emit(t, x1, event("Y", 1))
	// Retried from the table once (its row was read back from the
	// stream), the loop back on the stream: X-2 comes alone in a later
	// take, where only the relay's memory of the refusal holds it back
	// (X-1 has no retry time for log_held to see).
	eventually(t, b.ctx, "X-1 refused, then retried from the table", func() bool { return refusedX.Load() >= 2 && b.r.OnStream() })
	b.emit(t, event("X", 2))
	const ys = 20
	for i := 2; i <= ys; i++ {
		b.emit(t, event("Y", i))
	}
	b.emit(t, event("X", 3))
	if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(dedupe(order(m, "Y"))) == ys }); err != nil {
		t.Fatal(err)
	}
	n := refusedX.Load()
	eventually(t, b.ctx, "X-1 retried from the table", func() bool { return refusedX.Load() >= n+2 })
	var inTable []string
	r, err := e.RelayDB.Query("SELECT message_id FROM " + e.Table + " ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	for r.Next() {
		var id string
		if err := r.Scan(&id); err != nil {
			t.Fatal(err)
		}
		inTable = append(inTable, id)
	}
	r.Close()
	if fmt.Sprint(inTable) != "[X-1 X-2 X-3]" {
		t.Errorf("table holds %v, want [X-1 X-2 X-3]: only the refused aggregate waits there", inTable)
	}
	if got := order(b.pub.Messages(), "X"); len(got) != 0 {
		t.Errorf("X published %v while X-1 is refused", got)
	}
	fixed.Store(true)
	msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "X")) >= 3 })
	if err != nil {
		t.Fatal(err)
	}
	if got := order(msgs, "X"); fmt.Sprint(got) != "[X-1 X-2 X-3]" {
		t.Errorf("X delivered as %v", got)
	}
	if got := order(msgs, "Y"); fmt.Sprint(got) != fmt.Sprint(seq("Y", ys)) {
		t.Errorf("Y delivered as %v", got)
	}
}

// seq is agg's message IDs 1..n ("agg-1" ...).
func seq(agg string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%d", agg, i+1)
	}
	return out
}

// TestWALLogOnlySurvivesAServerCrash: a private PostgreSQL server crashes
// (immediate shutdown: no checkpoint, the slot's position on disk may be
// older than the one confirmed) while the log-only relay is publishing a
// batch taken from the stream, with committed events behind it not yet
// published; it is started again, the held publish completes, and more
// are committed. Every committed event is published, each aggregate's
// first deliveries in commit order (also checked by the order watch), no
// loss is reported, and the table holds no row.
func TestWALLogOnlySurvivesAServerCrash(t *testing.T) {
	t.Parallel()
	srv := privateserver.StartPostgres(t, map[string]string{"wal_level": "logical"})
	e := testdb.NewOn(t, walTarget, srv.DSN, driver.Config{LogOnly: true})
	wal := relay.WALConfig{DSN: srv.DSN, Slot: "outbox_test_crash"}
	b := walSetup(t, e, wal, func(c *relay.Config) { c.HealthInterval = 50 * time.Millisecond })
	waitStreaming(t, b, wal.Slot)
	const aggs, perTxn, txns = 4, 5, 40 // per phase
	next := map[string]int{}
	var ids []string
	// commit writes evs in one transaction; a connection the crash broke
	// fails at BEGIN (nothing written) and is retried on another.
	commit := func(evs []outbox.Event) {
		for {
			ctx := outbox.NewContext(b.ctx)
			tx, err := e.DB.BeginTx(ctx, nil)
			if err != nil {
				if b.ctx.Err() != nil {
					t.Fatal(err)
				}
				continue
			}
			for _, ev := range evs {
				if err := outbox.Emit(ctx, ev); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	write := func() {
		for range txns {
			var evs []outbox.Event
			for range perTxn {
				agg := fmt.Sprintf("C%d", len(ids)%aggs)
				next[agg]++
				evs = append(evs, event(agg, next[agg]))
				ids = append(ids, fmt.Sprintf("%s-%d", agg, next[agg]))
			}
			commit(evs)
		}
	}
	// The publish of the phase's 101st event is held until the server
	// has crashed and come back: the events after it are taken from the
	// stream and not confirmed, and that publish succeeds only once the
	// replication connection it came on is gone.
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hold := fmt.Sprintf("C%d-%d", 100%aggs, 100/aggs+1) // the 101st event written
	b.pub.FailWith(func(m relay.Message) error {
		if m.MessageID == hold {
			once.Do(func() { close(entered); <-release })
		}
		return nil
	})
	write()
	select {
	case <-entered:
	case <-b.ctx.Done():
		t.Fatal("the 101st event was never published")
	}
	srv.Crash(t)
	srv.Start(t)
	close(release)
	published := len(b.pub.Messages())
	write()
	msgs, err := b.pub.WaitForIDs(b.ctx, ids...)
	if err != nil {
		t.Fatal(err)
	}
	for a := range aggs {
		agg := fmt.Sprintf("C%d", a)
		if got := dedupe(order(msgs, agg)); fmt.Sprint(got) != fmt.Sprint(seq(agg, next[agg])) {
			t.Errorf("%s first delivered as %v", agg, got)
		}
	}
	eventually(t, b.ctx, "the relay ready (no loss reported)", func() bool { return b.r.Ready() == nil })
	if got := rows(t, e); got != 0 {
		t.Errorf("%d rows in the table, want none", got)
	}
	t.Logf("%d deliveries of the first %d events when the server was back; %d deliveries of %d in all", published, len(ids)/2, len(msgs), len(ids))
}

// TestWALCheckFailureKeepsLogEvents: one writer transaction holds a row
// (a table-mode write; in the exactly-once mode every row the relay
// writes comes back through the stream too) and three events of a
// logical decoding message, so the stream hands them over in one batch.
// The check of the row (wal_accept) fails: it waits on a lock of the meta
// table past QueryTimeout. Before, the loop returned without giving the
// events back, and the next settle confirmed the slot past them: A-1..A-3
// were never published nor written to the table. Now they go back to
// the buffer and the row to the table claim: all are delivered, in order.
func TestWALCheckFailureKeepsLogEvents(t *testing.T) {
	t.Parallel()
	for _, eos := range []bool{false, true} {
		t.Run(fmt.Sprintf("exactly-once=%v", eos), func(t *testing.T) {
			t.Parallel()
			e, wal := logEnv(t)
			broker := newTxnBroker()
			b := walSetup(t, e, wal, func(c *relay.Config) {
				c.QueryTimeout = time.Second
				if eos {
					c.Publisher = broker
				}
			})
			delivered := deliveredIDs(b, broker, eos)
			waitStreaming(t, b, wal.Slot)
			b.emit(t, event("W", 1))
			eventually(t, b.ctx, "W-1 delivered", func() bool { return slices.Contains(delivered(), "W-1") })

			// Its own pool: the relay's (RelayDB) has 4 connections, and a
			// held one would leave the relay waiting for the pool instead
			// of the lock.
			mon, err := sql.Open("pgx", testdb.PostgresDSN(t))
			if err != nil {
				t.Fatal(err)
			}
			defer mon.Close()
			lock, err := mon.BeginTx(b.ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer lock.Rollback() //nolint:errcheck // released below
			if _, err := lock.Exec("LOCK TABLE " + e.Table + "_meta IN ACCESS EXCLUSIVE MODE"); err != nil {
				t.Fatal(err)
			}
			ctx := outbox.NewContext(b.ctx)
			tx, err := e.DB.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.ExecContext(ctx, "INSERT INTO "+e.Table+" (message_id, aggregate_type, aggregate_id, event_type, partition_key, content_type, payload) "+
				"VALUES ('R-1', 'acct', 'R', 't', 0, 'application/json', convert_to('1', 'UTF8'))"); err != nil {
				t.Fatal(err)
			}
			for i := 1; i <= 3; i++ {
				if err := outbox.Emit(ctx, event("A", i)); err != nil {
					t.Fatal(err)
				}
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			waiting := func() int { return lockWaiters(t, mon, e, "%pg_visible_in_snapshot%") }
			eventually(t, b.ctx, "the check waits on the lock", func() bool { return waiting() > 0 })
			eventually(t, b.ctx, "the check gave up (QueryTimeout)", func() bool { return waiting() == 0 })
			if err := lock.Rollback(); err != nil {
				t.Fatal(err)
			}
			b.emit(t, event("A", 4))
			eventually(t, b.ctx, "R-1 and A-1..A-4 delivered", func() bool {
				d := delivered()
				for _, id := range []string{"R-1", "A-1", "A-2", "A-3", "A-4"} {
					if !slices.Contains(d, id) {
						return false
					}
				}
				return true
			})
			var got []string
			for _, id := range delivered() {
				if strings.HasPrefix(id, "A-") {
					got = append(got, id)
				}
			}
			if fmt.Sprint(got) != "[A-1 A-2 A-3 A-4]" {
				t.Errorf("A delivered as %v", got)
			}
		})
	}
}

// TestWALLogOnlyExactlyOnceReadAgain: an exactly-once relay with log-only
// writers stops after it published events and before the slot's position
// passed them (made here by putting back a copy of the slot taken before
// the events, as if the relay had died before its status update). The
// next relay reads the events again: their rows are in the table, so none
// is written or published a second time, and the slot moves past them.
// With DeleteOnPublish the rows would be gone and each event published
// twice, so New refuses that pair. On lib/pq and pgx: the relay's spill
// runs without ON CONFLICT first and must recognise the unique violation.
func TestWALLogOnlyExactlyOnceReadAgain(t *testing.T) {
	t.Parallel()
	for _, tg := range testdb.All[:2] { // lib/pq and pgx: the unique violation that sends the spill to log_spill
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			readAgain(t, tg)
		})
	}
}

func readAgain(t *testing.T, tg testdb.Target) {
	e, wal := logEnvOn(t, tg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	broker := newTxnBroker()
	if _, err := relay.New(e.Outbox, e.RelayDB, relay.Config{Publisher: broker, Source: relay.SourceWAL, WAL: wal, DeleteOnPublish: true}); !errors.Is(err, relay.ErrInvalidConfig) {
		t.Fatalf("New with DeleteOnPublish: %v, want ErrInvalidConfig", err)
	}
	if _, err := relay.CreateWAL(ctx, e.Outbox, e.RelayDB, wal); err != nil {
		t.Fatal(err)
	}
	copied := wal.Slot + "_before"
	if _, err := e.RelayDB.ExecContext(ctx, "SELECT pg_copy_logical_replication_slot($1, $2)", wal.Slot, copied); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = e.RelayDB.Exec("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active", copied)
	})
	start := func() (*relay.Relay, func()) {
		r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{Publisher: broker, Source: relay.SourceWAL, WAL: wal,
			PollInterval: 30 * time.Second, Logger: quiet(), Observer: outboxtest.WatchOrder(t, nil)})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		var once sync.Once
		stop := func() {
			once.Do(func() {
				sctx, c := context.WithTimeout(context.Background(), 10*time.Second)
				defer c()
				if err := r.Stop(sctx); err != nil {
					t.Errorf("stop: %v", err)
				}
				if err := <-done; err != nil {
					t.Errorf("run: %v", err)
				}
			})
		}
		t.Cleanup(stop)
		eventually(t, ctx, "the relay reads the slot", r.OnStream)
		return r, stop
	}
	_, stop := start()
	b := &bundle{e: e, ctx: ctx}
	const n = 5
	for i := 1; i <= n; i++ {
		b.emit(t, event("A", i))
	}
	var after string
	if err := e.RelayDB.QueryRowContext(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&after); err != nil {
		t.Fatal(err)
	}
	eventually(t, ctx, "every event published and marked sent", func() bool {
		d, _, _ := broker.get()
		st, err := relay.ReadStats(ctx, e.Outbox, e.RelayDB)
		return len(d) == n && err == nil && st.Pending == 0 && st.Sent == n
	})
	stop()
	eventually(t, ctx, "the slot put back as it was before the events", func() bool {
		if _, err := e.RelayDB.ExecContext(ctx, "SELECT pg_drop_replication_slot($1)", wal.Slot); err != nil {
			return false // the stopped relay's walsender may hold it a moment
		}
		_, err := e.RelayDB.ExecContext(ctx, "SELECT pg_copy_logical_replication_slot($1, $2)", copied, wal.Slot)
		return err == nil
	})
	start()
	eventually(t, ctx, "the second relay read the events again and the slot passed them", func() bool {
		var past bool
		err := e.RelayDB.QueryRowContext(ctx, "SELECT confirmed_flush_lsn >= $2::pg_lsn FROM pg_replication_slots WHERE slot_name = $1", wal.Slot, after).Scan(&past)
		return err == nil && past
	})
	delivered, early, _ := broker.get()
	if dup := duplicates(delivered); len(dup) > 0 || len(delivered) != n {
		t.Errorf("delivered %v (duplicates %v); want A-1..A-%d once", delivered, dup, n)
	}
	if len(early) > 0 {
		t.Errorf("published before reconciling: %v", early)
	}
	if got := rows(t, e); got != n {
		t.Errorf("%d rows in the table, want %d (an event read again written twice?)", got, n)
	}
}

// TestWALReleasedAggregateKeepsOrder: an aggregate held in the table is
// released while the relay reads the stream. Each time A-1 holds A (dead,
// or waiting a minute for its retry), A-2, committed after it, waits in
// the table behind it while B flows, the relay is back on the stream, an
// operator releases A, and A-3 is committed: A-2 must go out before A-3
// (and a retried A-1 before both), in table mode and with log-only
// writers. Retry raised the floor epoch, which sends the relay to the
// table first; before this change Skip and DeadLetterPending with SkipDead
// did not, and A-3 went out from the stream while A-2 waited for the
// fallback poll. The relay's own SkipDead policy, which dead-letters A-1
// at its last attempt, stayed on the stream the same way; it now claims
// from the table.
func TestWALReleasedAggregateKeepsOrder(t *testing.T) {
	t.Parallel()
	permanent := fmt.Errorf("%w: refused", relay.ErrPermanent)
	retry := func(ctx context.Context, dl *relay.DeadLetters, _ int64) (int64, error) {
		return dl.Retry(ctx, relay.Selector{MessageID: "A-1"})
	}
	skip := func(ctx context.Context, dl *relay.DeadLetters, _ int64) (int64, error) {
		return dl.Skip(ctx, relay.Selector{MessageID: "A-1"})
	}
	deadLetterPending := func(ctx context.Context, dl *relay.DeadLetters, id int64) (int64, error) {
		return dl.DeadLetterPending(ctx, []int64{id}, relay.SkipDead, "skipped by the test")
	}
	for _, tc := range []struct {
		name    string
		fail    error // A-1's failure: permanent (dead) or transient (a retry in a minute)
		release func(context.Context, *relay.DeadLetters, int64) (int64, error)
		want    string
	}{
		{"Retry", permanent, retry, "[A-1 A-2 A-3]"},
		{"Skip", permanent, skip, "[A-2 A-3]"},
		{"DeadLetterPending with SkipDead", errors.New("outbox/test: transient"), deadLetterPending, "[A-2 A-3]"},
	} {
		for _, logOnly := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/log-only=%v", tc.name, logOnly), func(t *testing.T) {
				t.Parallel()
				e, wal := walEnv(t)
				if logOnly {
					e, wal = logEnv(t)
				}
				b := walSetup(t, e, wal, func(c *relay.Config) { c.RetryInitial, c.RetryMax = time.Minute, time.Minute })
				var broken atomic.Bool
				broken.Store(true)
				b.pub.FailWith(func(m relay.Message) error {
					if m.MessageID == "A-1" && broken.Load() {
						return tc.fail
					}
					return nil
				})
				waitStreaming(t, b, wal.Slot)
				b.emit(t, event("A", 1))
				var a1 int64
				eventually(t, b.ctx, "A-1 holding A", func() bool {
					var status, attempts int
					err := e.RelayDB.QueryRow("SELECT id, status, attempts FROM "+e.Table+" WHERE message_id = 'A-1'").Scan(&a1, &status, &attempts)
					return err == nil && (status == 2 || attempts == 1)
				})
				b.emit(t, event("A", 2), event("B", 1))
				if _, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "B")) == 1 }); err != nil {
					t.Fatal(err)
				}
				eventually(t, b.ctx, "the relay back on the stream", b.r.OnStream)
				if s, _ := b.status(t, "A-2"); s != 0 {
					t.Fatalf("A-2 in state %d, want pending behind A-1", s)
				}
				broken.Store(false)
				dl, err := relay.NewDeadLetters(e.Outbox, e.RelayDB)
				if err != nil {
					t.Fatal(err)
				}
				if n, err := tc.release(b.ctx, dl, a1); err != nil || n != 1 {
					t.Fatalf("%s: %d, %v", tc.name, n, err)
				}
				b.emit(t, event("A", 3))
				want := strings.Count(tc.want, "A-")
				msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) >= want })
				if err != nil {
					t.Fatal(err)
				}
				if got := order(msgs, "A"); fmt.Sprint(got) != tc.want {
					t.Errorf("A delivered as %v, want %s", got, tc.want)
				}
			})
		}
	}
	t.Run("SkipDead policy", func(t *testing.T) {
		t.Parallel()
		e, wal := walEnv(t)
		b := walSetup(t, e, wal, func(c *relay.Config) {
			c.RetryInitial, c.RetryMax = time.Second, time.Second
			c.MaxAttempts, c.DeadLetterPolicy = 2, relay.SkipDead
			c.PollInterval = 2 * time.Second // the fallback poll claims A-1 when its retry is due
		})
		b.pub.FailWith(func(m relay.Message) error {
			if m.MessageID == "A-1" {
				return errors.New("outbox/test: transient")
			}
			return nil
		})
		waitStreaming(t, b, wal.Slot)
		b.emit(t, event("A", 1))
		eventually(t, b.ctx, "A-1 waiting for its retry", func() bool { _, n := b.status(t, "A-1"); return n == 1 })
		b.emit(t, event("A", 2))
		eventually(t, b.ctx, "A-1 dead", func() bool { s, _ := b.status(t, "A-1"); return s == 2 })
		b.emit(t, event("A", 3))
		msgs, err := b.pub.Wait(b.ctx, func(m []relay.Message) bool { return len(order(m, "A")) >= 2 })
		if err != nil {
			t.Fatal(err)
		}
		if got := order(msgs, "A"); fmt.Sprint(got) != "[A-2 A-3]" {
			t.Errorf("A delivered as %v, want [A-2 A-3]", got)
		}
	})
}

// TestWALLogOnlyExactlyOnceBrokerFaults: the exactly-once mode with
// log-only writers through the broker's per-message outcomes. The first
// transactions that carry F-1 fail it (a retry counted) and abort the
// rest (ErrAborted, no attempt), and the first that carries G-1 has an
// unknown outcome though it committed (ErrOutcomeUnknown). Every event is
// delivered once, in order per aggregate, each after its partition was
// reconciled; F-1's failure held F-2 and F-3 behind it.
func TestWALLogOnlyExactlyOnceBrokerFaults(t *testing.T) {
	t.Parallel()
	e, wal := logEnv(t)
	broker := newTxnBroker()
	var failedF, unknownG atomic.Bool
	broker.answer = func(_ int, msgs []relay.Message) (bool, []error) {
		for _, m := range msgs {
			if m.MessageID == "F-1" && !failedF.Swap(true) {
				errs := make([]error, len(msgs))
				for i, o := range msgs {
					errs[i] = fmt.Errorf("outbox/test: aborted: %w", relay.ErrAborted)
					if o.MessageID == "F-1" {
						errs[i] = errFailed
					}
				}
				return false, errs
			}
			if m.MessageID == "G-1" && !unknownG.Swap(true) {
				errs := make([]error, len(msgs))
				for i := range errs {
					errs[i] = fmt.Errorf("outbox/test: commit unanswered: %w", relay.ErrOutcomeUnknown)
				}
				return true, errs // committed, but the relay does not know
			}
		}
		return true, nil
	}
	b := walSetup(t, e, wal, func(c *relay.Config) {
		c.Publisher = broker
		c.RetryInitial, c.RetryMax = 20*time.Millisecond, 50*time.Millisecond
		c.PollInterval = 200 * time.Millisecond // F-1's retry is claimed from the table
	})
	waitStreaming(t, b, wal.Slot)
	for i := 1; i <= 3; i++ {
		b.emit(t, event("F", i), event("G", i), event("H", i))
	}
	eventually(t, b.ctx, "every event sent", func() bool {
		st, err := relay.ReadStats(b.ctx, e.Outbox, e.RelayDB)
		return err == nil && st.Pending == 0 && st.Sent == 9
	})
	delivered, early, _ := broker.get()
	if dup := duplicates(delivered); len(dup) > 0 || len(delivered) != 9 {
		t.Errorf("delivered %v (duplicates %v); want 9, each once", delivered, dup)
	}
	if len(early) > 0 {
		t.Errorf("published before reconciling: %v", early)
	}
	for _, agg := range []string{"F", "G", "H"} {
		var got []string
		for _, id := range delivered {
			if strings.HasPrefix(id, agg+"-") {
				got = append(got, id)
			}
		}
		if want := fmt.Sprintf("[%[1]s-1 %[1]s-2 %[1]s-3]", agg); fmt.Sprint(got) != want {
			t.Errorf("aggregate %s delivered %v, want %s", agg, got, want)
		}
	}
	if !failedF.Load() || !unknownG.Load() {
		t.Errorf("faults injected: F-1 failed %v, G-1 unknown %v", failedF.Load(), unknownG.Load())
	}
	if _, a := b.status(t, "F-1"); a != 1 {
		t.Errorf("F-1: %d attempts, want 1", a)
	}
}

// TestWALLogOnlyHeldBehindARetryBeingMarked: an event held in the table
// goes out before its aggregate's next event from the stream, although
// nothing holds the aggregate by then. A-1 fails once; its retry is
// published from the table, and its mark-sent (which clears its retry
// time) waits on a row lock of the test's. A-2 comes from the stream:
// held behind A-1 (the probe sees A-1's retry time), it is written to the
// table, and that write waits too (the test's uncommitted row with the
// same message ID). A-3 commits meanwhile; then A-1's mark goes through,
// and then A-2's write. A-3 is next in the stream, before A-2's row
// comes back through it, and nothing holds A any more. Before the fix the
// relay published A-3 from the stream at once and A-2 after it ([A-1 A-3
// A-2]); the broker-fault matrix on the WAL source (integration/kafkafaults)
// found it, at least once and exactly once. Now holding an event sends
// the loop to the table first.
func TestWALLogOnlyHeldBehindARetryBeingMarked(t *testing.T) {
	t.Parallel()
	for _, eos := range []bool{false, true} {
		t.Run(fmt.Sprintf("exactly-once=%v", eos), func(t *testing.T) {
			t.Parallel()
			e, wal := logEnv(t)
			// Its own pool: a lock held on one of the relay's 4
			// connections would leave it waiting for the pool.
			mon, err := sql.Open("pgx", testdb.PostgresDSN(t))
			if err != nil {
				t.Fatal(err)
			}
			defer mon.Close()
			begin := func() *sql.Tx {
				tx, err := mon.BeginTx(t.Context(), nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = tx.Rollback() })
				return tx
			}
			markLock, spillLock := begin(), begin()
			// hook sees each publish of A-1: it fails the first, and locks
			// A-1's row before the second (its retry) is acknowledged, so
			// that the mark that follows waits.
			var a1 atomic.Int64
			var lockErr atomic.Pointer[error]
			hook := func() error {
				switch a1.Add(1) {
				case 1:
					return errFailed
				case 2:
					if _, err := markLock.Exec("SELECT 1 FROM " + e.Table + " WHERE message_id = 'A-1' FOR UPDATE"); err != nil {
						lockErr.Store(&err)
					}
				}
				return nil
			}
			broker := &pipeBroker{txnBroker: newTxnBroker()}
			broker.answer = func(_ int, msgs []relay.Message) (bool, []error) {
				errs := make([]error, len(msgs))
				failed := false
				for i, m := range msgs {
					if m.MessageID == "A-1" {
						errs[i] = hook()
						failed = errs[i] != nil
					}
				}
				if !failed {
					return true, nil
				}
				for i := range errs {
					if errs[i] == nil {
						errs[i] = fmt.Errorf("outbox/test: aborted: %w", relay.ErrAborted)
					}
				}
				return false, errs
			}
			b := walSetup(t, e, wal, func(c *relay.Config) {
				c.RetryInitial, c.RetryMax = 10*time.Millisecond, 10*time.Millisecond
				// A-1's retry is claimed at a poll. A poll after it and
				// before A-3 is read would claim A-2 first and hide the
				// defect: the steps from the retry to A-3 take a small
				// fraction of a second.
				c.PollInterval = time.Second
				if eos {
					c.Publisher = broker
				}
			})
			if !eos {
				b.pub.FailWith(func(m relay.Message) error {
					if m.MessageID == "A-1" {
						return hook()
					}
					return nil
				})
			}
			delivered := deliveredIDs(b, broker.txnBroker, eos)
			waiting := func(what, like string) {
				eventually(t, b.ctx, what, func() bool { return lockWaiters(t, mon, e, like) > 0 })
			}
			waitStreaming(t, b, wal.Slot)
			b.emit(t, event("A", 1))
			waiting("A-1's retry published, its mark waiting", "%next_retry_at = NULL%")
			if p := lockErr.Load(); p != nil || a1.Load() != 2 {
				t.Fatalf("A-1 published %d times, want 2 (locking its row: %v)", a1.Load(), p)
			}
			if _, err := spillLock.Exec("INSERT INTO " + e.Table + " (message_id, aggregate_type, aggregate_id, event_type, partition_key, content_type, payload) " +
				"VALUES ('A-2', 'acct', 'A', 't', 0, 'application/json', '\\x00')"); err != nil {
				t.Fatal(err)
			}
			b.emit(t, event("A", 2))
			waiting("A-2's write to the table waiting", "%unnest%")
			b.emit(t, event("A", 3))
			if err := markLock.Rollback(); err != nil {
				t.Fatal(err)
			}
			eventually(t, b.ctx, "A-1 marked sent", func() bool {
				s, _ := b.status(t, "A-1")
				return s == 1
			})
			if err := spillLock.Rollback(); err != nil {
				t.Fatal(err)
			}
			eventually(t, b.ctx, "A-1..A-3 delivered", func() bool { return len(delivered()) >= 3 })
			if got := firstDeliveries(delivered()); fmt.Sprint(got) != "[A-1 A-2 A-3]" {
				t.Fatalf("first deliveries %v, want [A-1 A-2 A-3]", got)
			}
		})
	}
}

// TestWALLogOnlyGracefulStopNoDuplicates: a relay stopped gracefully
// reports the slot position it settled last, so the next reader of the
// slot does not publish again what it published (relay/doc.go: a graceful
// stop causes no duplicates). Before the fix the stream ended without a
// last report; the slot's position was the one reported up to 100 ms
// before (log-only mode), and the next relay published A-1..A-5 again
// (found by a helper trying to break the WAL source).
func TestWALLogOnlyGracefulStopNoDuplicates(t *testing.T) {
	t.Parallel()
	e, wal := logEnv(t)
	first := walSetup(t, e, wal, nil)
	waitStreaming(t, first, wal.Slot)
	for i := 1; i <= 5; i++ {
		first.emit(t, event("A", i))
	}
	if _, err := first.pub.Wait(first.ctx, func(m []relay.Message) bool { return len(order(m, "A")) == 5 }); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(first.ctx, 10*time.Second)
	defer cancel()
	if err := first.r.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	second := walSetup(t, e, wal, nil)
	waitStreaming(t, second, wal.Slot)
	second.emit(t, event("B", 1))
	msgs, err := second.pub.Wait(second.ctx, func(m []relay.Message) bool { return len(order(m, "B")) == 1 })
	if err != nil {
		t.Fatal(err)
	}
	if again := order(msgs, "A"); len(again) > 0 {
		t.Fatalf("the next relay published %v again after a graceful stop", again)
	}
}

// deliveredIDs returns a function that lists the message IDs delivered so
// far, in order, repeats included: those broker committed in the
// exactly-once mode (eos), else those b's publisher acknowledged.
func deliveredIDs(b *bundle, broker *txnBroker, eos bool) func() []string {
	return func() []string {
		if eos {
			d, _, _ := broker.get()
			return d
		}
		var out []string
		for _, m := range b.pub.Messages() {
			out = append(out, m.MessageID)
		}
		return out
	}
}

// firstDeliveries returns ids without repeats, in the order of their
// first delivery.
func firstDeliveries(ids []string) []string {
	var out []string
	for _, id := range ids {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// lockWaiters counts, as mon sees them, the statements that wait on a
// lock, whose text is like like and names e's schema (the server's other
// tests run the same statements on tables of their own).
func lockWaiters(t *testing.T, mon *sql.DB, e *testdb.Env, like string) int {
	t.Helper()
	schema, _, _ := strings.Cut(e.Table, ".")
	var n int
	if err := mon.QueryRow("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1 AND strpos(query, $2) > 0",
		like, schema).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestWALLogOnlyRefusedWhileTheSlotIsCreated: a slot's creation waits for
// the transactions running at that moment to end (one left open
// elsewhere holds it), and a message committed meanwhile, before the
// slot's consistent point, is not decoded by it. The slot is in
// pg_replication_slots from the start of its creation, with
// confirmed_flush_lsn NULL; a log-only writer's check took it for a slot,
// and its first commit passed: A-1 was lost, and no loss was recorded (a
// first start has no window to record; found by a helper trying to break
// the WAL source). Now the commit fails with ErrNoSlot until the creation
// completes, and the next one passes. On a private server: the check
// accepts any pgoutput slot of the database, and the shared server's
// database has other tests' slots.
func TestWALLogOnlyRefusedWhileTheSlotIsCreated(t *testing.T) {
	t.Parallel()
	pg := privateserver.StartPostgres(t, map[string]string{"wal_level": "logical"})
	e := testdb.NewOn(t, walTarget, pg.DSN, driver.Config{LogOnly: true})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	other, err := sql.Open("pgx", e.DSN) // a pool of its own: two sessions held below
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	open, err := other.BeginTx(ctx, nil) // a transaction with an xid, left open
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback()
	if _, err := open.ExecContext(ctx, "CREATE TEMPORARY TABLE held (id int)"); err != nil {
		t.Fatal(err)
	}
	slot := strings.ToLower(testdb.RandomName("outbox_test_"))
	created := make(chan error, 1)
	go func() {
		_, err := other.ExecContext(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
		created <- err
	}()
	t.Cleanup(func() { _, _ = e.RelayDB.Exec("SELECT pg_drop_replication_slot($1)", slot) })
	eventually(t, ctx, "the slot's creation waiting for the open transaction", func() bool {
		var waiting bool
		err := e.RelayDB.QueryRowContext(ctx, "SELECT confirmed_flush_lsn IS NULL FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&waiting)
		return err == nil && waiting
	})
	b := &bundle{e: e, ctx: ctx}
	commit := func() error {
		tctx := outbox.NewContext(ctx)
		tx, err := e.DB.BeginTx(tctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := outbox.Emit(tctx, event("A", 1)); err != nil {
			t.Fatal(err)
		}
		return tx.Commit()
	}
	if err := commit(); !errors.Is(err, driver.ErrWriteEvents) || !errors.Is(err, driver.ErrNoSlot) {
		t.Fatalf("commit while the slot is being created: %v, want ErrWriteEvents wrapping ErrNoSlot", err)
	}
	if err := open.Rollback(); err != nil {
		t.Fatal(err)
	}
	if err := <-created; err != nil {
		t.Fatal(err)
	}
	b.emit(t, event("A", 2)) // the creation completed: accepted
}
