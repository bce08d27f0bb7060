package inboxnats_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxnats "github.com/sqloutbox/outbox/inbox/nats"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay"
	natspub "github.com/sqloutbox/outbox/relay/nats"
	"github.com/sqloutbox/outbox/relay/nats/natstest"
)

var pgx = testdb.Target{Name: "pgx", Dialect: driver.Postgres}

// TestMain lets the test binary double as a consumer or relay process of
// the ledger proof, so that it can be SIGKILLed.
func TestMain(m *testing.M) {
	ledgertest.Main(m, consumerChild, relayChild)
}

// serverURL is the NATS server with JetStream the tests use.
func serverURL() string {
	if u := os.Getenv("OUTBOX_TEST_NATS"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// connect opens a connection of its own, closed when the test ends. A
// server that does not answer skips the test (fails it with
// OUTBOX_TEST_REQUIRE=1).
func connect(t testing.TB) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(serverURL(), nats.Timeout(5*time.Second), nats.MaxReconnects(-1))
	if err != nil {
		if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
			t.Fatalf("NATS at %s: %v", serverURL(), err)
		}
		t.Skipf("NATS at %s not available: %v", serverURL(), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func testCtx(t testing.TB, d time.Duration) context.Context { return ledgertest.Context(t, d) }

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// space is one test's own stream (binding Prefix+".>"), lease bucket and
// publisher; the stream and the bucket are deleted when the test ends.
type space struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	Prefix string
	Stream string
	Bucket string
	pub    *natspub.Publisher
	nextID int64
}

func newSpace(t testing.TB, mods ...func(*jetstream.StreamConfig)) *space {
	t.Helper()
	nc := connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, 30*time.Second)
	prefix := natstest.UniqueName("inboxnats-")
	st, err := natstest.CreateStream(ctx, js, []string{prefix + ".>"}, mods...)
	if err != nil {
		t.Fatal(err)
	}
	s := &space{nc: nc, js: js, Prefix: prefix, Stream: st.Name, Bucket: randomName("leases-")}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = st.Delete(ctx)
		if err := js.DeleteKeyValue(ctx, s.Bucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			t.Logf("deleting lease bucket %s: %v", s.Bucket, err)
		}
	})
	s.pub, err = natspub.NewPublisher(natspub.Config{Conn: nc, Subject: prefixed(prefix)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.pub.Close() })
	return s
}

// prefixed routes a message to prefix + "." + the relay's default subject
// (outbox.event.<type>.<id>), so that each test has subjects of its own.
func prefixed(prefix string) func(relay.Message) string {
	return func(m relay.Message) string { return prefix + "." + natspub.DefaultSubject(m) }
}

// event is one ledger event: aggregate agg's seq-th step.
func (s *space) event(agg string, seq int) relay.Message {
	s.nextID++
	return relay.Message{ID: s.nextID, MessageID: randomName("m-"), AggregateType: "account", AggregateID: agg,
		EventType: "account.step", ContentType: "application/json", Payload: []byte(fmt.Sprintf(`{"seq":%d}`, seq))}
}

// publish publishes seqs from..to of aggregates agg-000.. through the
// relay's publisher, interleaved (seq-major), and returns the last seq
// per aggregate.
func (s *space) publish(t testing.TB, aggregates, from, to int) map[string]int {
	t.Helper()
	want := map[string]int{}
	var msgs []relay.Message
	for seq := from; seq <= to; seq++ {
		for a := range aggregates {
			agg := fmt.Sprintf("agg-%03d", a)
			msgs = append(msgs, s.event(agg, seq))
			want[agg] = seq
		}
	}
	s.publishMsgs(t, msgs...)
	return want
}

func (s *space) publishMsgs(t testing.TB, msgs ...relay.Message) {
	t.Helper()
	if err := s.pub.Publish(testCtx(t, 60*time.Second), msgs); err != nil {
		t.Fatal(err)
	}
}

// consumerInfo returns the durable consumer's info.
func (s *space) consumerInfo(t testing.TB, durable string) *jetstream.ConsumerInfo {
	t.Helper()
	ctx := testCtx(t, 10*time.Second)
	c, err := s.js.Consumer(ctx, s.Stream, durable)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// fastRetry is a 1 ms constant backoff.
func fastRetry() backoff.BackOff { return backoff.NewConstantBackOff(time.Millisecond) }

// testConfig is a runner's config on s and c with quick test settings, on
// a connection of its own.
func testConfig(t testing.TB, s *space, c *ledgertest.DB) inboxnats.Config {
	return inboxnats.Config{Conn: connect(t), Stream: s.Stream, Durable: "ledger", Inbox: c.Inbox, DB: c.DB,
		Handler: ledgertest.LedgerHandler(c.Env.Target.Dialect, c.Ledger), Backoff: fastRetry, Logger: ledgertest.QuietLogger(),
		LeaseBucket: s.Bucket, LeaseTTL: 2 * time.Second, FetchMaxWait: time.Second}
}

func newRunner(t testing.TB, s *space, c *ledgertest.DB, mod func(*inboxnats.Config)) *inboxnats.Runner {
	t.Helper()
	cfg := testConfig(t, s, c)
	if mod != nil {
		mod(&cfg)
	}
	r, err := inboxnats.NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// runRunner runs r until the test ends (or stop is called); stop waits
// for Run to return and fails the test if it returned an error.
func runRunner(t testing.TB, r *inboxnats.Runner) (stop func()) { return ledgertest.Serve(t, r.Run) }

// forBatchSizes runs a test with one message per transaction and with
// batches (Config.BatchSize 8).
func forBatchSizes(t *testing.T, f func(t *testing.T, batch int)) {
	for _, n := range []int{0, 8} {
		t.Run(fmt.Sprintf("batch%d", n), func(t *testing.T) {
			t.Parallel()
			f(t, n)
		})
	}
}

// recorder is an Observer keeping every result and failed attempt.
type recorder struct {
	mu       sync.Mutex
	results  []inboxnats.Result
	failures map[uint64]int // stream sequence -> failed attempts
}

func (o *recorder) Processed(r inboxnats.Result) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.results = append(o.results, r)
}

func (o *recorder) AttemptFailed(_ string, seq uint64, _ int, _ error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.failures == nil {
		o.failures = map[uint64]int{}
	}
	o.failures[seq]++
}

func (o *recorder) snapshot() ([]inboxnats.Result, map[uint64]int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	f := map[uint64]int{}
	for k, v := range o.failures {
		f[k] = v
	}
	return append([]inboxnats.Result(nil), o.results...), f
}

// outcomeOf returns the outcomes recorded for stream sequence seq.
func (o *recorder) outcomesOf(seq uint64) []inbox.Outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []inbox.Outcome
	for _, r := range o.results {
		if r.Sequence == seq {
			out = append(out, r.Outcome)
		}
	}
	return out
}
