package inboxkafka

import (
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/inbox"
)

// Message converts a record to the inbox's message: ID from the
// outbox-message-id header, AggregateType and AggregateID from
// outbox-aggregate-type and outbox-aggregate-id (the headers the relay
// writes, emit.Header*), Headers with every record header (a repeated key
// keeps the last), Payload the record value, Key, Topic, Partition and
// Offset as in the record. The slices are the record's, not copies.
//
// A record that did not come from the outbox relay may lack the headers:
// then the ID is "<topic>/<partition>/<offset>" (a redelivery of the same
// record is recognised; the same event produced twice is not), the
// aggregate type the topic and the aggregate ID the key as a string, so
// such records are still held per key.
func Message(rec *kgo.Record) inbox.Message {
	h := make(map[string]string, len(rec.Headers))
	for _, kv := range rec.Headers {
		h[kv.Key] = string(kv.Value)
	}
	m := inbox.Message{
		ID: h[emit.HeaderMessageID], AggregateType: h[emit.HeaderAggregateType], AggregateID: h[emit.HeaderAggregateID],
		Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset,
		Key: rec.Key, Headers: h, Payload: rec.Value,
	}
	if m.ID == "" {
		m.ID = rec.Topic + "/" + strconv.FormatInt(int64(rec.Partition), 10) + "/" + strconv.FormatInt(rec.Offset, 10)
	}
	if m.AggregateType == "" {
		m.AggregateType = rec.Topic
	}
	if _, ok := h[emit.HeaderAggregateID]; !ok {
		m.AggregateID = string(rec.Key)
	}
	return m
}
