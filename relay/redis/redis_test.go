package redispub_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/internal/testkit/privateserver"
	"github.com/sqloutbox/outbox/outboxtest/publishertest"
	"github.com/sqloutbox/outbox/relay"
	redispub "github.com/sqloutbox/outbox/relay/redis"
	"github.com/sqloutbox/outbox/relay/redis/redistest"
)

var (
	_ relay.Publisher     = (*redispub.Publisher)(nil)
	_ relay.HealthChecker = (*redispub.Publisher)(nil)
)

// redisAddr is the Redis the tests use: OUTBOX_TEST_REDIS or 127.0.0.1:6379.
func redisAddr() string {
	if a := os.Getenv("OUTBOX_TEST_REDIS"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// connect returns a client of addr, closed when the test ends. A server
// that does not answer skips the test (fails it with
// OUTBOX_TEST_REQUIRE=1). go-redis's own retries are off: the relay
// retries.
func connect(t testing.TB, addr string, mod ...func(*redis.Options)) *redis.Client {
	t.Helper()
	if err := pingOnce(redisAddr()); err != nil {
		if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
			t.Fatalf("Redis at %s: %v", redisAddr(), err)
		}
		t.Skipf("Redis at %s not available: %v", redisAddr(), err)
	}
	o := &redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true, DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second}
	for _, f := range mod {
		f(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func pingOnce(addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func unique() string { return redistest.UniqueName("") }

// space is one test's own key prefix: every key under Prefix is deleted
// when the test ends (redistest.DeleteKeys).
type space struct {
	Prefix string
	c      *redis.Client
}

func newSpace(t testing.TB) *space {
	t.Helper()
	s := &space{Prefix: redistest.UniqueName("outboxtest:") + ":", c: connect(t, redisAddr())}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := redistest.DeleteKeys(ctx, s.c, s.Prefix+"*"); err != nil {
			t.Error(err)
		}
	})
	return s
}

// Stream routes into the space: Prefix + DefaultStream(m).
func (s *space) Stream(m relay.Message) string { return s.Prefix + redispub.DefaultStream(m) }

// consume reads the space's streams of the given aggregate types (Stream)
// from their start with redistest's consumer until the test ends.
func (s *space) consume(t testing.TB, aggregateTypes ...string) *redistest.Consumer {
	t.Helper()
	streams := make([]string, len(aggregateTypes))
	for i, typ := range aggregateTypes {
		streams[i] = s.Stream(relay.Message{AggregateType: typ})
	}
	c, err := redistest.NewConsumer(&redis.Options{Addr: redisAddr()}, streams...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// entries returns every entry of every stream under the prefix, each
// stream's in stream order.
func (s *space) entries(ctx context.Context) ([]redis.XMessage, error) {
	keys, err := s.c.Keys(ctx, s.Prefix+"*").Result()
	if err != nil {
		return nil, err
	}
	var out []redis.XMessage
	for _, k := range keys {
		if typ, err := s.c.Type(ctx, k).Result(); err != nil || typ != "stream" {
			continue
		}
		xs, err := s.c.XRange(ctx, k, "-", "+").Result()
		if err != nil {
			return nil, err
		}
		out = append(out, xs...)
	}
	return out, nil
}

func newPublisher(t *testing.T, cfg redispub.Config) *redispub.Publisher {
	t.Helper()
	p, err := redispub.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func startProxy(t *testing.T) *faultproxy.Proxy {
	t.Helper()
	proxy, err := faultproxy.Start(redisAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	return proxy
}

// TestConformance runs the shared publisher suite against Redis Streams,
// each subtest with its own key prefix, its own client through its own
// TCP proxy for the outage (the shared server is never stopped), and
// MaxMessageBytes 10,000. Redis's quirks: the publisher holds an
// aggregate back within a batch (HoldsBack); Redis creates a stream on
// the first XADD, so the missing route is a key of another type at the
// stream's name (WRONGTYPE).
func TestConformance(t *testing.T) {
	t.Parallel()
	publishertest.Run(t, publishertest.Config{
		New: func(t *testing.T) publishertest.Target {
			s := newSpace(t)
			proxy := startProxy(t)
			c := connect(t, proxy.Addr())
			wrong := s.Prefix + "not-a-stream"
			if err := s.c.Set(testCtx(t, 10*time.Second), wrong, "x", 0).Err(); err != nil {
				t.Fatal(err)
			}
			cons := s.consume(t, "order", "invoice")
			p := newPublisher(t, redispub.Config{Client: c, MaxMessageBytes: 10_000, Stream: func(m relay.Message) string {
				if m.Topic != "" {
					return m.Topic
				}
				return s.Stream(m)
			}})
			return publishertest.Target{
				Publisher: p,
				Received: func(ctx context.Context, n int) ([]publishertest.Record, error) {
					recs, err := cons.WaitForCount(ctx, n)
					return redistest.PublisherRecords(recs), err
				},
				Unroutable: func(m *relay.Message) { m.Topic = wrong },
				Outage: func() func() {
					proxy.Refuse(true)
					proxy.CutAll()
					return func() { proxy.Refuse(false) }
				},
			}
		},
		Quirks: publishertest.Quirks{TooLargePayload: 20_000, HoldsBack: true},
		CheckRecord: func(t *testing.T, r publishertest.Record, m relay.Message) {
			t.Helper()
			x := r.Raw.(redistest.Record)
			if x.Values[emit.HeaderAggregateID] != m.AggregateID {
				t.Errorf("%s: aggregate field %q", m.MessageID, x.Values[emit.HeaderAggregateID])
			}
		},
	})
}

func TestNewPublisherConfigErrors(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: redisAddr()})
	defer c.Close()
	for _, cfg := range []redispub.Config{{}, {Client: c, MaxInFlight: -1}, {Client: c, MaxMessageBytes: -1},
		{Client: c, MaxLen: -1}, {Client: c, MaxLen: 10, MinID: "0-1"}} {
		if p, err := redispub.NewPublisher(cfg); !errors.Is(err, redispub.ErrConfig) || p != nil {
			t.Errorf("NewPublisher(%+v) = %v, %v; want ErrConfig", cfg, p, err)
		}
	}
}

func msgs(n, aggs int) []relay.Message {
	out := make([]relay.Message, n)
	for i := range out {
		out[i] = relay.Message{ID: int64(i + 1), MessageID: fmt.Sprintf("m-%03d", i), AggregateType: "order",
			AggregateID: fmt.Sprintf("a-%d", i%aggs), EventType: "order.updated", ContentType: "application/octet-stream",
			Payload: []byte{byte(i), 0, '\r', '\n', 0xff}}
	}
	return out
}

// TestStreamsAndFields: one stream per aggregate type (DefaultStream),
// Topic overrides it; fields carry payload and headers byte for byte;
// no trimming by default.
func TestStreamsAndFields(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	p := newPublisher(t, redispub.Config{Client: connect(t, redisAddr()), Stream: s.Stream})
	ctx := testCtx(t, 30*time.Second)
	batch := msgs(6, 3)
	batch[5].AggregateType = "invoice"
	batch[0].Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "x": " a\r\nb "}
	if err := p.Publish(ctx, batch); err != nil {
		t.Fatal(err)
	}
	for stream, want := range map[string]int64{s.Prefix + "outbox.event.order": 5, s.Prefix + "outbox.event.invoice": 1} {
		if n, err := s.c.XLen(ctx, stream).Result(); err != nil || n != want {
			t.Errorf("XLEN %s = %d, %v; want %d", stream, n, err, want)
		}
	}
	xs, err := s.c.XRange(ctx, s.Prefix+"outbox.event.order", "-", "+").Result()
	if err != nil || len(xs) == 0 {
		t.Fatal(xs, err)
	}
	var v map[string]any
	for _, x := range xs { // aggregates pipeline: find m-000
		if x.Values[emit.HeaderMessageID] == "m-000" {
			v = x.Values
		}
	}
	if v[redispub.PayloadField] != string(batch[0].Payload) || v["x"] != " a\r\nb " || v[emit.HeaderMessageID] != "m-000" {
		t.Errorf("fields %q", v)
	}
	if got := redispub.DefaultStream(relay.Message{AggregateType: "order", Topic: "custom"}); got != "custom" {
		t.Errorf("DefaultStream with Topic = %q", got)
	}
}

// TestTooLarge: a message above MaxMessageBytes fails alone with
// relay.ErrPermanent and ErrTooLarge, never sent; its aggregate's later
// message is held back; another aggregate's is stored.
func TestTooLarge(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	p := newPublisher(t, redispub.Config{Client: connect(t, redisAddr()), Stream: s.Stream})
	batch := msgs(3, 2) // a-0, a-1, a-0
	batch[0].Payload = bytes.Repeat([]byte("x"), redispub.DefaultMaxMessageBytes)
	err := p.Publish(testCtx(t, 30*time.Second), batch)
	var pe relay.PublishErrors
	if !errors.As(err, &pe) || len(pe) != 3 {
		t.Fatalf("Publish = %v, want PublishErrors of 3", err)
	}
	if !errors.Is(pe[0], relay.ErrPermanent) || !errors.Is(pe[0], redispub.ErrTooLarge) {
		t.Errorf("entry 0 = %v, want ErrPermanent and ErrTooLarge", pe[0])
	}
	if pe[1] != nil {
		t.Errorf("entry 1 = %v", pe[1])
	}
	if !errors.Is(pe[2], redispub.ErrHeldBack) || errors.Is(pe[2], relay.ErrPermanent) {
		t.Errorf("entry 2 = %v, want ErrHeldBack, not permanent", pe[2])
	}
	xs, err := s.entries(testCtx(t, 10*time.Second))
	if err != nil || len(xs) != 1 || xs[0].Values[emit.HeaderMessageID] != batch[1].MessageID {
		t.Errorf("stored %v, %v; want only %s", xs, err, batch[1].MessageID)
	}
}

// TestReservedHeader: an event header named like one of the entry's own
// fields fails with relay.ErrPermanent, never sent.
func TestReservedHeader(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	p := newPublisher(t, redispub.Config{Client: connect(t, redisAddr()), Stream: s.Stream})
	for i, name := range []string{redispub.PayloadField, emit.HeaderMessageID} {
		batch := msgs(2, 2)
		for j := range batch {
			batch[j].MessageID = fmt.Sprintf("%d-%s", i, batch[j].MessageID)
		}
		batch[0].Headers = map[string]string{name: "x"}
		err := p.Publish(testCtx(t, 30*time.Second), batch)
		var pe relay.PublishErrors
		if !errors.As(err, &pe) || !errors.Is(pe[0], relay.ErrPermanent) || pe[1] != nil {
			t.Errorf("header %q: Publish = %v, want entry 0 permanent, entry 1 nil", name, err)
		}
	}
}

// TestNoPermission: a Redis ACL user without XADD (created for the test,
// deleted after): Publish returns one error wrapping relay.ErrUnavailable
// (NOPERM), not permanent, not PublishErrors.
func TestNoPermission(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	ctx := testCtx(t, 30*time.Second)
	user, pass := "outboxtest-"+unique(), unique()
	if err := s.c.Do(ctx, "ACL", "SETUSER", user, "on", ">"+pass, "~*", "+@all", "-xadd").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.c.Do(ctx, "ACL", "DELUSER", user).Err(); err != nil {
			t.Errorf("ACL DELUSER %s: %v", user, err)
		}
	})
	c := connect(t, redisAddr(), func(o *redis.Options) { o.Username, o.Password = user, pass })
	p := newPublisher(t, redispub.Config{Client: c, Stream: s.Stream})
	err := p.Publish(ctx, msgs(4, 2))
	var pe relay.PublishErrors
	if errors.As(err, &pe) || !errors.Is(err, relay.ErrUnavailable) || errors.Is(err, relay.ErrPermanent) ||
		!strings.Contains(err.Error(), "NOPERM") || !strings.Contains(err.Error(), "ACL SETUSER <user> +xadd ~"+s.Prefix) {
		t.Errorf("Publish without XADD permission = %v, want one error wrapping ErrUnavailable (NOPERM) naming the ACL to grant", err)
	}
	if err := p.Healthy(ctx); err != nil {
		t.Errorf("Healthy (PING is allowed): %v", err)
	}
}

// TestWrongType: a key of another type at the stream's name is
// relay.ErrUnavailable (WRONGTYPE) for its messages; another stream's
// messages are stored.
func TestWrongType(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	ctx := testCtx(t, 30*time.Second)
	if err := s.c.Set(ctx, s.Prefix+"outbox.event.order", "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, redispub.Config{Client: connect(t, redisAddr()), Stream: s.Stream})
	batch := msgs(3, 3)
	batch[2].AggregateType = "invoice"
	err := p.Publish(ctx, batch)
	var pe relay.PublishErrors
	if !errors.As(err, &pe) || len(pe) != 3 {
		t.Fatalf("Publish = %v, want PublishErrors of 3", err)
	}
	for i := range 2 {
		if !errors.Is(pe[i], relay.ErrUnavailable) || !strings.Contains(pe[i].Error(), "WRONGTYPE") {
			t.Errorf("entry %d = %v, want ErrUnavailable (WRONGTYPE)", i, pe[i])
		}
	}
	if pe[2] != nil {
		t.Errorf("entry 2 = %v", pe[2])
	}
}

// TestTrimOptIn: MaxLen trims (exactly, with ExactTrim); without it
// nothing is trimmed.
func TestTrimOptIn(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	ctx := testCtx(t, 30*time.Second)
	c := connect(t, redisAddr())
	trimmed := newPublisher(t, redispub.Config{Client: c, MaxLen: 3, ExactTrim: true, Stream: func(m relay.Message) string { return s.Prefix + "trimmed" }})
	kept := newPublisher(t, redispub.Config{Client: c, Stream: func(m relay.Message) string { return s.Prefix + "kept" }})
	for _, p := range []*redispub.Publisher{trimmed, kept} {
		if err := p.Publish(ctx, msgs(10, 2)); err != nil {
			t.Fatal(err)
		}
	}
	for k, want := range map[string]int64{"trimmed": 3, "kept": 10} {
		if n, err := s.c.XLen(ctx, s.Prefix+k).Result(); err != nil || n != want {
			t.Errorf("XLEN %s = %d, %v; want %d", k, n, err, want)
		}
	}
}

// TestHealthy: nil while connected; an error while the server is
// unreachable (through the test's proxy); nil again after.
func TestHealthy(t *testing.T) {
	t.Parallel()
	proxy := startProxy(t)
	p := newPublisher(t, redispub.Config{Client: connect(t, proxy.Addr())})
	ctx := testCtx(t, 30*time.Second)
	if err := p.Healthy(ctx); err != nil {
		t.Fatalf("Healthy while connected: %v", err)
	}
	proxy.Refuse(true)
	proxy.CutAll()
	if err := p.Healthy(ctx); err == nil {
		t.Error("Healthy with the server unreachable = nil")
	}
	proxy.Refuse(false)
	if err := p.Healthy(ctx); err != nil {
		t.Errorf("Healthy after the outage: %v", err)
	}
}

// TestPublishAfterClose: Publish after Close returns ErrClosed.
func TestPublishAfterClose(t *testing.T) {
	t.Parallel()
	p := newPublisher(t, redispub.Config{Client: connect(t, redisAddr())})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(t.Context(), msgs(1, 1)); !errors.Is(err, redispub.ErrClosed) {
		t.Errorf("Publish after Close = %v, want ErrClosed", err)
	}
}

// TestStalledServer: the connection stays open but nothing comes back:
// Publish returns one error for the batch (not PublishErrors) by its
// deadline, with one XADD per aggregate sent (pipelined across
// aggregates, not within one): the stream holds nothing of the batch
// beyond the first message of each aggregate.
func TestStalledServer(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	proxy := startProxy(t)
	p := newPublisher(t, redispub.Config{Client: connect(t, proxy.Addr(), func(o *redis.Options) { o.ReadTimeout = -1 }), Stream: s.Stream})
	if err := p.Healthy(testCtx(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	batch := msgs(30, 5)
	proxy.Stall(true)
	const deadline = time.Second
	short, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	start := time.Now()
	err := p.Publish(short, batch)
	elapsed := time.Since(start)
	var pe relay.PublishErrors
	if err == nil || errors.As(err, &pe) || errors.Is(err, relay.ErrPermanent) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Publish with the server stalled = %v, want one error wrapping context.DeadlineExceeded", err)
	}
	if elapsed > deadline+time.Second {
		t.Errorf("Publish returned after %s with a %s deadline", elapsed, deadline)
	}
	xs, err := s.entries(testCtx(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if len(xs) > 5 {
		t.Errorf("%d entries stored while no reply came back, want at most one per aggregate (5)", len(xs))
	}
	proxy.Stall(false)
	proxy.CutAll()
}

// TestWrongPassword: credentials the server refuses (WRONGPASS: a password
// rotated, an ACL user deleted or never created) are a misconfigured
// route, like NOPERM: Publish returns one error wrapping
// relay.ErrUnavailable, so the relay backs off without counting attempts
// and dead-letters nothing, never a retriable failure of every message
// (which spends their attempts and dead-letters the backlog).
// TestWrongPassword: credentials the server refuses (an ACL user that
// does not exist: WRONGPASS) are the route's state (a rotated password, a
// deleted user), not the messages' fault: one error for the batch wrapping
// relay.ErrUnavailable, never ErrPermanent, nothing stored.
func TestWrongPassword(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	ctx := testCtx(t, 30*time.Second)
	user := "outboxtest-" + unique() // never created: AUTH fails with WRONGPASS
	c := connect(t, redisAddr(), func(o *redis.Options) { o.Username, o.Password = user, unique() })
	p := newPublisher(t, redispub.Config{Client: c, Stream: s.Stream})
	err := p.Publish(ctx, msgs(4, 2))
	var pe relay.PublishErrors
	if errors.As(err, &pe) || !errors.Is(err, relay.ErrUnavailable) || errors.Is(err, relay.ErrPermanent) {
		t.Errorf("Publish with a refused password = %v, want one error wrapping ErrUnavailable", err)
	}
	if xs, err := s.entries(ctx); err != nil || len(xs) != 0 {
		t.Errorf("stored %v, %v; want nothing", xs, err)
	}
}

// TestOutOfMemory: a server at its maxmemory with noeviction refuses
// every XADD with OOM. That is the server's state, not the messages'
// fault: one error for the batch wrapping relay.ErrUnavailable (the relay
// backs off, counts no attempt, dead-letters nothing), never
// ErrPermanent. It runs on a private redis-server (the shared one is
// never reconfigured). REGRESSION: OOM was an ordinary per-message
// failure, so a server out of memory for long enough dead-lettered the
// backlog.
func TestOutOfMemory(t *testing.T) {
	t.Parallel()
	addr := privateserver.RedisServer(t, "--maxmemory-policy", "noeviction")
	c := connect(t, addr)
	ctx := testCtx(t, 30*time.Second)
	if err := c.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil { // below what the server already uses
		t.Fatal(err)
	}
	p := newPublisher(t, redispub.Config{Client: c})
	err := p.Publish(ctx, msgs(4, 2))
	var pe relay.PublishErrors
	if err == nil || errors.As(err, &pe) || !errors.Is(err, relay.ErrUnavailable) || errors.Is(err, relay.ErrPermanent) {
		t.Errorf("Publish to a server out of memory = %v, want one error wrapping ErrUnavailable", err)
	}
	if n, err := c.DBSize(ctx).Result(); err != nil || n != 0 {
		t.Errorf("the server holds %d keys (%v); want none", n, err)
	}
}
