package inbox_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sqloutbox/outbox/inbox"
)

func TestMessageFromHeaders(t *testing.T) {
	t.Parallel()
	relayed := map[string]string{"outbox-message-id": "m-1", "outbox-aggregate-type": "order", "outbox-aggregate-id": "o-17",
		"outbox-event-type": "order.paid", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	m, err := inbox.MessageFromHeaders(relayed, []byte(`{"id":"o-17"}`))
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != "m-1" || m.AggregateType != "order" || m.AggregateID != "o-17" || string(m.Payload) != `{"id":"o-17"}` ||
		m.Headers["traceparent"] != relayed["traceparent"] || len(m.Headers) != len(relayed) {
		t.Errorf("message %+v", m)
	}
	m.Headers["outbox-message-id"] = "changed"
	if relayed["outbox-message-id"] != "m-1" {
		t.Error("the Message's Headers share the caller's map")
	}
	for _, c := range []struct {
		name    string
		headers map[string]string
		want    string
	}{
		{"no message ID", map[string]string{"outbox-aggregate-id": "o-1"}, "no outbox-message-id header"},
		{"empty message ID", map[string]string{"outbox-message-id": ""}, "no outbox-message-id header"},
		{"nil headers", nil, "no outbox-message-id header"},
		{"NUL in the aggregate ID", map[string]string{"outbox-message-id": "m", "outbox-aggregate-id": "a\x00b"}, "AggregateID contains NUL"},
		{"ID too long", map[string]string{"outbox-message-id": strings.Repeat("x", inbox.MaxMessageIDBytes+1)}, "ID is"},
	} {
		if _, err := inbox.MessageFromHeaders(c.headers, nil); !errors.Is(err, inbox.ErrInvalidMessage) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalidMessage saying %q", c.name, err, c.want)
		}
	}
}
