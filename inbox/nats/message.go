package inboxnats

import (
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/inbox"
)

// Message converts a JetStream message to the inbox's message, with
// inbox.MessageFromHeaders: ID from the outbox-message-id header,
// AggregateType and AggregateID from outbox-aggregate-type and
// outbox-aggregate-id (the headers the relay writes, emit.Header*),
// Headers with the first value of every header (Nats-Msg-Id included),
// Payload the message data (not copied). Topic is the subject and Offset
// the stream sequence (0 if msg carries no JetStream metadata);
// Partition and Key are left zero.
//
// A message that did not come from the outbox relay may lack the headers:
// then the ID is its Nats-Msg-Id header (the publisher's deduplication ID,
// which its re-sends share) or else "<stream>/<sequence>" (a redelivery
// of the same stored message is recognised; the same event published
// twice is not), and, with neither aggregate header, the aggregate type
// is the subject, so such messages are still kept in order, and held,
// per subject. A message whose fields the inbox cannot store (an ID of
// invalid UTF-8, too long) is returned as it is: the runner's inbox call
// then fails with inbox.ErrInvalidMessage and the message is passed over.
func Message(msg jetstream.Msg) inbox.Message {
	h := make(map[string]string, len(msg.Headers()))
	for k, vs := range msg.Headers() {
		if len(vs) > 0 {
			h[k] = vs[0]
		}
	}
	meta, _ := msg.Metadata()
	return message(msg, meta, h)
}

func message(msg jetstream.Msg, meta *jetstream.MsgMetadata, h map[string]string) inbox.Message {
	m, err := inbox.MessageFromHeaders(h, msg.Data())
	if err != nil {
		m = inbox.Message{ID: h[emit.HeaderMessageID], AggregateType: h[emit.HeaderAggregateType],
			AggregateID: h[emit.HeaderAggregateID], Headers: h, Payload: msg.Data()}
		if m.ID == "" {
			m.ID = h[jetstream.MsgIDHeader]
		}
		if m.ID == "" && meta != nil {
			m.ID = meta.Stream + "/" + strconv.FormatUint(meta.Sequence.Stream, 10)
		}
	}
	_, hasType := h[emit.HeaderAggregateType]
	_, hasID := h[emit.HeaderAggregateID]
	if !hasType && !hasID {
		m.AggregateType = msg.Subject()
	}
	m.Topic = msg.Subject()
	if meta != nil {
		m.Offset = int64(meta.Sequence.Stream)
	}
	return m
}
