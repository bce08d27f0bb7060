package natspub_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/outboxtest/publishertest"
	"github.com/sqloutbox/outbox/relay"
	natspub "github.com/sqloutbox/outbox/relay/nats"
	"github.com/sqloutbox/outbox/relay/nats/natstest"
)

var (
	_ relay.Publisher     = (*natspub.Publisher)(nil)
	_ relay.HealthChecker = (*natspub.Publisher)(nil)
)

// serverURL is the NATS server with JetStream the tests use.
func serverURL() string {
	if u := os.Getenv("OUTBOX_TEST_NATS"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// connect connects to url and closes the connection when the test ends. A
// server that does not answer skips the test (fails it with
// OUTBOX_TEST_REQUIRE=1).
func connect(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	opts = append([]nats.Option{nats.Timeout(5 * time.Second)}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
			t.Fatalf("NATS at %s: %v", url, err)
		}
		t.Skipf("NATS at %s not available: %v", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// space is one test's own stream and subjects: every subject under
// Prefix+"." is stored in Stream, which is deleted when the test ends.
type space struct {
	Prefix string
	Stream string
	js     jetstream.JetStream
}

// newSpace creates a uniquely named memory stream binding Prefix+".>" with
// maxMsgSize (0: unlimited), on its own admin connection (natstest).
func newSpace(t testing.TB, maxMsgSize int32) *space {
	t.Helper()
	nc := connect(t, serverURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	prefix := natstest.UniqueName("outboxtest-")
	st, err := natstest.CreateStream(testCtx(t, 10*time.Second), js, []string{prefix + ".>"}, func(c *jetstream.StreamConfig) {
		if maxMsgSize > 0 {
			c.MaxMsgSize = maxMsgSize
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := st.Delete(ctx); err != nil {
			t.Error(err)
		}
	})
	return &space{Prefix: prefix, Stream: st.Name, js: js}
}

// Subject routes into the space: Prefix + "." + DefaultSubject(m), except
// that a message with a Topic keeps DefaultSubject's Topic form (outside
// the space: the tests' unroutable messages).
func (s *space) Subject(m relay.Message) string {
	if m.Topic != "" {
		return natspub.DefaultSubject(m)
	}
	return s.Prefix + "." + natspub.DefaultSubject(m)
}

// consume consumes the space's stream from its start (natstest's ordered
// consumer: stream sequence order) until the test ends.
func (s *space) consume(t *testing.T) *natstest.Consumer {
	t.Helper()
	c, err := natstest.NewConsumer(testCtx(t, 10*time.Second), s.js, s.Stream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func newPublisher(t *testing.T, cfg natspub.Config) *natspub.Publisher {
	t.Helper()
	p, err := natspub.NewPublisher(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// TestConformance runs the shared publisher suite against JetStream, each
// subtest with its own stream (max_msg_size 10,000 bytes) and subjects,
// and its own connection through its own TCP proxy for the outage (the
// shared server is never stopped). JetStream's quirks: the publisher holds
// an aggregate back within a batch (HoldsBack); a subject no stream binds
// is the missing route.
func TestConformance(t *testing.T) {
	t.Parallel()
	publishertest.Run(t, publishertest.Config{
		New: func(t *testing.T) publishertest.Target {
			s := newSpace(t, 10_000)
			proxy, err := faultproxy.Start(strings.TrimPrefix(serverURL(), "nats://"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = proxy.Close() })
			nc := connect(t, "nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
			p := newPublisher(t, natspub.Config{Conn: nc, Subject: s.Subject})
			c := s.consume(t)
			return publishertest.Target{
				Publisher: p,
				Received: func(ctx context.Context, n int) ([]publishertest.Record, error) {
					recs, err := c.WaitForCount(ctx, n)
					return natstest.PublisherRecords(recs), err
				},
				Unroutable: func(m *relay.Message) { m.Topic = natstest.UniqueName("outboxtest-nostream-") },
				Outage: func() func() {
					proxy.Refuse(true)
					return func() { proxy.Refuse(false) }
				},
			}
		},
		Quirks: publishertest.Quirks{TooLargePayload: 20_000, HoldsBack: true},
		CheckRecord: func(t *testing.T, r publishertest.Record, m relay.Message) {
			t.Helper()
			jm := r.Raw.(natstest.Record)
			if got := jm.Headers[natspub.MsgIDHeader]; got != m.MessageID {
				t.Errorf("%s: %s %q, want the message ID", m.MessageID, natspub.MsgIDHeader, got)
			}
			if want := natspub.SubjectToken(m.AggregateID); !strings.HasSuffix(jm.Subject, "."+want) ||
				!strings.Contains(jm.Subject, "."+m.AggregateType+".") {
				t.Errorf("%s: subject %q, want .%s.%s at its end", m.MessageID, jm.Subject, m.AggregateType, want)
			}
		},
	})
}

func TestSubjectToken(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"o-17":      "o-17",
		"A_z-9":     "A_z-9",
		"":          "%",
		"a.b":       "a%2Eb",
		"*":         "%2A",
		">":         "%3E",
		"a b\tc":    "a%20b%09c",
		"%":         "%25",
		"%25":       "%2525",
		"ü":         "%C3%BC",
		"x/y:z\x00": "x%2Fy%3Az%00",
	} {
		got := natspub.SubjectToken(in)
		if got != want {
			t.Errorf("SubjectToken(%q) = %q, want %q", in, got, want)
		}
		back, err := natspub.DecodeSubjectToken(got)
		if err != nil || back != in {
			t.Errorf("DecodeSubjectToken(%q) = %q, %v; want %q", got, back, err, in)
		}
		if strings.ContainsAny(got, ".*> \t\r\n") {
			t.Errorf("SubjectToken(%q) = %q holds a subject metacharacter or whitespace", in, got)
		}
	}
	for _, bad := range []string{"", "a.b", "%2", "%zz", "%2e", "a b", "*", "%%"} {
		if _, err := natspub.DecodeSubjectToken(bad); !errors.Is(err, natspub.ErrBadToken) {
			t.Errorf("DecodeSubjectToken(%q) = %v, want ErrBadToken", bad, err)
		}
	}
}

// FuzzSubjectToken: every string encodes to a valid, distinct token that
// decodes back.
func FuzzSubjectToken(f *testing.F) {
	for _, s := range []string{"", "a", "a.b", "%", "ü*>", "\x00\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok := natspub.SubjectToken(s)
		if tok == "" || strings.ContainsAny(tok, ".*> \t\r\n") {
			t.Fatalf("SubjectToken(%q) = %q", s, tok)
		}
		back, err := natspub.DecodeSubjectToken(tok)
		if err != nil || back != s {
			t.Fatalf("round trip of %q: %q, %v", s, back, err)
		}
	})
}

func TestNewPublisherConfigErrors(t *testing.T) {
	t.Parallel()
	for _, cfg := range []natspub.Config{{}, {Conn: &nats.Conn{}, MaxInFlight: -1}, {Conn: &nats.Conn{}, AckTimeout: -time.Second}} {
		if p, err := natspub.NewPublisher(cfg); !errors.Is(err, natspub.ErrConfig) || p != nil {
			t.Errorf("NewPublisher(%+v) = %v, %v; want ErrConfig", cfg, p, err)
		}
	}
}

func msgs(n, aggs int) []relay.Message {
	out := make([]relay.Message, n)
	for i := range out {
		out[i] = relay.Message{ID: int64(i + 1), MessageID: fmt.Sprintf("m-%03d", i), AggregateType: "order",
			AggregateID: fmt.Sprintf("a-%d", i%aggs), EventType: "order.updated", ContentType: "application/octet-stream",
			Payload: []byte{byte(i)}}
	}
	return out
}

// TestMaxPayload: a message above the server's max_payload fails alone
// with relay.ErrPermanent (nats.ErrMaxPayload, refused before sending);
// its aggregate's later message is held back, not sent; another
// aggregate's message is stored.
func TestMaxPayload(t *testing.T) {
	t.Parallel()
	s := newSpace(t, 0)
	nc := connect(t, serverURL())
	p := newPublisher(t, natspub.Config{Conn: nc, Subject: s.Subject})
	if got, max := p.MaxRecordBytes(), int(nc.MaxPayload()); got >= max || got <= 0 {
		t.Errorf("MaxRecordBytes = %d with max_payload %d", got, max)
	}
	batch := msgs(3, 2) // a-0, a-1, a-0
	batch[0].Payload = bytes.Repeat([]byte("x"), int(nc.MaxPayload())+1)
	err := p.Publish(testCtx(t, 30*time.Second), batch)
	var pe relay.PublishErrors
	if !errors.As(err, &pe) || len(pe) != 3 {
		t.Fatalf("Publish = %v, want PublishErrors of 3", err)
	}
	if !errors.Is(pe[0], relay.ErrPermanent) || !errors.Is(pe[0], nats.ErrMaxPayload) {
		t.Errorf("entry 0 = %v, want ErrPermanent wrapping nats.ErrMaxPayload", pe[0])
	}
	if pe[1] != nil {
		t.Errorf("entry 1 (another aggregate) = %v", pe[1])
	}
	if !errors.Is(pe[2], natspub.ErrHeldBack) || errors.Is(pe[2], relay.ErrPermanent) {
		t.Errorf("entry 2 = %v, want ErrHeldBack, not permanent", pe[2])
	}
	recs, err := s.consume(t).WaitForCount(testCtx(t, 10*time.Second), 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Headers[emit.HeaderMessageID] != batch[1].MessageID {
		t.Errorf("stored %d messages, want only %s", len(recs), batch[1].MessageID)
	}
}

// TestDuplicateWindow: the same batch published twice (a relay re-sending
// after a lost acknowledgement) is acknowledged both times and stored
// once: Nats-Msg-Id dedupes within the stream's duplicate window.
func TestDuplicateWindow(t *testing.T) {
	t.Parallel()
	s := newSpace(t, 0)
	p := newPublisher(t, natspub.Config{Conn: connect(t, serverURL()), Subject: s.Subject})
	ctx := testCtx(t, 30*time.Second)
	batch := msgs(20, 4)
	for range 2 {
		if err := p.Publish(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	st, err := s.js.Stream(ctx, s.Stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != uint64(len(batch)) {
		t.Errorf("stream holds %d messages after publishing %d twice, want %d", info.State.Msgs, len(batch), len(batch))
	}
}

// TestUncarriableRow: a row written before Emit refused such headers (a
// value with CR LF, a name NATS refuses, a name JetStream would act on)
// fails with relay.ErrPermanent and is never sent; the other aggregate's
// message is stored.
func TestUncarriableRow(t *testing.T) {
	t.Parallel()
	s := newSpace(t, 0)
	p := newPublisher(t, natspub.Config{Conn: connect(t, serverURL()), Subject: s.Subject})
	for i, h := range []map[string]string{{"v": "a\r\nNats-Msg-Id: x"}, {"a:b": "v"}, {"Nats-Expected-Stream": "x"}, {"v": " padded"}} {
		batch := msgs(2, 2)
		for j := range batch {
			batch[j].MessageID = fmt.Sprintf("%d-%s", i, batch[j].MessageID)
		}
		batch[0].Headers = h
		err := p.Publish(testCtx(t, 30*time.Second), batch)
		var pe relay.PublishErrors
		if !errors.As(err, &pe) || !errors.Is(pe[0], relay.ErrPermanent) || pe[1] != nil {
			t.Errorf("headers %q: Publish = %v, want entry 0 permanent, entry 1 nil", h, err)
		}
	}
	recs, err := s.consume(t).WaitForCount(testCtx(t, 10*time.Second), 4)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if !strings.HasSuffix(r.Headers[emit.HeaderMessageID], "m-001") {
			t.Errorf("stored %s", r.Headers[emit.HeaderMessageID])
		}
	}
}

// TestHealthy: nil while connected; an error while the server is
// unreachable (through the test's proxy); nil again after.
func TestHealthy(t *testing.T) {
	t.Parallel()
	proxy, err := faultproxy.Start(strings.TrimPrefix(serverURL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	nc := connect(t, "nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	p := newPublisher(t, natspub.Config{Conn: nc})
	ctx := testCtx(t, 30*time.Second)
	if err := p.Healthy(ctx); err != nil {
		t.Fatalf("Healthy while connected: %v", err)
	}
	proxy.Refuse(true)
	waitFor(ctx, t, "Healthy to fail", func() bool {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return p.Healthy(hctx) != nil
	})
	proxy.Refuse(false)
	waitFor(ctx, t, "Healthy to recover", func() bool {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return p.Healthy(hctx) == nil
	})
}

// waitFor polls cond (each try bounded by its own round trip) until it
// holds or ctx ends.
func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-tick.C:
		}
	}
}

// TestPublishAfterClose: Publish after Close returns ErrClosed.
func TestPublishAfterClose(t *testing.T) {
	t.Parallel()
	p := newPublisher(t, natspub.Config{Conn: connect(t, serverURL())})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Publish(t.Context(), msgs(1, 1)); !errors.Is(err, natspub.ErrClosed) {
		t.Errorf("Publish after Close = %v, want ErrClosed", err)
	}
}

// TestStalledServer: the connection stays open but nothing comes back (the
// proxy drops every byte): Publish returns one error for the batch (not
// PublishErrors) wrapping context.DeadlineExceeded by its deadline, having
// sent one message per aggregate (pipelined across aggregates, not within
// one). The
// relay's re-send after the stall is acknowledged, and whatever of the
// first attempt reached the stream is not stored twice (Nats-Msg-Id).
func TestStalledServer(t *testing.T) {
	t.Parallel()
	s := newSpace(t, 0)
	proxy, err := faultproxy.Start(strings.TrimPrefix(serverURL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	nc := connect(t, "nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	p := newPublisher(t, natspub.Config{Conn: nc, Subject: s.Subject})
	batch := msgs(30, 5)
	proxy.Stall(true)
	sentBefore := nc.Stats().OutMsgs
	const deadline = time.Second
	short, cancel := context.WithTimeout(t.Context(), deadline)
	defer cancel()
	start := time.Now()
	err = p.Publish(short, batch)
	elapsed := time.Since(start)
	var pe relay.PublishErrors
	if err == nil || errors.As(err, &pe) || errors.Is(err, relay.ErrPermanent) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Publish with the server stalled = %v, want one transient error wrapping context.DeadlineExceeded", err)
	}
	if elapsed > deadline+time.Second {
		t.Errorf("Publish returned after %s with a %s deadline", elapsed, deadline)
	}
	// Without PubAcks exactly the first message of each of the 5
	// aggregates went out: aggregates pipeline, an aggregate's next message
	// waits for the previous one's PubAck.
	if sent := nc.Stats().OutMsgs - sentBefore; sent != 5 {
		t.Errorf("%d messages sent while no PubAck came back, want 5 (one per aggregate)", sent)
	}
	proxy.Stall(false)
	proxy.CutAll() // the stalled stream lost bytes: start a clean connection
	ctx := testCtx(t, 60*time.Second)
	for {
		try, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = p.Publish(try, batch)
		cancel()
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Publish after the stall: %v", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	recs, err := s.consume(t).WaitForCount(ctx, len(batch))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range recs {
		id := r.Headers[emit.HeaderMessageID]
		if seen[id] {
			t.Errorf("%s stored twice", id)
		}
		seen[id] = true
	}
}

// TestMaxInFlight: with the server stalled, at most MaxInFlight aggregates
// have a message out awaiting its PubAck.
func TestMaxInFlight(t *testing.T) {
	t.Parallel()
	s := newSpace(t, 0)
	proxy, err := faultproxy.Start(strings.TrimPrefix(serverURL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	nc := connect(t, "nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	p := newPublisher(t, natspub.Config{Conn: nc, Subject: s.Subject, MaxInFlight: 2})
	proxy.Stall(true)
	before := nc.Stats().OutMsgs
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	if err := p.Publish(ctx, msgs(10, 5)); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Publish = %v, want the deadline", err)
	}
	if sent := nc.Stats().OutMsgs - before; sent != 2 {
		t.Errorf("%d messages sent without PubAcks, want MaxInFlight = 2", sent)
	}
}

// TestErrorSources: the classes wrap what JetStream said: a subject no
// stream binds is relay.ErrUnavailable wrapping ErrNoStreamResponse (one
// error for an all-missing batch); a message above the stream's
// max_msg_size is relay.ErrPermanent wrapping the API error 10054.
func TestErrorSources(t *testing.T) {
	t.Parallel()
	s := newSpace(t, 1_000)
	p := newPublisher(t, natspub.Config{Conn: connect(t, serverURL()), Subject: s.Subject})
	ctx := testCtx(t, 30*time.Second)

	missing := msgs(2, 2)
	for i := range missing {
		missing[i].Topic = natstest.UniqueName("outboxtest-nostream-")
	}
	err := p.Publish(ctx, missing)
	var pe relay.PublishErrors
	if errors.As(err, &pe) || !errors.Is(err, relay.ErrUnavailable) || !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Errorf("Publish to a missing stream = %v, want one error wrapping ErrUnavailable and ErrNoStreamResponse", err)
	} else if want := fmt.Sprintf("subject %q", natspub.DefaultSubject(missing[0])); !strings.Contains(err.Error(), want) {
		// The subject a stream must bind, so the operator knows what to
		// create. REGRESSION: the error named no subject.
		t.Errorf("Publish to a missing stream = %v, want it to name the %s", err, want)
	}

	big := msgs(1, 1)
	big[0].Payload = bytes.Repeat([]byte("x"), 2_000)
	err = p.Publish(ctx, big)
	var apiErr *jetstream.APIError
	if !errors.As(err, &pe) || !errors.Is(pe[0], relay.ErrPermanent) || !errors.As(pe[0], &apiErr) ||
		apiErr.ErrorCode != jetstream.JSErrCodeStreamMessageExceedsMaximum {
		t.Errorf("Publish above max_msg_size = %v, want PublishErrors{ErrPermanent wrapping API error 10054}", err)
	}
}

// TestStreamFull: a stream that refuses new messages because it is full
// (DiscardNew at MaxMsgs: "maximum messages exceeded", status 503) is the
// route's state, not the messages' fault: the refused messages wrap
// relay.ErrUnavailable (the relay backs off, counts no attempt,
// dead-letters nothing), never ErrPermanent; a batch refused whole is one
// error. REGRESSION: they were ordinary failures, each counting an
// attempt, so a stream full for long enough dead-lettered the backlog.
func TestStreamFull(t *testing.T) {
	t.Parallel()
	nc := connect(t, serverURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	prefix := natstest.UniqueName("outboxtest-full-")
	st, err := natstest.CreateStream(testCtx(t, 10*time.Second), js, []string{prefix + ".>"}, func(c *jetstream.StreamConfig) {
		c.MaxMsgs, c.Discard = 2, jetstream.DiscardNew
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := st.Delete(ctx); err != nil {
			t.Error(err)
		}
	})
	p := newPublisher(t, natspub.Config{Conn: nc, Subject: func(m relay.Message) string { return prefix + "." + natspub.DefaultSubject(m) }})

	batch := msgs(5, 5) // five aggregates, one message each: two fit
	err = p.Publish(testCtx(t, 30*time.Second), batch)
	var pe relay.PublishErrors
	if !errors.As(err, &pe) || len(pe) != len(batch) {
		t.Fatalf("Publish into a stream with room for 2 of 5 = %v, want PublishErrors of 5", err)
	}
	stored, refused := 0, 0
	for i, e := range pe {
		switch {
		case e == nil:
			stored++
		case errors.Is(e, relay.ErrUnavailable) && !errors.Is(e, relay.ErrPermanent):
			refused++
		default:
			t.Errorf("entry %d = %v, want nil or ErrUnavailable", i, e)
		}
	}
	if stored != 2 || refused != 3 {
		t.Errorf("%d acknowledged, %d refused as unavailable; want 2 and 3", stored, refused)
	}

	// Full: the next batch (new message IDs: not duplicates the stream
	// would acknowledge) is refused whole, as one error.
	next := msgs(3, 3)
	for i := range next {
		next[i].MessageID += "-next"
	}
	err = p.Publish(testCtx(t, 30*time.Second), next)
	if err == nil || errors.As(err, &pe) || !errors.Is(err, relay.ErrUnavailable) || errors.Is(err, relay.ErrPermanent) {
		t.Errorf("Publish into a full stream = %v, want one error wrapping ErrUnavailable", err)
	}
}
