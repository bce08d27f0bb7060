package inboxkafka_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/inbox"
	inboxkafka "github.com/sqloutbox/outbox/inbox/kafka"
	"github.com/sqloutbox/outbox/internal/testdb"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// childEnv selects what the test binary does when re-executed as a child.
const childEnv = "INBOXKAFKA_TEST_CHILD"

// TestMain lets the test binary double as a consumer process or a relay
// process, so tests can SIGKILL them.
func TestMain(m *testing.M) {
	switch os.Getenv(childEnv) {
	case "consumer":
		os.Exit(consumerChild())
	case "relay":
		os.Exit(relayChild())
	}
	os.Exit(m.Run())
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// groupSettings make a SIGKILLed member's partitions move on quickly.
func groupSettings() []kgo.Opt {
	return []kgo.Opt{
		kgo.SessionTimeout(2 * time.Second),
		kgo.HeartbeatInterval(200 * time.Millisecond),
		kgo.RebalanceTimeout(10 * time.Second),
		kgo.FetchMaxWait(50 * time.Millisecond),
	}
}

// startBroker starts an in-process broker with one topic of its own.
func startBroker(t testing.TB, partitions int32) (*kafkatest.Broker, string) {
	t.Helper()
	topic := randomName("t.")
	b, err := kafkatest.Start(kafkatest.Topics(partitions, topic),
		kafkatest.BrokerConfigs(map[string]string{"group.min.session.timeout.ms": "500"}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b, topic
}

// consumerDB is a consumer's private database with an inbox and a ledger.
type consumerDB struct {
	env    *testdb.Env
	db     *sql.DB
	inbox  *inbox.Inbox
	itable string // inbox table, qualified
	ledger string // ledger table, qualified
	cname  string // inbox consumer name
}

func ledgerDDL(d driver.Dialect, table string) string {
	id := "id BIGSERIAL PRIMARY KEY"
	if d == driver.MySQL {
		id = "id BIGINT AUTO_INCREMENT PRIMARY KEY"
	}
	return "CREATE TABLE " + table + " (" + id + ", message_id VARCHAR(128) NOT NULL, aggregate_id VARCHAR(255) NOT NULL, seq INTEGER NOT NULL)"
}

func newConsumerDB(t testing.TB, tg testdb.Target) *consumerDB {
	t.Helper()
	e := testdb.New(t, tg, driver.Config{})
	c := &consumerDB{env: e, db: e.RelayDB, itable: e.Q("inbox"), ledger: e.Q("ledger"), cname: "ledger"}
	c.db.SetMaxOpenConns(12)
	in, err := inbox.New(inbox.Config{Dialect: tg.Dialect, Table: c.itable, Consumer: c.cname, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Migrate(context.Background(), c.db); err != nil {
		t.Fatal(err)
	}
	c.inbox = in
	if _, err := c.db.Exec(ledgerDDL(tg.Dialect, c.ledger)); err != nil {
		t.Fatal(err)
	}
	return c
}

// observed returns another Inbox on c's table with obs as its Observer.
func (c *consumerDB) observed(t testing.TB, obs inbox.Observer) *inbox.Inbox {
	t.Helper()
	in, err := inbox.New(inbox.Config{Dialect: c.env.Target.Dialect, Table: c.itable, Consumer: c.cname, Logger: quietLogger(), Observer: obs})
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

// ledgerHandler inserts one ledger row per message: message ID, aggregate
// and the payload's seq. A double apply shows up as two rows.
func ledgerHandler(d driver.Dialect, table string) inboxkafka.Handler {
	q := "INSERT INTO " + table + " (message_id, aggregate_id, seq) VALUES (" +
		placeholder(d, 1) + ", " + placeholder(d, 2) + ", " + placeholder(d, 3) + ")"
	return func(ctx context.Context, tx *sql.Tx, m inbox.Message) error {
		var p struct{ Seq int }
		if err := json.Unmarshal(m.Payload, &p); err != nil {
			return fmt.Errorf("%w: payload: %v", inboxkafka.ErrPermanent, err)
		}
		_, err := tx.ExecContext(ctx, q, m.ID, m.AggregateID, p.Seq)
		return err
	}
}

type ledgerRow struct {
	id    int64
	msgID string
	agg   string
	seq   int
}

func readLedger(t testing.TB, db *sql.DB, table string) []ledgerRow {
	t.Helper()
	rows, err := db.Query("SELECT id, message_id, aggregate_id, seq FROM " + table + " ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []ledgerRow
	for rows.Next() {
		var r ledgerRow
		if err := rows.Scan(&r.id, &r.msgID, &r.agg, &r.seq); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func countRows(t testing.TB, db *sql.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// checkLedger returns problems: a message applied twice, an aggregate's
// seqs not applied as 1, 2, 3, ... in ledger order, or fewer than want
// rows per aggregate (want maps aggregate to its last seq).
func checkLedger(rows []ledgerRow, want map[string]int) []string {
	var probs []string
	seen := map[string]bool{}
	last := map[string]int{}
	for _, r := range rows {
		if seen[r.msgID] {
			probs = append(probs, "applied twice: "+r.msgID)
		}
		seen[r.msgID] = true
		if r.seq != last[r.agg]+1 {
			probs = append(probs, fmt.Sprintf("%s: seq %d after %d", r.agg, r.seq, last[r.agg]))
		}
		last[r.agg] = r.seq
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

// produce writes n records per aggregate (seq 1..n) with the relay's
// headers, keyed by aggregate, and returns the last seq per aggregate.
func produce(t testing.TB, brokers []string, topic string, aggregates, n int) map[string]int {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	want := map[string]int{}
	var recs []*kgo.Record
	for seq := 1; seq <= n; seq++ {
		for a := 0; a < aggregates; a++ {
			agg := fmt.Sprintf("agg-%03d", a)
			recs = append(recs, record(agg, seq))
			want[agg] = seq
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	return want
}

func record(agg string, seq int) *kgo.Record {
	return &kgo.Record{Key: []byte(agg), Value: []byte(fmt.Sprintf(`{"seq":%d}`, seq)), Headers: []kgo.RecordHeader{
		{Key: emit.HeaderMessageID, Value: []byte(randomName("m-"))},
		{Key: emit.HeaderAggregateType, Value: []byte("order")},
		{Key: emit.HeaderAggregateID, Value: []byte(agg)},
		{Key: emit.HeaderEventType, Value: []byte("order.step")},
	}}
}

// fastRetry is a 1 ms constant backoff.
func fastRetry() backoff.BackOff { return backoff.NewConstantBackOff(time.Millisecond) }

// runRunner runs r until the test ends (or stop is called); stop waits
// for Run to return.
func runRunner(t testing.TB, r *inboxkafka.Runner) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
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

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// consumerChild runs a Runner configured by INBOXKAFKA_* variables until
// SIGTERM (exit 0) or a failpoint or the test kills it. Every duplicate it
// sees is appended to INBOXKAFKA_EVENTS as a line (a write(2) each, so the
// lines survive SIGKILL).
func consumerChild() int {
	d := driver.Dialect(os.Getenv("INBOXKAFKA_DIALECT"))
	drv := map[driver.Dialect]string{driver.Postgres: "pgx", driver.MySQL: "mysql"}[d]
	db, err := sql.Open(drv, os.Getenv("INBOXKAFKA_DSN"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer db.Close()
	db.SetMaxOpenConns(10)
	in, err := inbox.New(inbox.Config{Dialect: d, Table: os.Getenv("INBOXKAFKA_INBOX"), Consumer: os.Getenv("INBOXKAFKA_CONSUMER"), Logger: quietLogger()})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	events, err := os.OpenFile(os.Getenv("INBOXKAFKA_EVENTS"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer events.Close()
	batch, _ := strconv.Atoi(os.Getenv("INBOXKAFKA_BATCH"))
	r, err := inboxkafka.NewRunner(inboxkafka.Config{
		BatchSize: batch,
		Brokers:   strings.Split(os.Getenv("INBOXKAFKA_BROKERS"), ","), Group: os.Getenv("INBOXKAFKA_GROUP"),
		Topics: []string{os.Getenv("INBOXKAFKA_TOPIC")}, Inbox: in, DB: db,
		Handler: ledgerHandler(d, os.Getenv("INBOXKAFKA_LEDGER")), Backoff: fastRetry,
		Observer: fileObserver{events}, Logger: quietLogger(), CommitInterval: 100 * time.Millisecond,
		Kgo: groupSettings(),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fmt.Println("consumer child running")
	if err := r.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	st := r.Stats()
	fmt.Printf("consumer child stopped: %+v\n", st)
	return 0
}

// fileObserver writes a line per stored outcome: "dup <topic>/<partition>/<offset>"
// for a duplicate, "ok ..." for the others.
type fileObserver struct{ f *os.File }

func (o fileObserver) Processed(r inboxkafka.Result) {
	kind := "ok"
	if !r.Parked && r.Outcome == inbox.Duplicate {
		kind = "dup"
	}
	_, _ = fmt.Fprintf(o.f, "%s %s/%d/%d\n", kind, r.Topic, r.Partition, r.Offset)
}
func (fileObserver) AttemptFailed(string, int32, int, error) {}
func (fileObserver) Lag(string, int32, int64)                {}
func (fileObserver) PartitionRevoked(string, int32)          {}

// relayChild runs a relay configured by INBOXKAFKA_* variables until
// SIGTERM or the test kills it.
func relayChild() int {
	d := driver.Dialect(os.Getenv("INBOXKAFKA_DIALECT"))
	drv := map[driver.Dialect]string{driver.Postgres: "pgx", driver.MySQL: "mysql"}[d]
	db, err := sql.Open(drv, os.Getenv("INBOXKAFKA_DSN"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer db.Close()
	db.SetMaxOpenConns(2)
	topic := os.Getenv("INBOXKAFKA_TOPIC")
	pub, err := kafka.NewPublisher(kafka.Config{Brokers: strings.Split(os.Getenv("INBOXKAFKA_BROKERS"), ","),
		Topic: func(relay.Message) string { return topic }})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pub.Close()
	ob, err := driver.New(driver.Config{Dialect: d, Table: os.Getenv("INBOXKAFKA_OUTBOX")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	r, err := relay.New(ob, db, relay.Config{Publisher: pub, PollInterval: 20 * time.Millisecond, MinPollInterval: 5 * time.Millisecond,
		BatchSize: 50, Logger: quietLogger(), LeaseTTL: 2 * time.Second})
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

// child is a consumer or relay running as its own OS process.
type child struct {
	name   string
	events string // a consumer's events file
	cmd    *exec.Cmd
	out    testdb.SyncBuffer
	done   chan struct{}
}

// startChild starts the test binary as a child of kind ("consumer",
// "relay") with env added to this process's environment.
func startChild(t testing.TB, name, kind string, env ...string) *child {
	t.Helper()
	c := &child{name: name, cmd: exec.Command(os.Args[0], "-test.run=^$"), done: make(chan struct{})}
	c.cmd.Env = append(append(os.Environ(), childEnv+"="+kind), env...)
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
			t.Logf("%s output:\n%s", c.name, c.out.String())
		}
	})
	return c
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// kill SIGKILLs the child and waits for it.
func (c *child) kill(t testing.TB) {
	t.Helper()
	_ = c.cmd.Process.Kill()
	<-c.done
}

// waitKilled waits until the child died of SIGKILL (its failpoint).
func (c *child) waitKilled(t testing.TB, ctx context.Context) {
	t.Helper()
	select {
	case <-c.done:
	case <-ctx.Done():
		t.Fatalf("%s was not killed by its failpoint; output:\n%s", c.name, c.out.String())
	}
	ws := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("%s exited with %v, not SIGKILL; output:\n%s", c.name, c.cmd.ProcessState, c.out.String())
	}
}

// terminate SIGTERMs the child once it runs and waits for exit 0.
func (c *child) terminate(t testing.TB, ctx context.Context, running string) {
	t.Helper()
	testdb.Eventually(t, ctx, c.name+" running", func() bool { return strings.Contains(c.out.String(), running) })
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		t.Fatalf("%s did not stop; output:\n%s", c.name, c.out.String())
	}
	if !c.cmd.ProcessState.Success() {
		t.Fatalf("%s after SIGTERM: %v; output:\n%s", c.name, c.cmd.ProcessState, c.out.String())
	}
}
