package natspub_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/testkit/e2e"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	natspub "github.com/sqloutbox/outbox/relay/nats"
	"github.com/sqloutbox/outbox/relay/nats/natstest"
)

// TestRelayEndToEnd: events committed on SQLite reach the stream through
// a running relay and this publisher, every one, each aggregate's in
// commit order, payloads byte for byte, also across a broker outage in the
// middle (through the test's proxy; e2e.Run): the relay backs off as a
// whole and re-sends, and the stream holds each event once (Nats-Msg-Id
// dedupes what the outage left unacknowledged but stored).
func TestRelayEndToEnd(t *testing.T) {
	t.Parallel()
	s := newSpace(t, 0)
	proxy, err := faultproxy.Start(strings.TrimPrefix(serverURL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	nc := connect(t, "nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	p := newPublisher(t, natspub.Config{Conn: nc, Subject: s.Subject})
	cons := s.consume(t)
	res := e2e.Run(testCtx(t, 120*time.Second), t, e2e.Config[natstest.Record]{
		Publisher:    p,
		Outage:       func() { proxy.Refuse(true) },
		Restore:      func() { proxy.Refuse(false) },
		WaitForCount: cons.WaitForCount,
		// The stream stores each event once: as many records as events,
		// so that a duplicate shows as a lost event too.
		WaitForAll: func(ctx context.Context, ids ...string) ([]natstest.Record, error) {
			return cons.WaitForCount(ctx, len(ids))
		},
		Check: natstest.Check,
		Payload: func(m natstest.Record) (string, []byte) {
			id, _ := m.MessageID()
			return id, m.Payload
		},
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	})
	// None stored twice (stream sequence order).
	if res.Ledger.Duplicates != 0 {
		t.Errorf("%d events stored twice", res.Ledger.Duplicates)
	}
	for _, m := range res.Records {
		id, _ := m.MessageID()
		agg := m.Headers[emit.HeaderAggregateID]
		if m.Subject != s.Prefix+".outbox.event."+e2e.AggregateType+"."+natspub.SubjectToken(agg) {
			t.Errorf("%s: subject %q", id, m.Subject)
		}
	}
}
