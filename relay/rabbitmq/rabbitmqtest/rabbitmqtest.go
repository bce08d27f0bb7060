package rabbitmqtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/outboxtest/publishertest"
)

// UniqueName returns prefix followed by 12 random hex digits, a name no
// other test picks (for exchanges and queues).
func UniqueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// DeclareExchange declares a uniquely named topic exchange,
// "outboxtest.ex." and 12 random hex digits, not durable, not
// auto-deleted, on ch, and returns its name. Delete it when done
// (ch.ExchangeDelete(name, false, false)). The error is the broker's.
func DeclareExchange(ch *amqp.Channel) (string, error) {
	name := UniqueName("outboxtest.ex.")
	if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, false, false, false, false, nil); err != nil {
		return "", fmt.Errorf("rabbitmqtest: declaring exchange %s: %w", name, err)
	}
	return name, nil
}

// Record is one delivery a [Consumer] received.
type Record struct {
	// Exchange and RoutingKey are those the message was published with.
	Exchange   string
	RoutingKey string
	// Payload is the message body as received.
	Payload []byte
	// Headers holds the message's header table as strings, the form the
	// publisher writes every header in (the relay's emit.Header* headers
	// and the event's own); a value of another AMQP type (a header some
	// other publisher set) is formatted as "<type value>", e.g. "<int32 7>".
	Headers map[string]string
	// Received is time.Now() taken as the delivery came off the channel,
	// before any processing.
	Received time.Time
	// Delivery is the client's own delivery, for the message properties
	// (MessageId, Type, ContentType, DeliveryMode) and the raw header table.
	Delivery amqp.Delivery
}

// MessageID returns the record's outbox message ID (the
// [emit.HeaderMessageID] header the relay sets) and whether it has one.
func (r Record) MessageID() (string, bool) {
	id, ok := r.Headers[emit.HeaderMessageID]
	return id, ok
}

// PublisherRecord returns the record as the conformance suite
// (publishertest) wants it: the payload, the headers, and r itself as Raw.
func (r Record) PublisherRecord() publishertest.Record {
	return publishertest.Record{Payload: r.Payload, Headers: r.Headers, Raw: r}
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

// Consumer owns a queue (a uniquely named one bound to an exchange, from
// [NewConsumer], or the caller's, from [ConsumeQueue]) and consumes it
// (automatic acknowledgement) in a background goroutine, recording every
// delivery in delivery order (for one queue that is the order the broker
// routed the messages in). The zero value is not usable: call
// [NewConsumer] or [ConsumeQueue]. Safe for concurrent use.
type Consumer struct {
	ch    *amqp.Channel
	queue string
	done  chan struct{}
	once  sync.Once

	recs *outboxtest.Recorder[Record]
}

// NewConsumer opens a channel on conn, declares a queue named
// "outboxtest.q." and 12 random hex digits (not durable, not exclusive,
// not auto-deleted), binds it to exchange with binding (a topic pattern
// such as "#" or "order.#"; "" leaves it unbound, for a test that binds
// it itself) and starts consuming it. Messages routed before
// NewConsumer returns are not seen (the queue did not exist). The error
// is the broker's (the exchange does not exist, the connection is
// closed). Close it when done: that deletes the queue.
func NewConsumer(conn *amqp.Connection, exchange, binding string) (*Consumer, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbitmqtest: opening a channel: %w", err)
	}
	c := &Consumer{ch: ch, queue: UniqueName("outboxtest.q."), done: make(chan struct{}), recs: outboxtest.NewRecorder[Record]("rabbitmqtest")}
	fail := func(what string, err error) (*Consumer, error) {
		_, _ = ch.QueueDelete(c.queue, false, false, false)
		_ = ch.Close()
		return nil, fmt.Errorf("rabbitmqtest: %s %s: %w", what, c.queue, err)
	}
	if _, err := ch.QueueDeclare(c.queue, false, false, false, false, nil); err != nil {
		return fail("declaring queue", err)
	}
	if binding != "" {
		if err := ch.QueueBind(c.queue, binding, exchange, false, nil); err != nil {
			return fail("binding queue", err)
		}
	}
	if err := c.consume(); err != nil {
		return fail("consuming queue", err)
	}
	return c, nil
}

// ConsumeQueue opens a channel on conn and consumes queue, a queue the
// caller declared and bound (for one declared with arguments such as
// x-max-length, or one that filled up before anything consumed it), as
// [NewConsumer]'s consumer does its own: the records start with what the
// queue holds. The error is the broker's (no such queue, the connection
// is closed). Close it when done: that deletes the queue too.
func ConsumeQueue(conn *amqp.Connection, queue string) (*Consumer, error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("rabbitmqtest: opening a channel: %w", err)
	}
	c := &Consumer{ch: ch, queue: queue, done: make(chan struct{}), recs: outboxtest.NewRecorder[Record]("rabbitmqtest")}
	if err := c.consume(); err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("rabbitmqtest: consuming queue %s: %w", queue, err)
	}
	return c, nil
}

// consume starts consuming c.queue (automatic acknowledgement) and
// recording its deliveries in a goroutine that closes c.done when the
// channel closes.
func (c *Consumer) consume() error {
	deliveries, err := c.ch.Consume(c.queue, "", true, false, false, false, nil)
	if err != nil {
		return err
	}
	go func() {
		defer close(c.done)
		for d := range deliveries {
			now := time.Now()
			h := make(map[string]string, len(d.Headers))
			for k, v := range d.Headers {
				s, ok := v.(string)
				if !ok {
					s = fmt.Sprintf("<%T %v>", v, v)
				}
				h[k] = s
			}
			r := Record{Exchange: d.Exchange, RoutingKey: d.RoutingKey, Payload: d.Body, Headers: h, Received: now, Delivery: d}
			c.recs.Add(r)
		}
	}()
	return nil
}

// Queue returns the name of the consumer's queue.
func (c *Consumer) Queue() string { return c.queue }

// Records returns a copy of the records received so far, in delivery
// order.
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

// Close deletes the queue (with what it still holds), closes the
// consumer's channel and waits for its goroutine. Records stay readable.
// It returns the error of the queue's deletion (nil if the connection was
// closed already: the queue, not durable, goes with a broker restart
// only, so delete it while the connection is open). Safe to call twice;
// the second call returns nil.
func (c *Consumer) Close() error {
	var err error
	c.once.Do(func() {
		if _, derr := c.ch.QueueDelete(c.queue, false, false, false); derr != nil && !c.ch.IsClosed() {
			err = fmt.Errorf("rabbitmqtest: deleting queue %s: %w", c.queue, derr)
		}
		_ = c.ch.Close()
		<-c.done
	})
	return err
}
