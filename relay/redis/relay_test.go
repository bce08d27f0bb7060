package redispub_test

import (
	"testing"
	"time"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/testkit/e2e"
	redispub "github.com/sqloutbox/outbox/relay/redis"
	"github.com/sqloutbox/outbox/relay/redis/redistest"
)

// TestRelayEndToEnd: events committed on SQLite reach the stream through
// a running relay and this publisher, every one, each aggregate's in
// commit order, payloads byte for byte, also across a server outage in
// the middle (through the test's proxy; e2e.Run): the relay backs off as
// a whole and re-sends. Redis does not deduplicate, so an entry may be
// stored twice; each aggregate's first deliveries are in commit order
// (entry ID order), and every entry is in the order stream.
func TestRelayEndToEnd(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	proxy := startProxy(t)
	p := newPublisher(t, redispub.Config{Client: connect(t, proxy.Addr()), Stream: s.Stream})
	cons := s.consume(t, e2e.AggregateType, "invoice")
	ctx := testCtx(t, 120*time.Second)
	res := e2e.Run(ctx, t, e2e.Config[redistest.Record]{
		Publisher: p,
		// The client keeps its connections: cut them too.
		Outage:       func() { proxy.Refuse(true); proxy.CutAll() },
		Restore:      func() { proxy.Refuse(false) },
		WaitForCount: cons.WaitForCount,
		WaitForAll:   cons.WaitForMessageIDs,
		Check:        redistest.Check,
		Payload: func(x redistest.Record) (string, []byte) {
			id, _ := x.Values[emit.HeaderMessageID].(string)
			pl, _ := x.Values[redispub.PayloadField].(string)
			return id, []byte(pl)
		},
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	})
	stream := s.Prefix + "outbox.event." + e2e.AggregateType
	if keys, err := s.c.Keys(ctx, s.Prefix+"*").Result(); err != nil || len(keys) != 1 || keys[0] != stream {
		t.Errorf("keys under the prefix: %q, %v; want the order stream only", keys, err)
	}
	for _, x := range res.Records {
		if x.Values[emit.HeaderAggregateType] != e2e.AggregateType || x.Stream != stream {
			t.Errorf("entry %v in the wrong stream", x.Values)
		}
	}
}
