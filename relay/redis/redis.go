// Package redispub publishes outbox messages to Redis Streams with
// github.com/redis/go-redis/v9, so that per-aggregate order and
// at-least-once delivery hold. It is its own module
// (github.com/sqloutbox/outbox/relay/redis): only its users download the
// Redis client.
//
// # What "stored" means
//
// Publish returns nil only after Redis answered every message's XADD with
// an entry ID. An XADD reply means the entry is in the server's memory
// (and in the replication stream); it is durable only as far as the
// server's persistence goes: with appendonly yes and appendfsync always
// it is on disk, with everysec within about a second, with RDB snapshots
// only as of the last snapshot, and with neither (as on the machine these
// tests run on) a restart loses it. WAITAOF (Redis 7.2 and later) could
// wait for the AOF fsync; the Redis these tests run against is 7.0, so
// the publisher does not offer it: choose the server's persistence for
// the durability you need. Nothing is reported stored without its XADD
// reply.
//
// # Streams and order
//
// Every message is appended to the stream of its aggregate type:
// DefaultStream is DefaultStreamPrefix + AggregateType
// ("outbox.event.order"); a message's Topic, if set, replaces it;
// Config.Stream replaces the whole scheme. The aggregate ID is in the
// entry's outbox-aggregate-id field, so one stream holds many aggregates,
// interleaved. Nothing needs encoding: Redis keys and field values are
// binary-safe, so an aggregate type or ID of any bytes is carried as is
// and cannot reach another stream (the aggregate ID is never part of a
// key).
//
// Within one aggregate Publish does not pipeline: it sends an aggregate's
// next XADD only after the previous one's reply, so the stream holds an
// aggregate's entries in outbox id order. Once a message fails, the
// aggregate's later messages in the batch fail with ErrHeldBack without
// being sent (the relay re-sends them after the failed one). Different
// aggregates pipeline freely: up to Config.MaxInFlight aggregates have an
// XADD awaiting its reply at once. This is relay.PublishInOrder, shared
// with relay/nats and relay/rabbitmq; the publisher adds only the XADD of
// one message.
//
// A consumer reading a stream (XREAD, XRANGE) sees each aggregate's
// entries in order. A consumer group spreads entries over its consumers,
// so one aggregate's entries may reach two consumers at once: keep the
// order by processing the entries of one aggregate in order, for example
// by reading with XREADGROUP, grouping the entries read by their
// outbox-aggregate-id field, and handling each group's entries one after
// another (XACK after each), or by one consumer per stream.
//
// Redis Streams do not deduplicate: a relay that re-sends a batch after a
// timeout or a crash (at-least-once) may append an entry twice, and so
// may go-redis's own retries of a command on a broken connection;
// consumers dedupe by the outbox-message-id field.
//
// # Trimming
//
// The publisher never trims a stream unless asked: Config.MaxLen or
// Config.MinID add MAXLEN or MINID to every XADD. Trimming drops the
// oldest entries whether or not any consumer has read them; an event
// trimmed before it was consumed is lost for good. Use them only with
// consumers that keep up, and monitor the lag.
//
// # Fields
//
// Each entry carries the payload in the outbox-payload field (PayloadField)
// and emit's relay headers (outbox-message-id, outbox-event-type,
// outbox-aggregate-type, outbox-aggregate-id, outbox-content-type,
// outbox-partition, outbox-epoch), then the event's own headers (trace
// context included), one field each, byte for byte. An event header whose
// name is one of these fields (a row written before Emit refused
// outbox-* names) fails with relay.ErrPermanent, never altered.
//
// # Errors
//
//   - The server unreachable, a broken connection, ctx done, a reply that
//     did not arrive in time: Publish returns one error for the batch (not
//     relay.PublishErrors), no further message of the batch is sent, and
//     the relay re-sends the batch later without counting an attempt.
//   - NOPERM (the user may not XADD to the stream), WRONGTYPE (a key of
//     another type at the stream's name), WRONGPASS and NOAUTH (a new
//     connection's credentials refused or missing: a password rotated, an
//     ACL user deleted or disabled), OOM (a server at its maxmemory with
//     noeviction refuses every write): the message's error wraps
//     relay.ErrUnavailable; if every message failed so, Publish returns one
//     error wrapping it (the relay backs off, dead-letters nothing).
//   - A message larger than Config.MaxMessageBytes (payload and fields),
//     or a field larger than the server's proto-max-bulk-len:
//     relay.ErrPermanent for that message only, never sent.
//   - Any other Redis error: that message fails (retried by the relay),
//     its aggregate's later ones are held back.
package redispub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/relay"
)

// DefaultStreamPrefix is prepended to the aggregate type by DefaultStream.
const DefaultStreamPrefix = "outbox.event."

// PayloadField is the entry field that holds the message's payload.
const PayloadField = "outbox-payload"

// Defaults of Config.
const (
	// DefaultMaxInFlight is how many aggregates may have an XADD awaiting
	// its reply at once.
	DefaultMaxInFlight = 256
	// DefaultMaxMessageBytes is the default Config.MaxMessageBytes:
	// emit.DefaultMaxRecordBytes (1,048,588 bytes, Kafka's
	// message.max.bytes), the limit Emit applies by default, as
	// relay/rabbitmq's; far below the server's proto-max-bulk-len (512
	// MB by default).
	DefaultMaxMessageBytes = emit.DefaultMaxRecordBytes
)

var (
	// ErrConfig is returned by NewPublisher for an unusable Config.
	ErrConfig = errors.New("outbox/redis: invalid config")
	// ErrClosed is returned by Publish after Close.
	ErrClosed = errors.New("outbox/redis: publisher closed")
	// ErrHeldBack fails a message that was not sent because an earlier
	// message of its aggregate in the same batch failed. It is
	// relay.ErrHeldBack (relay.PublishInOrder holds messages back), so
	// errors.Is matches either name.
	ErrHeldBack = relay.ErrHeldBack
	// ErrTooLarge is wrapped (with relay.ErrPermanent) by the error of a
	// message above Config.MaxMessageBytes or the server's
	// proto-max-bulk-len.
	ErrTooLarge = errors.New("outbox/redis: message too large")
)

// DefaultStream is the stream of m unless Config.Stream says otherwise:
// m.Topic if set, else DefaultStreamPrefix + m.AggregateType.
func DefaultStream(m relay.Message) string {
	if m.Topic != "" {
		return m.Topic
	}
	return DefaultStreamPrefix + m.AggregateType
}

// Config configures a Publisher.
type Config struct {
	// Client is the Redis client to publish with. Required. Its options
	// (address, credentials, TLS, timeouts, retries) are the caller's, and
	// so is closing it: Publisher.Close does not. Set
	// ContextTimeoutEnabled in its options, or go-redis bounds a stalled
	// server's reply by its ReadTimeout instead of Publish's ctx; its
	// MaxRetries re-send an XADD on a broken connection (a possible
	// duplicate entry): -1 leaves retries to the relay.
	Client redis.UniversalClient
	// Stream returns a message's stream key. It must give all messages of
	// one aggregate the same stream (or the relay's order per aggregate is
	// only as good as the mapping). Nil: DefaultStream.
	Stream func(relay.Message) string
	// MaxInFlight bounds how many aggregates may have an XADD awaiting its
	// reply at once. 0: DefaultMaxInFlight.
	MaxInFlight int
	// MaxMessageBytes bounds one message: its payload plus every field
	// name and value. A larger message fails with relay.ErrPermanent. 0:
	// DefaultMaxMessageBytes.
	MaxMessageBytes int
	// MaxLen, if above 0, trims every stream to about this many entries
	// on each XADD (MAXLEN ~). Off by default: trimming drops the oldest
	// entries whether or not they were consumed.
	MaxLen int64
	// MinID, if set, trims entries with IDs below it on each XADD
	// (MINID ~). Off by default, with MaxLen's warning. At most one of
	// MaxLen and MinID may be set.
	MinID string
	// ExactTrim makes MaxLen and MinID trim exactly (= instead of ~),
	// which costs more per XADD.
	ExactTrim bool
}

// Publisher is a relay.Publisher and relay.HealthChecker for Redis
// Streams. Safe for concurrent use. Create it with NewPublisher.
type Publisher struct {
	cfg Config

	bulkOnce sync.Once
	bulkMax  int // proto-max-bulk-len, 0 if unknown

	mu     sync.RWMutex
	closed bool
}

// NewPublisher returns a Publisher on cfg.Client. It returns an error
// wrapping ErrConfig if Client is nil, a bound is negative or both MaxLen
// and MinID are set; it does not contact the server (Healthy does).
func NewPublisher(cfg Config) (*Publisher, error) {
	switch {
	case cfg.Client == nil:
		return nil, fmt.Errorf("%w: Client is required", ErrConfig)
	case cfg.MaxInFlight < 0:
		return nil, fmt.Errorf("%w: MaxInFlight %d is negative", ErrConfig, cfg.MaxInFlight)
	case cfg.MaxMessageBytes < 0:
		return nil, fmt.Errorf("%w: MaxMessageBytes %d is negative", ErrConfig, cfg.MaxMessageBytes)
	case cfg.MaxLen < 0:
		return nil, fmt.Errorf("%w: MaxLen %d is negative", ErrConfig, cfg.MaxLen)
	case cfg.MaxLen > 0 && cfg.MinID != "":
		return nil, fmt.Errorf("%w: MaxLen and MinID are both set", ErrConfig)
	}
	if cfg.Stream == nil {
		cfg.Stream = DefaultStream
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	return &Publisher{cfg: cfg}, nil
}

// Healthy reports whether the server answers PING. It implements
// relay.HealthChecker.
func (p *Publisher) Healthy(ctx context.Context) error {
	if err := p.cfg.Client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("outbox/redis: PING: %w", err)
	}
	return nil
}

// Close makes later Publish calls return ErrClosed; it does not close
// Config.Client. It is safe to call more than once and concurrently, and
// waits for running Publish calls to return.
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	return nil
}

// Publish appends msgs to their streams and waits for every XADD reply
// (see the package doc for order, errors and what stored means). It
// returns nil when all were stored; relay.PublishErrors when some failed;
// one error for the batch when the server could not be reached, ctx
// ended, every message's stream is unavailable (wrapping
// relay.ErrUnavailable), or after Close (ErrClosed).
func (p *Publisher) Publish(ctx context.Context, msgs []relay.Message) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(msgs) == 0 {
		return nil
	}
	p.bulkOnce.Do(func() { p.bulkMax = p.protoMaxBulkLen(ctx) })
	// One aggregate at a time, in batch order, each XADD after the
	// previous one's reply; aggregates concurrently.
	err := relay.PublishInOrder(ctx, msgs, p.cfg.MaxInFlight, func(ctx context.Context, i int) error {
		return p.publishOne(ctx, &msgs[i])
	})
	var pe relay.PublishErrors
	if err == nil || errors.As(err, &pe) {
		return err
	}
	return fmt.Errorf("outbox/redis: %w", err)
}

// protoMaxBulkLen asks the server for proto-max-bulk-len; 0 if it does
// not say (CONFIG denied, say).
func (p *Publisher) protoMaxBulkLen(ctx context.Context) int {
	v, err := p.cfg.Client.ConfigGet(ctx, "proto-max-bulk-len").Result()
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(v["proto-max-bulk-len"])
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

// publishOne XADDs m and waits for the reply.
func (p *Publisher) publishOne(ctx context.Context, m *relay.Message) error {
	args, err := p.args(m)
	if err != nil {
		return err
	}
	if err := p.cfg.Client.XAdd(ctx, args).Err(); err != nil {
		return classify(ctx, m, args.Stream, err)
	}
	return nil
}

// args builds the XADD of m, or an error wrapping relay.ErrPermanent if m
// cannot be carried byte for byte or is too large.
func (p *Publisher) args(m *relay.Message) (*redis.XAddArgs, error) {
	stream := p.cfg.Stream(*m)
	if stream == "" {
		return nil, fmt.Errorf("%w: message %s: empty stream name", relay.ErrPermanent, m.MessageID)
	}
	values := make([]any, 0, 2*(8+len(m.Headers)))
	payload := m.Payload
	if payload == nil {
		payload = []byte{}
	}
	size := len(PayloadField) + len(payload)
	largest := len(payload)
	values = append(values, PayloadField, payload)
	fixed := [...][2]string{
		{emit.HeaderMessageID, m.MessageID},
		{emit.HeaderEventType, m.EventType},
		{emit.HeaderAggregateType, m.AggregateType},
		{emit.HeaderAggregateID, m.AggregateID},
		{emit.HeaderContentType, m.ContentType},
		{emit.HeaderPartition, strconv.Itoa(m.Partition)},
		{emit.HeaderEpoch, strconv.FormatInt(m.Epoch, 10)},
	}
	add := func(k, v string) {
		values = append(values, k, v)
		size += len(k) + len(v)
		largest = max(largest, len(k), len(v))
	}
	for _, kv := range fixed {
		add(kv[0], kv[1])
	}
	for k, v := range m.Headers {
		if k == PayloadField || reserved(k) {
			return nil, fmt.Errorf("%w: message %s: header name %q is one of the entry's own fields", relay.ErrPermanent, m.MessageID, k)
		}
		add(k, v)
	}
	if size > p.cfg.MaxMessageBytes {
		return nil, fmt.Errorf("%w: %w: message %s: %d bytes, above MaxMessageBytes %d", relay.ErrPermanent, ErrTooLarge, m.MessageID, size, p.cfg.MaxMessageBytes)
	}
	if p.bulkMax > 0 && largest > p.bulkMax {
		return nil, fmt.Errorf("%w: %w: message %s: a field of %d bytes, above the server's proto-max-bulk-len %d", relay.ErrPermanent, ErrTooLarge, m.MessageID, largest, p.bulkMax)
	}
	a := &redis.XAddArgs{Stream: stream, Values: values, Approx: !p.cfg.ExactTrim}
	switch {
	case p.cfg.MaxLen > 0:
		a.MaxLen = p.cfg.MaxLen
	case p.cfg.MinID != "":
		a.MinID = p.cfg.MinID
	default:
		a.Approx = false
	}
	return a, nil
}

// reserved reports whether k is one of emit's relay header names.
func reserved(k string) bool {
	switch k {
	case emit.HeaderMessageID, emit.HeaderEventType, emit.HeaderAggregateType, emit.HeaderAggregateID,
		emit.HeaderContentType, emit.HeaderPartition, emit.HeaderEpoch:
		return true
	}
	return false
}

// classify maps an XADD error to the relay's classes (see the package
// doc). Errors of the connection and ctx fail the batch (relay.BatchError).
func classify(ctx context.Context, m *relay.Message, stream string, err error) error {
	if ctx.Err() != nil {
		return &relay.BatchError{Err: ctx.Err()}
	}
	var nerr net.Error
	if errors.As(err, &nerr) && nerr.Timeout() {
		// The reply did not come in time (a read or write deadline, which
		// go-redis may set from ctx's deadline just before ctx ends).
		return &relay.BatchError{Err: fmt.Errorf("no XADD reply for %s in time: %w: %w", m.MessageID, context.DeadlineExceeded, err)}
	}
	var rerr redis.Error
	if errors.As(err, &nerr) || !errors.As(err, &rerr) || errors.Is(err, redis.ErrClosed) {
		return &relay.BatchError{Err: err}
	}
	msg := rerr.Error()
	switch {
	case strings.HasPrefix(msg, "NOPERM"):
		// Name what to grant: the command and the key, in ACL terms.
		return fmt.Errorf("%w: message %s: stream %q: %w (grant the relay's Redis user XADD on the stream's key: ACL SETUSER <user> +xadd ~%s)",
			relay.ErrUnavailable, m.MessageID, stream, err, stream)
	case strings.HasPrefix(msg, "WRONGTYPE"),
		// Credentials refused on a new connection (a password rotated,
		// an ACL user deleted or disabled; a server now requiring one):
		// the route, never the message.
		strings.HasPrefix(msg, "WRONGPASS"), strings.HasPrefix(msg, "NOAUTH"),
		// A server at its maxmemory with noeviction refuses every write:
		// its state, not the message's fault.
		strings.HasPrefix(msg, "OOM"):
		return fmt.Errorf("%w: message %s: stream %q: %w", relay.ErrUnavailable, m.MessageID, stream, err)
	case strings.HasPrefix(msg, "LOADING"), strings.HasPrefix(msg, "READONLY"), strings.HasPrefix(msg, "MASTERDOWN"),
		strings.HasPrefix(msg, "CLUSTERDOWN"), strings.HasPrefix(msg, "TRYAGAIN"):
		return &relay.BatchError{Err: err}
	}
	return fmt.Errorf("outbox/redis: message %s: stream %q: %w", m.MessageID, stream, err)
}
