package rabbitmq_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/testkit/e2e"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/rabbitmq"
	"github.com/sqloutbox/outbox/relay/rabbitmq/rabbitmqtest"
)

// TestRelayEndToEnd: events committed on SQLite reach the queue through a
// running relay and this publisher, every one, each aggregate's first
// deliveries in commit order, payloads byte for byte, also across a broker
// outage in the middle (through the test's proxy; e2e.Run): the relay
// backs off as a whole, the publisher reconnects, and duplicates (RabbitMQ
// does not dedupe) carry the same message ID.
func TestRelayEndToEnd(t *testing.T) {
	t.Parallel()
	s := newSpace(t, "#")
	proxy := startProxy(t)
	p := newPublisher(t, rabbitmq.Config{URL: viaProxy(t, proxy.Addr()), Exchange: s.Exchange})
	res := e2e.Run(testCtx(t, 120*time.Second), t, e2e.Config[rabbitmqtest.Record]{
		Publisher:    p,
		Outage:       func() { proxy.Refuse(true) },
		Restore:      func() { proxy.Refuse(false) },
		WaitForCount: s.wait,
		// Every event at least once; duplicates allowed.
		WaitForAll: s.cons.WaitForMessageIDs,
		Check:      rabbitmqtest.Check,
		Payload: func(d rabbitmqtest.Record) (string, []byte) {
			id, _ := d.MessageID()
			return id, d.Payload
		},
		// Routing key wildcards in the aggregate IDs.
		AggregateID: func(n int) string { return fmt.Sprintf("agg %d.#*", n) },
	})
	for _, d := range res.Records {
		id, _ := d.MessageID()
		if d.Delivery.MessageId != id {
			t.Errorf("%s: message-id property %q", id, d.Delivery.MessageId)
		}
		agg := d.Headers[emit.HeaderAggregateID]
		if d.RoutingKey != rabbitmq.DefaultRoutingKey(relay.Message{AggregateType: e2e.AggregateType, AggregateID: agg}) {
			t.Errorf("%s: routing key %q", id, d.RoutingKey)
		}
	}
}
