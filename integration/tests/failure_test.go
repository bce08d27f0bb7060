package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/integration/internal/ledger"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// faultPublisher wraps a real publisher and injects failures per message
// ID: fail forever, fail the first N attempts, or fail as permanent. Like
// an order-keeping client, a failed message also fails the later messages
// of its aggregate in the batch. With hang set, Publish blocks until its
// context ends.
type faultPublisher struct {
	inner relay.Publisher

	mu        sync.Mutex
	forever   map[string]bool
	times     map[string]int
	permanent map[string]bool
	hang      bool
}

func newFaultPublisher(inner relay.Publisher) *faultPublisher {
	return &faultPublisher{inner: inner, forever: map[string]bool{}, times: map[string]int{}, permanent: map[string]bool{}}
}

var errInjected = errors.New("injected publish failure")

func (f *faultPublisher) Publish(ctx context.Context, msgs []relay.Message) error {
	f.mu.Lock()
	if f.hang {
		f.mu.Unlock()
		<-ctx.Done()
		return ctx.Err()
	}
	errs := make(relay.PublishErrors, len(msgs))
	type key struct{ t, id string }
	failed := map[key]bool{}
	var pass []relay.Message
	var passIdx []int
	for i, m := range msgs {
		k := key{m.AggregateType, m.AggregateID}
		switch {
		case failed[k]:
			errs[i] = errInjected
		case f.permanent[m.MessageID]:
			errs[i] = fmt.Errorf("%w: %w", relay.ErrPermanent, errInjected)
		case f.forever[m.MessageID]:
			errs[i] = errInjected
		case f.times[m.MessageID] > 0:
			f.times[m.MessageID]--
			errs[i] = errInjected
		}
		if errs[i] != nil {
			failed[k] = true
			continue
		}
		pass = append(pass, m)
		passIdx = append(passIdx, i)
	}
	f.mu.Unlock()
	if len(pass) > 0 {
		err := f.inner.Publish(ctx, pass)
		var pe relay.PublishErrors
		switch {
		case err == nil:
		case errors.As(err, &pe):
			for j, e := range pe {
				errs[passIdx[j]] = e
			}
		default:
			return err
		}
	}
	for _, e := range errs {
		if e != nil {
			return errs
		}
	}
	return nil
}

// TestPoisonIsolation: 10 events that always fail, among 1,000 healthy
// ones of other aggregates: every healthy one is delivered, the 10 are
// dead-lettered after MaxAttempts, and their aggregates' later events are
// held back.
func TestPoisonIsolation(t *testing.T) {
	t.Parallel()
	serverTargets(t, func(t *testing.T, tg testdb.Target) {
		kb := startKafka(t, 8, orderTopic)
		e := testdb.New(t, tg, driver.Config{})
		fp := newFaultPublisher(kb.pub)
		for p := 0; p < 10; p++ {
			fp.forever[fmt.Sprintf("poison-%d-1", p)] = true
		}
		var deadMu sync.Mutex
		dead := map[string]bool{}
		startRelay(t, e, fp, func(c *relay.Config) {
			c.MaxAttempts = 3
			c.RetryInitial, c.RetryMax = 10*time.Millisecond, 50*time.Millisecond
			c.OnDeadLetter = func(m relay.Message, _ error) { deadMu.Lock(); dead[m.MessageID] = true; deadMu.Unlock() }
		})
		ctx := testCtx(t, 2*time.Minute)
		// Interleave: each transaction carries healthy events and, for the
		// first ten, a poison event followed by a later one of its aggregate.
		for tx := 0; tx < 100; tx++ {
			err := inTx(ctx, e.DB, func(ctx context.Context, _ *sql.Tx) error {
				if tx < 10 {
					for n := 1; n <= 2; n++ {
						id := fmt.Sprintf("poison-%d-%d", tx, n)
						if err := outbox.Emit(ctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: fmt.Sprintf("poison-%d", tx), Type: "t", Payload: []byte(fmt.Sprintf(`{"seq":%d}`, n))}); err != nil {
							return err
						}
					}
				}
				for k := 0; k < 10; k++ {
					agg := fmt.Sprintf("healthy-%d", (tx*10+k)%100)
					if err := outbox.Emit(ctx, outbox.Event{AggregateType: "order", AggregateID: agg, Type: "t", Payload: []byte(fmt.Sprintf(`{"seq":%d}`, tx))}); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		rows := ledger.Read(t, e)
		var healthy []ledger.Row
		for _, r := range rows {
			if strings.HasPrefix(r.AggregateID, "healthy-") {
				healthy = append(healthy, r)
			}
		}
		if len(healthy) != 1000 {
			t.Fatalf("%d healthy rows, want 1000", len(healthy))
		}
		recs, err := kb.cons.Wait(ctx, func(r []kafkatest.Record) bool { return ledger.Check(healthy, r).Lost == 0 })
		if err != nil {
			t.Fatalf("%v; ledger %+v", err, ledger.Check(healthy, recs))
		}
		eventually(t, ctx, "10 dead letters", func() bool { return rowCount(t, e, "status = 2") == 10 })
		if n := rowCount(t, e, "status = 2 AND attempts = 3 AND message_id LIKE 'poison-%-1'"); n != 10 {
			t.Errorf("%d poison events dead after 3 attempts, want 10", n)
		}
		if n := rowCount(t, e, e.IsPending()+" AND message_id LIKE 'poison-%-2'"); n != 10 {
			t.Errorf("%d held followers pending, want 10", n)
		}
		for _, r := range kb.cons.Records() {
			if strings.HasPrefix(string(r.Key), "poison-") {
				t.Fatalf("poison aggregate %s delivered %s", r.Key, r.Value)
			}
		}
		rep := ledger.Check(healthy, kb.cons.Records())
		if rep.OrderViolations != 0 || rep.Duplicates != 0 {
			t.Fatalf("healthy ledger %+v", rep)
		}
		eventually(t, ctx, "OnDeadLetter for all 10", func() bool { deadMu.Lock(); defer deadMu.Unlock(); return len(dead) == 10 })
		deadMu.Lock()
		defer deadMu.Unlock()
		if len(dead) != 10 {
			t.Errorf("OnDeadLetter called for %d events, want 10", len(dead))
		}
	})
}

// TestLateCommitIsPublished: a transaction that got a lower outbox id
// commits after one with a higher id was already published; the relay
// still publishes it (it never reads "after the last id seen"). The first
// transaction writes its row the seed's way, by hand, so that it holds the
// lower id across the second one's commit.
func TestLateCommitIsPublished(t *testing.T) {
	t.Parallel()
	serverTargets(t, func(t *testing.T, tg testdb.Target) {
		kb := startKafka(t, 8, orderTopic)
		e := testdb.New(t, tg, driver.Config{})
		startRelay(t, e, kb.pub, nil)
		ctx := testCtx(t, time.Minute)
		now := map[driver.Dialect]string{driver.Postgres: "clock_timestamp()", driver.MySQL: "UTC_TIMESTAMP(6)"}[tg.Dialect]
		late, err := e.RelayDB.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer late.Rollback()
		if _, err := late.ExecContext(ctx, "INSERT INTO "+e.Table+" (message_id, aggregate_type, aggregate_id, event_type, partition_key, content_type, payload, created_at, updated_at) VALUES ('late', 'order', 'L', 't', 0, 'application/json', '{}', "+now+", "+now+")"); err != nil {
			t.Fatal(err)
		}
		if err := inTx(ctx, e.DB, func(ctx context.Context, _ *sql.Tx) error {
			return outbox.Emit(ctx, outbox.Event{ID: "early", AggregateType: "order", AggregateID: "E", Type: "t", Payload: []byte(`{}`)})
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := kb.cons.WaitForCount(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if err := late.Commit(); err != nil {
			t.Fatal(err)
		}
		var lateID, earlyID int64
		if err := e.RelayDB.QueryRow("SELECT id FROM " + e.Table + " WHERE message_id = 'late'").Scan(&lateID); err != nil {
			t.Fatal(err)
		}
		if err := e.RelayDB.QueryRow("SELECT id FROM " + e.Table + " WHERE message_id = 'early'").Scan(&earlyID); err != nil {
			t.Fatal(err)
		}
		if lateID >= earlyID {
			t.Fatalf("setup: late id %d not below early id %d", lateID, earlyID)
		}
		recs, err := kb.cons.WaitForCount(ctx, 2)
		if err != nil {
			t.Fatal(err)
		}
		if got := recs[1].Headers["outbox-message-id"]; got != "late" {
			t.Fatalf("second record %q, want the late commit", got)
		}
	})
}

// TestOversizedRecordAmongSmall: the broker (message.max.bytes 60,000)
// refuses one 100 kB record batched with 50 small ones on the same
// partition. Only the big one fails, as permanent (dead at once); the
// others are delivered on their first attempt and nothing backs off.
func TestOversizedRecordAmongSmall(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tg testdb.Target) {
		if tg.Name == "pgx" {
			t.Skip("SKIP: same server and SQL as pq")
		}
		b, err := kafkatest.Start(kafkatest.Topics(1, orderTopic), kafkatest.BrokerConfigs(map[string]string{"message.max.bytes": "60000"}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Close)
		pub, err := kafka.NewPublisher(kafka.Config{Brokers: b.Addrs()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		cons, err := kafkatest.NewConsumer(b.Addrs(), []string{orderTopic})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cons.Close)
		e := testdb.New(t, tg, driver.Config{})
		var deadMu sync.Mutex
		var dead []string
		ctx := testCtx(t, time.Minute)
		err = inTx(ctx, e.DB, func(ctx context.Context, _ *sql.Tx) error {
			for i := 0; i < 50; i++ {
				if i == 25 {
					big := outbox.Event{ID: "big", AggregateType: "order", AggregateID: "big", Type: "t", Payload: []byte(`"` + strings.Repeat("x", 100000) + `"`)}
					if err := outbox.Emit(ctx, big); err != nil {
						return err
					}
				}
				if err := outbox.Emit(ctx, ev(fmt.Sprintf("small-%d", i%10), i)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		// Start the relay only now, so all 51 go out in one batch.
		startRelay(t, e, pub, func(c *relay.Config) {
			c.OnDeadLetter = func(m relay.Message, _ error) { deadMu.Lock(); dead = append(dead, m.MessageID); deadMu.Unlock() }
		})
		if _, err := cons.WaitForCount(ctx, 50); err != nil {
			t.Fatal(err)
		}
		eventually(t, ctx, "the big record dead", func() bool { return rowCount(t, e, "status = 2") == 1 })
		eventually(t, ctx, "50 sent", func() bool { return rowCount(t, e, e.IsSent()) == 50 })
		if n := rowCount(t, e, e.IsSent()+" AND attempts = 0"); n != 50 {
			t.Errorf("%d small events sent on their first attempt, want 50", n)
		}
		if n := rowCount(t, e, "message_id = 'big' AND status = 2 AND attempts = 1"); n != 1 {
			t.Errorf("big record not dead-lettered at its first attempt")
		}
		eventually(t, ctx, "OnDeadLetter for the big record", func() bool { deadMu.Lock(); defer deadMu.Unlock(); return len(dead) > 0 })
		deadMu.Lock()
		defer deadMu.Unlock()
		if len(dead) != 1 || dead[0] != "big" {
			t.Errorf("dead-lettered %v, want [big]", dead)
		}
	})
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestBrokerOutage stops the broker for 30 s while writers commit, then
// starts it again on the same port with its data. The outage dead-letters
// nothing and burns no per-event attempt; afterwards everything is
// delivered, in order.
func TestBrokerOutage(t *testing.T) {
	t.Parallel()
	serverTargets(t, func(t *testing.T, tg testdb.Target) {
		const outage = 30 * time.Second
		dir, port := t.TempDir(), freePort(t)
		start := func() *kafkatest.Broker {
			b, err := kafkatest.Start(kafkatest.Topics(4, orderTopic), kafkatest.Port(port), kafkatest.DataDir(dir))
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		broker := start()
		pub, err := kafka.NewPublisher(kafka.Config{Brokers: broker.Addrs()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pub.Close() })
		e := testdb.New(t, tg, driver.Config{})
		startRelay(t, e, pub, func(c *relay.Config) { c.MaxAttempts = 2; c.PublishTimeout = 2 * time.Second })
		ctx := testCtx(t, 3*time.Minute)
		ledger.WriteSerialized(t, ctx, e, 4, 20, 300)
		eventually(t, ctx, "first 300 sent", func() bool { return rowCount(t, e, e.IsSent()) == 300 })
		broker.Close()
		outageEnds := time.Now().Add(outage)
		for i := 0; i < 300; i++ {
			if err := inTx(ctx, e.DB, func(ctx context.Context, _ *sql.Tx) error {
				return outbox.Emit(ctx, ev(fmt.Sprintf("during-%d", i%20), i))
			}); err != nil {
				t.Fatal(err)
			}
		}
		<-time.After(time.Until(outageEnds)) // the outage itself is the scenario, not synchronisation
		if n := rowCount(t, e, "status = 2"); n != 0 {
			t.Fatalf("%d events dead-lettered during a broker outage", n)
		}
		if n := rowCount(t, e, e.IsPending()+" AND attempts > 0"); n != 0 {
			t.Fatalf("%d pending events had attempts burned by the outage", n)
		}
		broker = start()
		t.Cleanup(broker.Close)
		eventually(t, ctx, "all 600 sent", func() bool { return rowCount(t, e, e.IsSent()) == 600 })
		if n := rowCount(t, e, "attempts <> 0"); n != 0 {
			t.Errorf("%d events counted a failed attempt", n)
		}
		cons, err := kafkatest.NewConsumer(broker.Addrs(), []string{orderTopic})
		if err != nil {
			t.Fatal(err)
		}
		defer cons.Close()
		rows := ledger.Read(t, e)
		recs, err := cons.Wait(ctx, func(r []kafkatest.Record) bool { return ledger.Check(rows, r).Lost == 0 })
		if err != nil {
			t.Fatalf("%v; ledger %+v", err, ledger.Check(rows, recs))
		}
		if rep := ledger.Check(rows, recs); rep.Ghosts != 0 || rep.OrderViolations != 0 {
			ledger.Explain(t, e, rep, recs)
			t.Fatalf("ledger %+v", rep)
		}
	})
}

// TestRelaySurvivesDatabaseConnectionCuts: the relay's database
// connections are cut again and again through a TCP proxy while writers
// commit; the relay reconnects with backoff and delivers everything.
func TestRelaySurvivesDatabaseConnectionCuts(t *testing.T) {
	t.Parallel()
	serverTargets(t, func(t *testing.T, tg testdb.Target) {
		kb := startKafka(t, 8, orderTopic)
		e := testdb.New(t, tg, driver.Config{})
		p, drv, dsn := proxiedDSN(t, e)
		runCuts(t, e, kb, p, drv, dsn, false)
	})
}

// proxiedDSN puts a fault proxy in front of e's server and returns it with
// the driver name and DSN that reach e's database through it.
func proxiedDSN(t *testing.T, e *testdb.Env) (*faultproxy.Proxy, string, string) {
	t.Helper()
	var target, dsn, drv string
	var mc *mysql.Config
	if e.Target.Dialect == driver.MySQL {
		var err error
		if mc, err = mysql.ParseDSN(e.DSN); err != nil {
			t.Fatal(err)
		}
		target = mc.Addr
	} else {
		u, err := url.Parse(e.DSN)
		if err != nil {
			t.Fatal(err)
		}
		target = u.Host
	}
	p, err := faultproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if mc != nil {
		mc.Addr = p.Addr()
		dsn, drv = mc.FormatDSN(), "mysql"
	} else {
		dsn, drv = strings.Replace(e.DSN, target, p.Addr(), 1), "pgx"
	}
	return p, drv, dsn
}

// runCuts relays 2,000 events through kb while cutting every database
// connection five times, and checks the ledger: duplicates bounded by two
// batches per cut, or none (exact: kb's publisher is in the exactly-once
// mode and its consumer reads at read_committed).
func runCuts(t *testing.T, e *testdb.Env, kb *kafkaBundle, p *faultproxy.Proxy, drv, dsn string, exact bool) {
	t.Helper()
	db, err := sql.Open(drv, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(2)
	r, err := relay.New(e.Outbox, db, relay.Config{Publisher: kb.pub,
		PollInterval: 20 * time.Millisecond, BatchSize: 50, Logger: quietLogger(), Observer: outboxtest.WatchOrder(t, nil)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	ctx := testCtx(t, 2*time.Minute)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		ledger.WriteSerialized(t, ctx, e, 4, 20, 2000)
	}()
	cuts := 0
	for _, at := range []int{100, 400, 800, 1200, 1600} {
		if _, err := kb.cons.Wait(ctx, func(r []kafkatest.Record) bool { return len(r) >= at }); err != nil {
			t.Fatal(err)
		}
		p.CutAll()
		cuts++
	}
	<-writerDone
	rows := ledger.Wait(t, ctx, e, kb.cons)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	rep := ledger.Check(rows, kb.cons.Records())
	bound := cuts * 2 * relay.DefaultMaxBatchFactor * 50 // two batches of up to MaxBatchSize per cut
	if exact {
		bound = 0
	}
	if rep.Ghosts != 0 || rep.OrderViolations != 0 || rep.Duplicates > bound {
		t.Fatalf("ledger %+v after %d cuts (duplicates allowed: %d)", rep, cuts, bound)
	}
	t.Logf("%d cuts; ledger %+v", cuts, rep)
}

// countingHandler counts log records at Warn and above, and keeps their
// times and messages (msgs, if set) for a failure's report.
type countingHandler struct {
	warns *atomic.Int64
	msgs  *testdb.SyncBuffer
}

func (h countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.warns.Add(1)
		if h.msgs != nil {
			var errText string
			r.Attrs(func(a slog.Attr) bool {
				if a.Key == "error" {
					errText = a.Value.String()
				}
				return true
			})
			fmt.Fprintf(h.msgs, "%s %s %s: %s\n", r.Time.Format("15:04:05.000"), r.Level, r.Message, errText)
		}
	}
	return nil
}
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countingHandler) WithGroup(string) slog.Handler      { return h }

// TestDatabaseOutageBacksOff: while the relay's database refuses every
// connection for 3 s, the relay retries with backoff (a handful of logged
// failures, not a tight loop), then catches up with what was committed.
func TestDatabaseOutageBacksOff(t *testing.T) {
	t.Parallel()
	serverTargets(t, func(t *testing.T, tg testdb.Target) {
		pub := newFaultPublisher(outboxtestPublisher())
		e := testdb.New(t, tg, driver.Config{})
		p, drv, dsn := proxiedDSN(t, e)
		outageRun(t, e, pub, p, drv, dsn)
	})
}

func outageRun(t *testing.T, e *testdb.Env, pub *faultPublisher, p *faultproxy.Proxy, drv, dsn string) {
	t.Helper()
	db, err := sql.Open(drv, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(2)
	var warns atomic.Int64
	var msgs testdb.SyncBuffer
	r, err := relay.New(e.Outbox, db, relay.Config{Publisher: pub,
		PollInterval: 20 * time.Millisecond, Logger: slog.New(countingHandler{&warns, &msgs}), Observer: outboxtest.WatchOrder(t, nil)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	ctx := testCtx(t, time.Minute)
	inner := pub.inner.(*outboxtestPub)
	if err := inTx(ctx, e.DB, func(ctx context.Context, _ *sql.Tx) error { return outbox.Emit(ctx, ev("before", 1)) }); err != nil {
		t.Fatal(err)
	}
	if _, err := inner.WaitForCount(ctx, 1); err != nil {
		t.Fatal(err)
	}
	p.Refuse(true)
	outageEnds := time.Now().Add(3 * time.Second)
	for i := 0; i < 50; i++ {
		if err := inTx(ctx, e.DB, func(ctx context.Context, _ *sql.Tx) error { return outbox.Emit(ctx, ev("during", i)) }); err != nil {
			t.Fatal(err)
		}
	}
	<-time.After(time.Until(outageEnds)) // the outage is the scenario
	failures := warns.Load()
	p.Refuse(false)
	if _, err := inner.WaitForCount(ctx, 51); err != nil {
		t.Fatal(err)
	}
	if failures < 1 || failures > 12 {
		t.Fatalf("%d logged failures during a 3 s outage: want a few (backoff 100 ms doubling), not zero nor a tight loop; logged:\n%s", failures, msgs.String())
	}
	if n := p.Refused.Load(); n > 40 {
		t.Fatalf("%d connection attempts during a 3 s outage: not backing off", n)
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("3 s outage: %d logged failures, %d refused connections", failures, p.Refused.Load())
}

type outboxtestPub = outboxtest.Publisher

func outboxtestPublisher() *outboxtest.Publisher { return outboxtest.NewPublisher() }
