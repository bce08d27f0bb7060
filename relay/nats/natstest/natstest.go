package natstest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/outboxtest/publishertest"
)

// UniqueName returns prefix followed by 12 random hex digits, a name no
// other test picks: for streams (letters, digits, "_" and "-" only, as
// JetStream wants) and subject tokens alike.
func UniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// DefaultDuplicates is the duplicate window of a [CreateStream] stream:
// a message published again with the same Nats-Msg-Id (the outbox message
// ID) within it is acknowledged and not stored twice.
const DefaultDuplicates = 2 * time.Minute

// Stream is a JetStream stream made by [CreateStream]. Delete it when
// done.
type Stream struct {
	// Name is the stream's name, "OUTBOXTEST_" and 12 random hex digits.
	Name string
	// Subjects are the subjects the stream binds, as given.
	Subjects []string
	js       jetstream.JetStream
}

// CreateStream creates a uniquely named stream binding subjects (at
// least one; wildcards allowed, e.g. "orders-1f2e.>") with memory storage
// and [DefaultDuplicates]; mods change the configuration after those
// defaults (e.g. func(c *jetstream.StreamConfig) { c.Storage =
// jetstream.FileStorage; c.MaxMsgSize = 10_000 }). The error wraps
// JetStream's (no JetStream on the server; subjects another stream
// already binds).
func CreateStream(ctx context.Context, js jetstream.JetStream, subjects []string, mods ...func(*jetstream.StreamConfig)) (*Stream, error) {
	if len(subjects) == 0 {
		return nil, fmt.Errorf("natstest: CreateStream needs at least one subject")
	}
	cfg := jetstream.StreamConfig{Name: UniqueName("OUTBOXTEST_"), Subjects: subjects,
		Storage: jetstream.MemoryStorage, Duplicates: DefaultDuplicates}
	for _, m := range mods {
		m(&cfg)
	}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		return nil, fmt.Errorf("natstest: creating stream %s for %s: %w", cfg.Name, strings.Join(subjects, ", "), err)
	}
	return &Stream{Name: cfg.Name, Subjects: append([]string(nil), subjects...), js: js}, nil
}

// Delete deletes the stream and what it stores. It errors if the stream
// is gone already or the server does not answer within ctx.
func (s *Stream) Delete(ctx context.Context) error {
	if err := s.js.DeleteStream(ctx, s.Name); err != nil {
		return fmt.Errorf("natstest: deleting stream %s: %w", s.Name, err)
	}
	return nil
}

// Record is one message a [Consumer] received from a stream.
type Record struct {
	// Subject is the subject the message was published to.
	Subject string
	// Sequence is the message's stream sequence (1, 2, ... in the order
	// the stream stored them).
	Sequence uint64
	// Payload is the message data as received (a zero-length payload may
	// be nil or empty: JetStream does not tell them apart).
	Payload []byte
	// Headers holds the message headers, the last value of a repeated
	// name, Nats-Msg-Id (jetstream.MsgIDHeader) included.
	Headers map[string]string
	// Received is time.Now() taken as the consumer's callback got the
	// message, before any processing.
	Received time.Time
	// Msg is the client's own message, for headers with several values
	// and the message's metadata.
	Msg jetstream.Msg
}

// MessageID returns the record's outbox message ID (the
// [emit.HeaderMessageID] header the relay sets) and whether it has one.
func (r Record) MessageID() (string, bool) {
	id, ok := r.Headers[emit.HeaderMessageID]
	return id, ok
}

// PublisherRecord returns the record as the conformance suite
// (publishertest) wants it: the payload, the headers without
// Nats-Msg-Id (JetStream's, not the event's), and r itself as Raw.
func (r Record) PublisherRecord() publishertest.Record {
	h := make(map[string]string, len(r.Headers))
	for k, v := range r.Headers {
		if k != jetstream.MsgIDHeader {
			h[k] = v
		}
	}
	return publishertest.Record{Payload: r.Payload, Headers: h, Raw: r}
}

// PublisherRecords converts recs with [Record.PublisherRecord], in order.
func PublisherRecords(recs []Record) []publishertest.Record {
	return publishertest.RecordsOf(recs, Record.PublisherRecord)
}

// ByMessageID groups recs by outbox message ID, each group in the order
// of recs (a group of two or more is a duplicate delivery). Records
// without a message ID are left out.
// It is [outboxtest.ByMessageID].
func ByMessageID(recs []Record) map[string][]Record {
	return outboxtest.ByMessageID(recs, Record.MessageID)
}

// Consumer reads one stream from its first message with an ordered
// consumer (JetStream's ephemeral, flow-controlled consumer that delivers
// in stream sequence order and recreates itself after a gap) and records
// every message, in the order received. The zero value is not usable:
// call [NewConsumer]. Safe for concurrent use.
type Consumer struct {
	cc jetstream.ConsumeContext

	recs *outboxtest.Recorder[Record]

	mu     sync.Mutex
	closed bool
}

// NewConsumer starts consuming stream (a name, e.g. [Stream.Name]) from
// its first message. It errors if the stream does not exist or the server
// does not answer within ctx; ctx bounds only the setup. Close it when
// done.
func NewConsumer(ctx context.Context, js jetstream.JetStream, stream string) (*Consumer, error) {
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, fmt.Errorf("natstest: ordered consumer of %s: %w", stream, err)
	}
	c := &Consumer{recs: outboxtest.NewRecorder[Record]("natstest")}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		now := time.Now()
		r := Record{Subject: m.Subject(), Payload: m.Data(), Headers: map[string]string{}, Received: now, Msg: m}
		for k, v := range m.Headers() {
			if len(v) > 0 {
				r.Headers[k] = v[len(v)-1]
			}
		}
		if md, err := m.Metadata(); err == nil {
			r.Sequence = md.Sequence.Stream
		}
		c.recs.Add(r)
	})
	if err != nil {
		return nil, fmt.Errorf("natstest: consuming %s: %w", stream, err)
	}
	c.cc = cc
	return c, nil
}

// Records returns a copy of the records received so far, in stream
// sequence order.
func (c *Consumer) Records() []Record { return c.recs.Records() }

// Wait blocks until cond, called with the records so far after every
// change (and once at the start), returns true, or ctx ends; then it
// returns a copy of the records so far and an error wrapping ctx's error
// (match it with errors.Is(err, context.DeadlineExceeded)). cond must not
// block, and must not modify the slice it is given: that is the
// consumer's own (not copied on every change, so that waiting on a long
// run stays cheap); keep what it needs, such as how far it has scanned.
// It is [outboxtest.Recorder.Wait].
func (c *Consumer) Wait(ctx context.Context, cond func([]Record) bool) ([]Record, error) {
	return c.recs.Wait(ctx, cond)
}

// WaitForCount waits, as [Consumer.Wait], until at least n records
// (duplicates counted) were received.
func (c *Consumer) WaitForCount(ctx context.Context, n int) ([]Record, error) {
	return c.recs.WaitForCount(ctx, n)
}

// WaitForMessageIDs waits, as [Consumer.Wait], until a record of every
// given outbox message ID was received, and returns all records so far
// (those of other IDs and duplicates included). With no IDs it returns at
// once. On timeout the error names how many IDs are still missing.
func (c *Consumer) WaitForMessageIDs(ctx context.Context, ids ...string) ([]Record, error) {
	return c.recs.WaitForMessageIDs(ctx, Record.MessageID, ids...)
}

// Close stops the consumer (JetStream deletes the ephemeral consumer).
// Records stay readable. It is safe to call twice.
func (c *Consumer) Close() {
	c.mu.Lock()
	closed := c.closed
	c.closed = true
	c.mu.Unlock()
	if !closed {
		c.cc.Stop()
	}
}
