package inboxnats_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/emit"
	inboxnats "github.com/sqloutbox/outbox/inbox/nats"
)

// TestMessage: the inbox message of a message the relay published, and
// the fallbacks for messages of other producers.
func TestMessage(t *testing.T) {
	t.Parallel()
	s := newSpace(t)
	ctx := testCtx(t, 30*time.Second)
	relayMsg := s.event("o-1", 1)
	relayMsg.Headers = map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	s.publishMsgs(t, relayMsg)
	for _, m := range []*nats.Msg{
		{Subject: s.Prefix + ".plain", Data: []byte("x")},
		{Subject: s.Prefix + ".deduped", Header: nats.Header{jetstream.MsgIDHeader: {"order-7"}}, Data: []byte("y")},
		{Subject: s.Prefix + ".typed", Header: nats.Header{emit.HeaderAggregateType: {"order"}, emit.HeaderAggregateID: {"o-9"}}},
	} {
		if _, err := s.js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	cons, err := s.js.OrderedConsumer(ctx, s.Stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(4, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var got []jetstream.Msg
	for m := range batch.Messages() {
		got = append(got, m)
	}
	if len(got) != 4 {
		t.Fatalf("fetched %d messages (%v), want 4", len(got), batch.Error())
	}
	type want struct{ id, aggType, aggID, topic string }
	for i, w := range []want{
		{relayMsg.MessageID, "account", "o-1", s.Prefix + ".outbox.event.account.o-1"},
		{s.Stream + "/2", s.Prefix + ".plain", "", s.Prefix + ".plain"},
		{"order-7", s.Prefix + ".deduped", "", s.Prefix + ".deduped"},
		{s.Stream + "/4", "order", "o-9", s.Prefix + ".typed"},
	} {
		m := inboxnats.Message(got[i])
		if m.ID != w.id || m.AggregateType != w.aggType || m.AggregateID != w.aggID || m.Topic != w.topic || m.Offset != int64(i+1) {
			t.Errorf("message %d: %+v, want %+v at offset %d", i+1, m, w, i+1)
		}
	}
	m := inboxnats.Message(got[0])
	if string(m.Payload) != `{"seq":1}` || m.Headers["traceparent"] == "" || m.Headers[emit.HeaderEventType] != "account.step" {
		t.Errorf("relay message: payload %q, headers %v", m.Payload, m.Headers)
	}
}
