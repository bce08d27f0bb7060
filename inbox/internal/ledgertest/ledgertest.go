// Package ledgertest is the ledger proof every broker runner of the inbox
// passes (inbox/kafka, inbox/nats, inbox/rabbitmq, inbox/redis): writers
// commit business changes, each with its event, in a producer database;
// relay processes publish them to the broker; consumer processes (two at
// a time: on Kafka both consume, sharing the partitions; on RabbitMQ,
// NATS and Redis one consumes and the other waits to take over) apply
// each event to a ledger table in a consumer database
// through the runner. Consumers are SIGKILLed right after storing an
// outcome (before its acknowledgement reaches the broker) and at random
// moments, relays after a publish before mark-sent and at random. At the
// end every event is applied exactly once, in order per aggregate (seq 1,
// 2, 3, ...), and the inbox recognised the redeliveries the kills caused.
//
// A test binary using it calls Main from TestMain, so that it can run as
// a consumer or relay child; the module supplies the two children's
// bodies (its runner, its publisher) and the broker's environment.
package ledgertest

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the consumer children's drivers
	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay"
)

// Environment of the children.
const (
	envChild     = "OUTBOX_LEDGER_CHILD"
	envDialect   = "OUTBOX_LEDGER_DIALECT"
	envDSN       = "OUTBOX_LEDGER_DSN"
	envInbox     = "OUTBOX_LEDGER_INBOX"
	envConsumer  = "OUTBOX_LEDGER_CONSUMER"
	envLedger    = "OUTBOX_LEDGER_TABLE"
	envEvents    = "OUTBOX_LEDGER_EVENTS"
	envBatch     = "OUTBOX_LEDGER_BATCH"
	envOutbox    = "OUTBOX_LEDGER_OUTBOX"
	envFailpoint = "OUTBOX_FAILPOINTS"
)

// Main runs the test binary as a child when the environment says so:
// consumer runs a consumer child's body, relay a relay child's; otherwise
// it runs the tests.
func Main(m *testing.M, consumer func() int, relayChild func() int) {
	switch os.Getenv(envChild) {
	case "consumer":
		os.Exit(consumer())
	case "relay":
		os.Exit(relayChild())
	}
	os.Exit(m.Run())
}

// QuietLogger discards everything.
func QuietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// Consumer is what a consumer child's runner needs, from the environment
// Proof sets.
type Consumer struct {
	Dialect driver.Dialect
	DB      *sql.DB
	Inbox   *inbox.Inbox
	// Handler inserts one ledger row per message.
	Handler func(ctx context.Context, tx *sql.Tx, m inbox.Message) error
	// Batch is the BatchSize to run with (0 or 16).
	Batch int
	// Logger discards.
	Logger *slog.Logger

	events *os.File
}

// Record appends an outcome line to the child's events file: "dup
// <where>" for a duplicate, "ok <where>" for any other outcome (one
// write(2) each, so the lines survive SIGKILL). where must name the
// broker's delivery the same way for every consumer (stream and sequence,
// queue and message ID).
func (c *Consumer) Record(dup bool, where string) {
	kind := "ok"
	if dup {
		kind = "dup"
	}
	_, _ = fmt.Fprintf(c.events, "%s %s\n", kind, where)
}

// ConsumerChild is a consumer child's body: it opens the consumer
// database and inbox from the environment and calls run with a context
// that ends at SIGTERM. It prints "consumer child running" first; it
// returns 0 when run returned nil.
func ConsumerChild(run func(ctx context.Context, c *Consumer) error) int {
	d := driver.Dialect(os.Getenv(envDialect))
	db, err := sql.Open(driverName(d), os.Getenv(envDSN))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer db.Close()
	db.SetMaxOpenConns(10)
	in, err := inbox.New(inbox.Config{Dialect: d, Table: os.Getenv(envInbox), Consumer: os.Getenv(envConsumer), Logger: QuietLogger()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	events, err := os.OpenFile(os.Getenv(envEvents), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer events.Close()
	batch, _ := strconv.Atoi(os.Getenv(envBatch))
	c := &Consumer{Dialect: d, DB: db, Inbox: in, Handler: LedgerHandler(d, os.Getenv(envLedger)), Batch: batch,
		Logger: QuietLogger(), events: events}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fmt.Println("consumer child running")
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("consumer child stopped")
	return 0
}

// RelayChild is a relay child's body: it runs a relay of the producer's
// outbox (from the environment) with pub until SIGTERM.
func RelayChild(pub relay.Publisher) int {
	d := driver.Dialect(os.Getenv(envDialect))
	db, err := sql.Open(driverName(d), os.Getenv(envDSN))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer db.Close()
	db.SetMaxOpenConns(2)
	ob, err := driver.New(driver.Config{Dialect: d, Table: os.Getenv(envOutbox)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	r, err := relay.New(ob, db, relay.Config{Publisher: pub, PollInterval: 20 * time.Millisecond, MinPollInterval: 5 * time.Millisecond,
		BatchSize: 50, Logger: QuietLogger(), LeaseTTL: 2 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fmt.Println("relay child running")
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func driverName(d driver.Dialect) string {
	return map[driver.Dialect]string{driver.Postgres: "pgx", driver.MySQL: "mysql"}[d]
}

// DB is a consumer's private database with an inbox and a ledger.
type DB struct {
	Env    *testdb.Env
	DB     *sql.DB
	Inbox  *inbox.Inbox
	ITable string // inbox table, qualified
	Ledger string // ledger table, qualified
	Name   string // inbox consumer name
}

// NewDB creates a consumer database on tg: a migrated inbox and a ledger.
func NewDB(t testing.TB, tg testdb.Target) *DB {
	t.Helper()
	e := testdb.New(t, tg, driver.Config{})
	c := &DB{Env: e, DB: e.RelayDB, ITable: e.Q("inbox"), Ledger: e.Q("ledger"), Name: "ledger"}
	c.DB.SetMaxOpenConns(12)
	in, err := inbox.New(inbox.Config{Dialect: tg.Dialect, Table: c.ITable, Consumer: c.Name, Logger: QuietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Migrate(context.Background(), c.DB); err != nil {
		t.Fatal(err)
	}
	c.Inbox = in
	id := "id BIGSERIAL PRIMARY KEY"
	if tg.Dialect == driver.MySQL {
		id = "id BIGINT AUTO_INCREMENT PRIMARY KEY"
	}
	if _, err := c.DB.Exec("CREATE TABLE " + c.Ledger + " (" + id + ", message_id VARCHAR(128) NOT NULL, aggregate_id VARCHAR(255) NOT NULL, seq INTEGER NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return c
}

// ChildEnv is the environment of a consumer child (StartChild(t, name,
// "consumer", env...)) on c: its outcomes appended to events, its
// BatchSize batch, its OUTBOX_FAILPOINTS failpoints. Add the broker's.
func (c *DB) ChildEnv(events string, batch int, failpoints string) []string {
	return []string{envBatch + "=" + strconv.Itoa(batch),
		envDialect + "=" + string(c.Env.Target.Dialect), envDSN + "=" + c.Env.DSN,
		envInbox + "=" + c.ITable, envConsumer + "=" + c.Name, envLedger + "=" + c.Ledger,
		envEvents + "=" + events, envFailpoint + "=" + failpoints}
}

// Observed returns another Inbox on c's table with obs as its Observer.
func (c *DB) Observed(t testing.TB, obs inbox.Observer) *inbox.Inbox {
	t.Helper()
	in, err := inbox.New(inbox.Config{Dialect: c.Env.Target.Dialect, Table: c.ITable, Consumer: c.Name, Logger: QuietLogger(), Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func placeholder(d driver.Dialect, n int) string {
	if d == driver.Postgres {
		return "$" + strconv.Itoa(n)
	}
	return "?"
}

// LedgerHandler inserts one ledger row per message: message ID, aggregate
// and the payload's seq. A double apply shows up as two rows; a payload
// that is not {"seq":N} fails with inbox.ErrPermanent.
func LedgerHandler(d driver.Dialect, table string) func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
	q := "INSERT INTO " + table + " (message_id, aggregate_id, seq) VALUES (" +
		placeholder(d, 1) + ", " + placeholder(d, 2) + ", " + placeholder(d, 3) + ")"
	return func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
		var p struct{ Seq int }
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			return fmt.Errorf("%w: payload: %v", inbox.ErrPermanent, err)
		}
		_, err := tx.ExecContext(ctx, q, m.ID, m.AggregateID, p.Seq)
		return err
	}
}

// Row is one ledger row.
type Row struct {
	ID    int64
	MsgID string
	Agg   string
	Seq   int
}

// Read returns the ledger's rows in insertion order.
func Read(t testing.TB, db *sql.DB, table string) []Row {
	t.Helper()
	rows, err := db.Query("SELECT id, message_id, aggregate_id, seq FROM " + table + " ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var r Row
		if err := rows.Scan(&r.ID, &r.MsgID, &r.Agg, &r.Seq); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Count returns the number of rows of table.
func Count(t testing.TB, db *sql.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Check returns problems: a message applied twice, an aggregate's seqs
// not applied as 1, 2, 3, ... in ledger order, or fewer than want rows per
// aggregate (want maps aggregate to its last seq).
func Check(rows []Row, want map[string]int) []string {
	var probs []string
	seen := map[string]bool{}
	last := map[string]int{}
	for _, r := range rows {
		if seen[r.MsgID] {
			probs = append(probs, "applied twice: "+r.MsgID)
		}
		seen[r.MsgID] = true
		if r.Seq != last[r.Agg]+1 {
			probs = append(probs, fmt.Sprintf("%s: seq %d after %d", r.Agg, r.Seq, last[r.Agg]))
		}
		last[r.Agg] = r.Seq
	}
	for agg, n := range want {
		if last[agg] != n {
			probs = append(probs, fmt.Sprintf("%s: last seq %d, want %d", agg, last[agg], n))
		}
	}
	if len(probs) > 10 {
		probs = append(probs[:10], fmt.Sprintf("... %d problems", len(probs)))
	}
	return probs
}

// Proof configures Run.
type Proof struct {
	// Target is the producer's and the consumer's database.
	Target testdb.Target
	// ConsumerEnv and RelayEnv are added to the children's environment
	// (the broker's address, stream, queue, group).
	ConsumerEnv, RelayEnv []string
	// AfterStore is the runner's failpoint hit right after a delivery's
	// (or a batch's) outcome is stored, before its acknowledgement.
	AfterStore string
	// BeforeCommit, if set, is a failpoint just before an acknowledgement
	// or offset commit is sent (Kafka's offset commit).
	BeforeCommit string
	// Total events (default 2000) over Aggregates aggregates (default 40).
	Total, Aggregates int
	// Timeout of the whole proof (default 150 s).
	Timeout time.Duration
}

// Run runs the proof: see the package documentation.
func Run(t *testing.T, p Proof) {
	if p.Total == 0 {
		p.Total = 2000
	}
	if p.Aggregates == 0 {
		p.Aggregates = 40
	}
	if p.Timeout == 0 {
		p.Timeout = 150 * time.Second
	}
	total := p.Total
	const writers = 4
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), p.Timeout)
	t.Cleanup(cancel)
	tg := p.Target
	prod := testdb.New(t, tg, driver.Config{})
	cons := NewDB(t, tg)
	dir := t.TempDir()
	var eventFiles []string

	n, consumers := 0, 0
	consumer := func(failpoints string) *Child {
		n++
		// Every other consumer applies batches of 16 (BatchSize): both
		// modes share the kills and the proof.
		consumers++
		batch := 16 * ((consumers + 1) % 2)
		events := filepath.Join(dir, fmt.Sprintf("events-%d", n))
		eventFiles = append(eventFiles, events)
		env := append(cons.ChildEnv(events, batch, failpoints), p.ConsumerEnv...)
		c := StartChild(t, fmt.Sprintf("consumer %d (%s, batch %d)", n, failpoints, batch), "consumer", env...)
		c.Events = events
		return c
	}
	relayChild := func(failpoints string) *Child {
		n++
		env := append([]string{envDialect + "=" + string(tg.Dialect), envDSN + "=" + prod.DSN, envOutbox + "=" + prod.Table,
			envFailpoint + "=" + failpoints}, p.RelayEnv...)
		return StartChild(t, fmt.Sprintf("relay %d (%s)", n, failpoints), "relay", env...)
	}
	applied := func() int { return Count(t, cons.DB, cons.Ledger) }
	t.Cleanup(func() {
		if t.Failed() {
			var sent, all int
			_ = prod.RelayDB.QueryRow("SELECT COUNT(*), COUNT(CASE WHEN "+prod.IsSent()+" THEN 1 END) FROM "+prod.Table).Scan(&all, &sent)
			t.Logf("at failure: %d outbox rows, %d sent; %d applied", all, sent, applied())
		}
	})
	waitApplied := func(at int) {
		t.Helper()
		testdb.Eventually(t, ctx, fmt.Sprintf("%d events applied", at), func() bool { return applied() >= at })
	}

	var want map[string]int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		want = WriteLedger(t, ctx, prod, writers, p.Aggregates, total)
	}()

	kills := map[string]int{}
	// The first relay dies after its 5th publish, before mark-sent: it
	// re-sends that batch.
	r1 := relayChild("relay/after-publish=kill@5")
	a1 := consumer(p.AfterStore + "=kill@60")
	// The second consumer starts once the first consumes: where the broker
	// lets one consumer at a time consume (RabbitMQ's single active
	// consumer, the lease of NATS and Redis), the first is the active one
	// and reaches its failpoint; on Kafka the second joins with a
	// rebalance.
	testdb.Eventually(t, ctx, a1.Name+" consuming", func() bool { return a1.Exited() || len(EventLines(t, a1.Events)) > 0 })
	b1 := consumer("")

	r1.WaitKilled(t, ctx)
	kills["relay after-publish"]++
	r2 := relayChild("")

	// Killed right after storing its 60th outcome, before acknowledging
	// it: that delivery comes again.
	a1.WaitKilled(t, ctx)
	kills["consumer after-store"]++
	afterStore := []*Child{a1}
	var a2 *Child
	if p.BeforeCommit != "" {
		a2 = consumer(p.BeforeCommit + "=kill@4")
		a2.WaitKilled(t, ctx)
		kills["consumer before-commit"]++
	}
	a3 := consumer(p.AfterStore + "=kill@15")

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	waitApplied(total/4 + rng.IntN(total/6))
	r2.Kill()
	kills["relay random"]++
	r3 := relayChild("")
	waitApplied(total/2 + rng.IntN(total/8))
	b1.Kill()
	kills["consumer random"]++
	b2 := consumer("")

	if a3.WaitKilledOr(t, ctx, func() bool { return applied() >= total }) {
		kills["consumer after-store"]++
		afterStore = append(afterStore, a3)
	} else {
		a3.Kill()
		kills["consumer random"]++
	}
	a4 := consumer("")

	waitApplied(3*total/4 + rng.IntN(total/8))
	b2.Kill()
	kills["consumer random"]++
	b3 := consumer("")

	wg.Wait()
	if t.Failed() {
		return
	}
	waitApplied(total)
	for _, c := range []*Child{a4, b3} {
		c.Terminate(t, ctx, "consumer child running")
	}
	r3.Terminate(t, ctx, "relay child running")

	rows := Read(t, cons.DB, cons.Ledger)
	if len(rows) != total {
		t.Errorf("%d ledger rows, want %d (one per event)", len(rows), total)
	}
	if probs := Check(rows, want); len(probs) > 0 {
		t.Fatalf("ledger: %v", probs)
	}
	dupOf := map[string]bool{}
	dups := 0
	for _, f := range eventFiles {
		for _, line := range EventLines(t, f) {
			if rest, ok := strings.CutPrefix(line, "dup "); ok {
				dupOf[rest] = true
				dups++
			}
		}
	}
	if dups == 0 {
		t.Fatalf("no duplicates recognised after kills %v: the kills did not cause redeliveries", kills)
	}
	// The delivery each after-store kill interrupted (its process's last
	// stored outcome, not acknowledged) came back and the inbox
	// recognised it.
	for _, c := range afterStore {
		lines := EventLines(t, c.Events)
		if len(lines) == 0 {
			t.Fatalf("%s was killed after storing an outcome but its events file is empty", c.Name)
		}
		_, last, _ := strings.Cut(lines[len(lines)-1], " ")
		if !dupOf[last] {
			t.Errorf("%s was killed after storing %s, which no consumer got again as a duplicate", c.Name, last)
		}
	}
	t.Logf("%s: %d events applied exactly once in order in %s; %d consumer processes, kills %v; %d duplicate deliveries recognised and skipped by the inbox (the delivery of each after-store kill among them)",
		tg.Name, total, time.Since(start).Round(time.Millisecond), len(eventFiles), kills, dups)
}

// EventLines returns the non-empty lines of an events file.
func EventLines(t testing.TB, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(raw), "\n") {
		if l != "" {
			lines = append(lines, l)
		}
	}
	return lines
}

// WriteLedger commits total business changes from writers goroutines
// over aggregates accounts, each incrementing its account's seq under a
// row lock and emitting an event carrying it; it returns the last seq of
// every aggregate.
func WriteLedger(t *testing.T, ctx context.Context, e *testdb.Env, writers, aggregates, total int) map[string]int {
	t.Helper()
	acc := e.Q("account")
	if _, err := e.RelayDB.Exec("CREATE TABLE " + acc + " (id VARCHAR(64) PRIMARY KEY, seq INTEGER NOT NULL)"); err != nil {
		t.Error(err)
		return nil
	}
	for a := 0; a < aggregates; a++ {
		if _, err := e.RelayDB.Exec("INSERT INTO "+acc+" (id, seq) VALUES ("+e.Placeholder(1)+", 0)", fmt.Sprintf("agg-%03d", a)); err != nil {
			t.Error(err)
			return nil
		}
	}
	sel := "SELECT seq FROM " + acc + " WHERE id = " + e.Placeholder(1) + " FOR UPDATE"
	upd := "UPDATE " + acc + " SET seq = " + e.Placeholder(1) + " WHERE id = " + e.Placeholder(2)
	var next atomic.Int64
	var mu sync.Mutex
	want := map[string]int{}
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 11))
			for next.Add(1) <= int64(total) {
				agg := fmt.Sprintf("agg-%03d", rng.IntN(aggregates))
				var seq int
				var err error
				for try := 0; try < 20; try++ {
					err = func() error {
						ctx := outbox.NewContext(ctx)
						tx, err := e.DB.BeginTx(ctx, nil)
						if err != nil {
							return err
						}
						defer tx.Rollback()
						if err := tx.QueryRowContext(ctx, sel, agg).Scan(&seq); err != nil {
							return err
						}
						seq++
						if _, err := tx.ExecContext(ctx, upd, seq, agg); err != nil {
							return err
						}
						if err := outbox.Emit(ctx, outbox.Event{AggregateType: "account", AggregateID: agg, Type: "account.step",
							Payload: []byte(fmt.Sprintf(`{"seq":%d}`, seq))}); err != nil {
							return err
						}
						return tx.Commit()
					}()
					if err == nil || !strings.Contains(strings.ToLower(err.Error()), "deadlock") {
						break
					}
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if seq > want[agg] {
					want[agg] = seq
				}
				mu.Unlock()
			}
		}(w)
	}
	wg.Wait()
	return want
}

// Child is a consumer or relay running as its own OS process.
type Child struct {
	Name   string
	Events string // a consumer's events file
	cmd    *exec.Cmd
	out    testdb.SyncBuffer
	done   chan struct{}
}

// StartChild starts the test binary as a child of kind ("consumer",
// "relay") with env added to this process's environment; it is killed at
// cleanup, and its output logged if the test failed.
func StartChild(t testing.TB, name, kind string, env ...string) *Child {
	t.Helper()
	c := &Child{Name: name, cmd: exec.Command(os.Args[0], "-test.run=^$"), done: make(chan struct{})}
	c.cmd.Env = append(append(os.Environ(), envChild+"="+kind), env...)
	c.cmd.Stdout = &c.out
	c.cmd.Stderr = &c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.done
		if t.Failed() {
			t.Logf("%s output:\n%s", c.Name, c.out.String())
		}
	})
	return c
}

// Output is what the child printed so far.
func (c *Child) Output() string { return c.out.String() }

// Exited reports whether the child has exited.
func (c *Child) Exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// Kill SIGKILLs the child and waits for it.
func (c *Child) Kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
}

// WaitKilled waits until the child died of SIGKILL (its failpoint).
func (c *Child) WaitKilled(t testing.TB, ctx context.Context) {
	t.Helper()
	select {
	case <-c.done:
	case <-ctx.Done():
		t.Fatalf("%s was not killed by its failpoint; output:\n%s", c.Name, c.out.String())
	}
	ws := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("%s exited with %v, not SIGKILL; output:\n%s", c.Name, c.cmd.ProcessState, c.out.String())
	}
}

// WaitKilledOr waits until the child died of SIGKILL (true) or give()
// holds while it still runs (false).
func (c *Child) WaitKilledOr(t testing.TB, ctx context.Context, give func() bool) bool {
	t.Helper()
	var killed bool
	testdb.Eventually(t, ctx, c.Name+" killed", func() bool {
		if c.Exited() {
			killed = true
			return true
		}
		return give()
	})
	if killed {
		c.WaitKilled(t, ctx)
	}
	return killed
}

// Terminate SIGTERMs the child once it printed running and waits for
// exit 0.
func (c *Child) Terminate(t testing.TB, ctx context.Context, running string) {
	t.Helper()
	testdb.Eventually(t, ctx, c.Name+" running", func() bool { return strings.Contains(c.out.String(), running) })
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		t.Fatalf("%s did not stop; output:\n%s", c.Name, c.out.String())
	}
	if !c.cmd.ProcessState.Success() {
		t.Fatalf("%s after SIGTERM: %v; output:\n%s", c.Name, c.cmd.ProcessState, c.out.String())
	}
}

// Serve runs run (a runner's Run) in a goroutine until the test ends or
// the returned stop is called; stop cancels run's context, waits for it
// and fails the test if it returned an error.
func Serve(t testing.TB, run func(ctx context.Context) error) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// Context is a context that ends after d or when the test ends.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// Interpolate makes c.DB a pool that writes arguments into the
// statement text on MySQL (go-sql-driver's interpolateParams=true: one
// round trip per statement instead of prepare, execute, close), closed
// at cleanup. Benchmarks name that target "mysql-interpolate".
func (c *DB) Interpolate(t testing.TB) {
	t.Helper()
	sep := "?"
	if strings.Contains(c.Env.DSN, "?") {
		sep = "&"
	}
	db, err := sql.Open("mysql", c.Env.DSN+sep+"interpolateParams=true")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(12)
	t.Cleanup(func() { db.Close() })
	c.DB = db
}

// BenchTargets are the consumer databases of the runners' benchmarks:
// PostgreSQL through pgx, and MariaDB with interpolateParams=true (see
// Interpolate).
var BenchTargets = []testdb.Target{{Name: "pgx", Dialect: driver.Postgres}, {Name: "mysql-interpolate", Dialect: driver.MySQL}}

// ForBench runs f as sub-benchmarks "<target>/batch=<n>" for each of
// BenchTargets, one message per transaction (0) and inbox.MaxBatch.
func ForBench(b *testing.B, f func(b *testing.B, c *DB, batch int)) {
	for _, tg := range BenchTargets {
		for _, batch := range []int{0, inbox.MaxBatch} {
			b.Run(fmt.Sprintf("%s/batch=%d", tg.Name, batch), func(b *testing.B) {
				c := NewDB(b, tg)
				if tg.Name == "mysql-interpolate" {
					c.Interpolate(b)
				}
				f(b, c, batch)
			})
		}
	}
}

// ReportRate reports n events in d as events/s, and no ns/op (the
// benchmark times a whole run, not an operation).
func ReportRate(b *testing.B, n int, d time.Duration) {
	b.ReportMetric(float64(n)/d.Seconds(), "events/s")
	b.ReportMetric(0, "ns/op")
}
