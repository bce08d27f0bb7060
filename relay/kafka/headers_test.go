package kafka

import (
	"testing"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/relay"
)

// TestHeaders pins the record headers (the relay's in a fixed order,
// then the event's own sorted by name) and that the values cut from one
// buffer do not overlap: appending to one leaves the next intact.
func TestHeaders(t *testing.T) {
	t.Parallel()
	m := relay.Message{MessageID: "m-1", EventType: "order.paid", AggregateType: "order", AggregateID: "42", ContentType: "application/json",
		Partition: 17, Epoch: -9223372036854775808, Headers: map[string]string{"zeta": "z", "traceparent": "00-abc", "a": ""}}
	hs := (&Publisher{}).headers(&m)
	want := [][2]string{
		{emit.HeaderMessageID, "m-1"}, {emit.HeaderEventType, "order.paid"}, {emit.HeaderAggregateType, "order"},
		{emit.HeaderAggregateID, "42"}, {emit.HeaderContentType, "application/json"}, {emit.HeaderPartition, "17"},
		{emit.HeaderEpoch, "-9223372036854775808"}, {"a", ""}, {"traceparent", "00-abc"}, {"zeta", "z"},
	}
	if len(hs) != len(want) {
		t.Fatalf("%d headers, want %d", len(hs), len(want))
	}
	for i := range hs {
		_ = append(hs[i].Value, "XXXXXXXXXXXXXXXXXXXXXXXX"...)
		_ = append(hs[i].Key, "XXXXXXXXXXXXXXXXXXXXXXXX"...)
	}
	for i, w := range want {
		if string(hs[i].Key) != w[0] || string(hs[i].Value) != w[1] {
			t.Errorf("header %d: %q=%q, want %q=%q", i, hs[i].Key, hs[i].Value, w[0], w[1])
		}
	}
}
