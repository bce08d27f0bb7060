// Package rabbitmq publishes outbox messages to RabbitMQ with
// github.com/rabbitmq/amqp091-go, with publisher confirms and mandatory
// routing, so that per-aggregate order and at-least-once delivery hold. It
// is its own module (github.com/sqloutbox/outbox/relay/rabbitmq): only its
// users download the AMQP client.
//
// # What "acknowledged" means
//
// Publish returns nil only after the broker confirmed every message
// (publisher confirms, basic.ack) and returned none as unroutable
// (mandatory: a basic.return is an error, not a success). RabbitMQ
// confirms a persistent message (every message here is published with
// DeliveryMode Persistent) once every queue it was routed to has it: a
// durable classic queue has written it to disk, a quorum queue has it on a
// majority of its replicas; a non-durable queue holds it in memory only.
// Declare durable (or quorum) queues for the durability you need.
//
// # Exchanges, routing keys and order
//
// Messages go to Config.Exchange (DefaultExchange, a topic exchange the
// operator declares: the publisher declares nothing) or, for a message
// with a Topic, to the exchange of that name, with the routing key
// DefaultRoutingKey: the aggregate type, ".", and one word for the
// aggregate ID: RoutingToken(AggregateID) ("order.o-17"). RoutingToken
// keeps the bytes [A-Za-z0-9_-] and writes every other byte (the
// separator '.', the wildcards '*' and '#', spaces, non-ASCII) as '%' and
// two hex digits. A key that would exceed AMQP's 255 bytes (a long ID,
// up to 765 bytes encoded) takes as its word "~" and the SHA-256 of the ID:
// 64 hex digits, or 43 unpadded base64url characters if the type is
// longer than 189 bytes, so that the key of Emit's longest type
// (emit.MaxAggregateTypeBytes, 200) still fits, at 245 bytes.
//
// So every key is its aggregate type followed by exactly one word (a type
// may itself contain dots; the ID's word never does): the binding
// "<type>.*" ("order.*") matches every key of that type and no other
// type's, "<type>.#" also those of the types that extend it with a dot
// ("order.v2.x" for "order.#"), "#" everything. One aggregate's messages
// share one key (a function of type and ID alone), distinct aggregates
// get distinct keys (a hashed word begins with "~", which no token
// contains). The type stays whole in the key rather than being refused
// at Emit: Emit's limits hold for every broker (200 bytes fit a Kafka
// topic), so a row Emit accepted must be publishable to each of them, and
// a key whose type prefix a binding can name keeps the event routable.
//
// A RabbitMQ queue is FIFO: messages published on one channel and routed
// to one queue are enqueued in publish order. Publish never hands the
// broker an aggregate's next message before the previous one is confirmed
// (no pipelining within an aggregate), and fails the aggregate's later
// messages in the batch with ErrHeldBack once one failed, so each queue
// holds an aggregate's messages in outbox id order. A consumer sees that
// order if it is the queue's only consumer at a time (declare the queue
// with x-single-active-consumer): competing consumers of one queue
// process messages concurrently and lose it. To spread aggregates over
// several queues keeping each aggregate on one, bind queues to an
// x-consistent-hash exchange (the rabbitmq_consistent_hash_exchange
// plugin, not enabled by default; the publisher does not need it: the
// routing key is already per aggregate) each with a single active
// consumer. Different aggregates pipeline: up to Config.MaxInFlight
// aggregates have a message awaiting its confirm at once, on one channel.
// This is relay.PublishInOrder, shared with relay/nats and relay/redis;
// the publisher adds the session, the exchange checks and the sending of
// one message.
//
// # Headers
//
// Each message carries emit's relay headers (outbox-message-id,
// outbox-event-type, outbox-aggregate-type, outbox-aggregate-id,
// outbox-content-type, outbox-partition, outbox-epoch) and the event's own
// as AMQP header table entries of type long string, byte for byte; the
// properties message-id, type and content-type repeat the message ID,
// event type and content type.
//
// # Errors
//
//   - The broker unreachable, the connection lost, ctx done, a confirm not
//     arriving in time: one error for the batch, and no further message of
//     it is sent; the relay re-sends it later without counting an
//     attempt. The publisher reconnects on the next Publish.
//   - An exchange that does not exist (checked with a passive declare on a
//     channel of its own, so the publishing channel is not closed by the
//     broker's 404), access refused (403), a message returned as
//     unroutable (no queue bound for its routing key): the message's error
//     wraps relay.ErrUnavailable; if every message failed so, Publish
//     returns one error wrapping it. A return names the message only by
//     its message ID, so messages sharing one are never in flight at once.
//   - A message larger than Config.MaxMessageBytes: relay.ErrPermanent for
//     it alone, refused before sending. Set MaxMessageBytes no higher than
//     the broker's max_message_size: a larger message makes the broker
//     close the channel (406), which fails every message in flight on it as
//     retriable and cannot be pinned on one.
//   - A nack: the broker did not enqueue the message. RabbitMQ nacks a
//     message that a queue it was routed to refuses because the queue is
//     full (x-max-length or x-max-length-bytes reached with x-overflow
//     reject-publish or reject-publish-dlx, typically while its consumer
//     is away), or because the queue failed to store it (an internal
//     error of the queue); the nack does not say which. Neither is the
//     message's fault (a message too large closes the channel, an
//     unroutable one is returned), and the message would fare no better
//     on its next attempt: the broker refuses for now, as a full JetStream
//     stream does in relay/nats. So the message's error wraps
//     relay.ErrUnavailable and ErrNacked: the relay counts no attempt,
//     dead-letters nothing, holds the aggregate's later messages and backs
//     off as a whole (every route waits, not only the full queue's) until
//     the queue takes messages again; a batch nacked whole is one error
//     wrapping relay.ErrUnavailable. A queue that keeps failing keeps the
//     relay backing off (OnUnavailable, the relay's ERROR log) instead of
//     dead-lettering the backlog: the broker must be fixed, as for a
//     missing exchange. With x-overflow drop-head (RabbitMQ's default for
//     a bounded queue) the broker confirms every message and drops the
//     queue's oldest instead: those are lost to that queue's consumer
//     although the relay marked them sent; bound queues with
//     reject-publish.
//   - The publishing channel closed by the broker: the messages in flight
//     on it fail (the relay retries them), the channel is replaced on the
//     next Publish. A channel closed with 404 (an exchange deleted after
//     it was checked) or 403 fails the messages in flight on it with
//     relay.ErrUnavailable, and the next Publish checks every exchange
//     again.
package rabbitmq

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/relay"
)

// DefaultExchange is the exchange messages without a Topic go to unless
// Config.Exchange says otherwise.
const DefaultExchange = "outbox.event"

// Defaults of Config.
const (
	// DefaultMaxInFlight is how many aggregates may have a message
	// awaiting its confirm at once.
	DefaultMaxInFlight = 256
	// DefaultMaxMessageBytes is the largest message (body plus header
	// names and values) Publish sends: emit.DefaultMaxRecordBytes, far
	// below RabbitMQ's default max_message_size (128 MiB).
	DefaultMaxMessageBytes = emit.DefaultMaxRecordBytes
	// DefaultExchangeCheckInterval is how long an exchange found to exist
	// is trusted before it is checked again.
	DefaultExchangeCheckInterval = 30 * time.Second
)

// MaxRoutingKeyBytes is AMQP's limit on a routing key (a short string).
const MaxRoutingKeyBytes = 255

var (
	// ErrConfig is returned by NewPublisher for an unusable Config.
	ErrConfig = errors.New("outbox/rabbitmq: invalid config")
	// ErrClosed is returned by Publish after Close.
	ErrClosed = errors.New("outbox/rabbitmq: publisher closed")
	// ErrHeldBack fails a message that was not sent because an earlier
	// message of its aggregate in the same batch failed. It is
	// relay.ErrHeldBack (relay.PublishInOrder holds messages back), so
	// errors.Is matches either name.
	ErrHeldBack = relay.ErrHeldBack
	// ErrReturned is wrapped (with relay.ErrUnavailable) by the error of a
	// message the broker returned as unroutable.
	ErrReturned = errors.New("outbox/rabbitmq: returned unroutable")
	// ErrNacked is wrapped (with relay.ErrUnavailable) by the error of a
	// message the broker nacked: a queue it was routed to is full with
	// x-overflow reject-publish, or could not store it.
	ErrNacked = errors.New("outbox/rabbitmq: nacked by the broker")
)

func tokenByte(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// RoutingToken encodes s into one routing-key word: bytes in
// [A-Za-z0-9_-] are kept, every other byte becomes '%' and two upper-case
// hex digits; "" becomes "%". Distinct inputs give distinct words.
func RoutingToken(s string) string {
	if s == "" {
		return "%"
	}
	const digits = "0123456789ABCDEF"
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if c := s[i]; tokenByte(c) {
			b = append(b, c)
		} else {
			b = append(b, '%', digits[c>>4], digits[c&15])
		}
	}
	return string(b)
}

// DefaultRoutingKey is m's routing key unless Config.RoutingKey says
// otherwise: AggregateType + "." + RoutingToken(AggregateID); if that is
// longer than MaxRoutingKeyBytes, AggregateType + ".~" + the hex SHA-256
// of AggregateID; if that is still too long (a type of more than 189
// bytes), AggregateType + ".~" + the unpadded base64url SHA-256 of
// AggregateID (43 characters), which fits for every type Emit accepts
// (emit.MaxAggregateTypeBytes). A longer type, which Emit refuses, gives
// a key longer than MaxRoutingKeyBytes, for which Publish fails the
// message with relay.ErrPermanent. The binding AggregateType + ".*"
// matches every key of the type (see the package doc).
func DefaultRoutingKey(m relay.Message) string {
	if k := m.AggregateType + "." + RoutingToken(m.AggregateID); len(k) <= MaxRoutingKeyBytes {
		return k
	}
	sum := sha256.Sum256([]byte(m.AggregateID))
	if k := m.AggregateType + ".~" + hex.EncodeToString(sum[:]); len(k) <= MaxRoutingKeyBytes {
		return k
	}
	return m.AggregateType + ".~" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// shortHashedWord is the length of ".~" and the unpadded base64url
// SHA-256, DefaultRoutingKey's shortest word for an ID. The constant
// below does not compile if Emit's longest aggregate type and that word
// exceed a routing key.
const shortHashedWord = 2 + 43

const _ uint = MaxRoutingKeyBytes - emit.MaxAggregateTypeBytes - shortHashedWord

// Config configures a Publisher.
type Config struct {
	// URL is the broker's AMQP URI (amqp://user:pass@host:5672/vhost or
	// amqps://...). Required.
	URL string
	// AMQP is the connection configuration (TLS, SASL, vhost, heartbeat,
	// dialer); the zero value is amqp091-go's defaults.
	AMQP amqp.Config
	// Exchange is the exchange of messages without a Topic. "":
	// DefaultExchange. It must exist; the publisher declares nothing.
	Exchange string
	// RoutingKey returns a message's routing key; it must give one
	// aggregate's messages one key. Nil: DefaultRoutingKey.
	RoutingKey func(relay.Message) string
	// MaxInFlight bounds how many aggregates may have a message awaiting
	// its confirm at once. 0: DefaultMaxInFlight.
	MaxInFlight int
	// MaxMessageBytes is the largest body plus header names and values
	// Publish sends; larger messages fail with relay.ErrPermanent. 0:
	// DefaultMaxMessageBytes.
	MaxMessageBytes int
	// ExchangeCheckInterval is how long an exchange found to exist is
	// trusted before the next passive declare. 0:
	// DefaultExchangeCheckInterval.
	ExchangeCheckInterval time.Duration
}

// Publisher is a relay.Publisher and relay.HealthChecker for RabbitMQ.
// Safe for concurrent use. Create it with NewPublisher; Close it.
type Publisher struct {
	cfg Config

	opening chan struct{} // a one-slot lock held while a session is being opened

	mu       sync.Mutex
	closed   bool
	s        *session
	verified map[string]time.Time // exchange -> checked to exist at
}

// session is one connection and its confirming publishing channel.
type session struct {
	conn     *amqp.Connection
	ch       *amqp.Channel
	chDone   chan struct{} // closed once ch has closed and closeErr is set
	closeErr error         // why ch closed (the broker's reason if it gave one)
	returns  chan amqp.Return

	mu       sync.Mutex
	returned map[string]amqp.Return // returns by message ID, not yet matched
	broken   bool
	// inFlight holds the message IDs with a publish awaiting its confirm
	// (closed when it is handled): a return names only the message ID, so
	// two messages of one ID are never in flight at once.
	inFlight map[string]chan struct{}
}

// claimID waits until no other message with this ID is in flight on s
// and marks it in flight; release ends that. ctx bounds the wait.
func (s *session) claimID(ctx context.Context, id string) (release func(), err error) {
	for {
		s.mu.Lock()
		busy, ok := s.inFlight[id]
		if !ok {
			done := make(chan struct{})
			s.inFlight[id] = done
			s.mu.Unlock()
			return func() {
				s.mu.Lock()
				delete(s.inFlight, id)
				s.mu.Unlock()
				close(done)
			}, nil
		}
		s.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, &relay.BatchError{Err: ctx.Err()}
		}
	}
}

// NewPublisher connects to cfg.URL and opens a confirming channel. It
// returns an error wrapping ErrConfig for an unusable Config, and the
// dial's error (wrapping relay.ErrUnavailable for refused credentials or
// vhost access) if the broker cannot be reached.
func NewPublisher(cfg Config) (*Publisher, error) {
	switch {
	case cfg.URL == "":
		return nil, fmt.Errorf("%w: URL is required", ErrConfig)
	case cfg.MaxInFlight < 0 || cfg.MaxMessageBytes < 0 || cfg.ExchangeCheckInterval < 0:
		return nil, fmt.Errorf("%w: MaxInFlight, MaxMessageBytes and ExchangeCheckInterval must not be negative", ErrConfig)
	}
	if _, err := amqp.ParseURI(cfg.URL); err != nil {
		return nil, fmt.Errorf("%w: URL: %w", ErrConfig, err)
	}
	if cfg.Exchange == "" {
		cfg.Exchange = DefaultExchange
	}
	if cfg.RoutingKey == nil {
		cfg.RoutingKey = DefaultRoutingKey
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.MaxMessageBytes == 0 {
		cfg.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if cfg.ExchangeCheckInterval == 0 {
		cfg.ExchangeCheckInterval = DefaultExchangeCheckInterval
	}
	p := &Publisher{cfg: cfg, verified: map[string]time.Time{}, opening: make(chan struct{}, 1)}
	ctx, cancel := context.WithTimeout(context.Background(), newTimeout)
	defer cancel()
	if _, err := p.session(ctx); err != nil {
		return nil, err
	}
	return p, nil
}

// MaxRecordBytes returns Config.MaxMessageBytes, for
// driver.Config.Limits.MaxRecordBytes.
func (p *Publisher) MaxRecordBytes() int { return p.cfg.MaxMessageBytes }

// newTimeout bounds NewPublisher's first connection.
const newTimeout = 30 * time.Second

// inBackground runs fn and returns its error, or ctx's error if ctx ends
// first (fn then finishes in the background): amqp091-go's dial, channel
// open and passive declare take no context.
func inBackground(ctx context.Context, fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return &relay.BatchError{Err: ctx.Err()}
	}
}

// session returns the open session, opening a new channel (and, if the
// connection is gone, a new connection) if there is none or it broke.
// ctx bounds the wait.
func (p *Publisher) session(ctx context.Context) (*session, error) {
	select {
	case p.opening <- struct{}{}:
	case <-ctx.Done():
		return nil, &relay.BatchError{Err: ctx.Err()}
	}
	type result struct {
		s   *session
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer func() { <-p.opening }()
		s, err := p.open(ctx)
		done <- result{s, err}
	}()
	select {
	case r := <-done:
		return r.s, r.err
	case <-ctx.Done():
		// open finishes in the background and installs what it opened.
		return nil, &relay.BatchError{Err: ctx.Err()}
	}
}

// open is session's work, under the opening lock.
func (p *Publisher) open(ctx context.Context) (*session, error) {
	p.mu.Lock()
	old, closed := p.s, p.closed
	p.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	var conn *amqp.Connection
	if old != nil {
		old.mu.Lock()
		ok := !old.broken && !old.conn.IsClosed() && !old.ch.IsClosed()
		old.mu.Unlock()
		if ok {
			return old, nil
		}
		if !old.conn.IsClosed() {
			conn = old.conn
			// Unconfirmed publishes of the old channel may still be
			// enqueued; an aggregate's retry re-sends them first, so its
			// first deliveries keep their order. Close it without waiting.
			go func() { _ = old.ch.Close() }()
		}
	}
	if conn == nil {
		cfg := p.cfg.AMQP
		dial := cfg.Dial
		if dial == nil {
			dial = amqp.DefaultDial(newTimeout)
		}
		cfg.Dial = func(network, addr string) (net.Conn, error) {
			c, err := dial(network, addr)
			if err == nil {
				if d, ok := ctx.Deadline(); ok {
					// Bounds the TLS and AMQP handshakes; amqp091-go clears
					// it once the connection is open.
					_ = c.SetDeadline(d)
				}
			}
			return c, err
		}
		c, err := amqp.DialConfig(p.cfg.URL, cfg)
		if err != nil {
			return nil, fmt.Errorf("outbox/rabbitmq: connecting: %w", classifyConn(err))
		}
		conn = c
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		go func() { _ = conn.CloseDeadline(time.Now().Add(closeWait)) }()
		p.mu.Lock()
		p.s = nil
		p.mu.Unlock()
		return nil, &relay.BatchError{Err: fmt.Errorf("outbox/rabbitmq: opening a confirming channel: %w", classifyConn(err))}
	}
	s := &session{conn: conn, ch: ch, returned: map[string]amqp.Return{}, inFlight: map[string]chan struct{}{}}
	s.chDone = make(chan struct{})
	chClosed := ch.NotifyClose(make(chan *amqp.Error, 1))
	go func() {
		err := error(amqp.ErrClosed)
		if ae := <-chClosed; ae != nil {
			err = ae
		}
		s.mu.Lock()
		s.closeErr = err
		s.broken = true
		s.mu.Unlock()
		close(s.chDone)
	}()
	// Buffered so that amqp091-go's reader puts a basic.return here before
	// it dispatches the basic.ack that follows it on the wire.
	s.returns = ch.NotifyReturn(make(chan amqp.Return, 4*p.cfg.MaxInFlight))
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		go func() { _ = conn.CloseDeadline(time.Now().Add(closeWait)) }()
		return nil, ErrClosed
	}
	p.s = s
	return s, nil
}

// wasReturned reports (and forgets) the return of the message with this
// ID, draining the returns received so far.
func (s *session) wasReturned(id string) (amqp.Return, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for drained := false; !drained; {
		select {
		case r, ok := <-s.returns:
			if !ok {
				drained = true
				break
			}
			s.returned[r.MessageId] = r
		default:
			drained = true
		}
	}
	r, ok := s.returned[id]
	delete(s.returned, id)
	return r, ok
}

func (s *session) breakOff() {
	s.mu.Lock()
	s.broken = true
	s.mu.Unlock()
}

// exchangeOK reports nil if exchange exists (by a recent check or a
// passive declare on a channel of its own), else an error wrapping
// relay.ErrUnavailable for a missing one or access refused, or a
// connection error (relay.BatchError).
func (p *Publisher) exchangeOK(ctx context.Context, s *session, exchange string) error {
	p.mu.Lock()
	at, ok := p.verified[exchange]
	p.mu.Unlock()
	if ok && time.Since(at) < p.cfg.ExchangeCheckInterval {
		return nil
	}
	if exchange == "" { // the default exchange always exists
		return nil
	}
	var declareErr error
	err := inBackground(ctx, func() error {
		ch, err := s.conn.Channel()
		if err != nil {
			return &relay.BatchError{Err: fmt.Errorf("outbox/rabbitmq: opening a channel: %w", err)}
		}
		declareErr = ch.ExchangeDeclarePassive(exchange, amqp.ExchangeTopic, false, false, false, false, nil)
		_ = ch.Close()
		return nil
	})
	if err != nil {
		return err
	}
	err = declareErr
	if err == nil {
		p.mu.Lock()
		p.verified[exchange] = time.Now()
		p.mu.Unlock()
		return nil
	}
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return fmt.Errorf("%w: exchange %q does not exist: declare it with `%s` (or rabbitmq.Declare): %w", relay.ErrUnavailable, exchange, Topology{Exchange: exchange}.declareCommand(), err)
	}
	if errors.As(err, &ae) && ae.Code == amqp.AccessRefused {
		return accessRefused(exchange, err)
	}
	return &relay.BatchError{Err: fmt.Errorf("outbox/rabbitmq: checking exchange %q: %w", exchange, err)}
}

// Healthy reports whether the broker answers: the connection is (re)opened
// if needed and Config.Exchange is checked with a passive declare. It
// implements relay.HealthChecker.
func (p *Publisher) Healthy(ctx context.Context) error {
	s, err := p.session(ctx)
	if err != nil {
		return err
	}
	p.mu.Lock()
	delete(p.verified, p.cfg.Exchange)
	p.mu.Unlock()
	return p.exchangeOK(ctx, s, p.cfg.Exchange)
}

// Close closes the connection; Publish returns ErrClosed after it. Safe to
// call more than once and concurrently. Publish calls waiting for confirms
// fail (as a batch error).
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.s == nil {
		return nil
	}
	err := p.s.conn.CloseDeadline(time.Now().Add(closeWait))
	p.s = nil
	if errors.Is(err, amqp.ErrClosed) {
		err = nil
	}
	return err
}

// accessRefused wraps a broker's 403 (ACCESS_REFUSED) on exchange ("" if
// the broker's message names it) in relay.ErrUnavailable, with what to
// grant: the write permission on the exchange, which basic.publish needs
// (RabbitMQ's access control) and which is all the publisher needs (its
// passive check of the exchange passes with write alone: the
// permission-revoked fault test grants nothing else).
func accessRefused(exchange string, err error) error {
	const hint = "the relay's user needs the write permission on the exchange in its vhost: rabbitmqctl set_permissions -p <vhost> <user> <configure> <write> <read>, with <write> a regular expression matching the exchange's name"
	if exchange == "" {
		return fmt.Errorf("%w: %w (%s)", relay.ErrUnavailable, err, hint)
	}
	return fmt.Errorf("%w: exchange %q: %w (%s)", relay.ErrUnavailable, exchange, err, hint)
}

// classifyConn maps a connection-level error: refused credentials or
// vhost access are relay.ErrUnavailable.
func classifyConn(err error) error {
	var ae *amqp.Error
	if errors.Is(err, amqp.ErrSASL) || errors.Is(err, amqp.ErrCredentials) || errors.Is(err, amqp.ErrVhost) ||
		(errors.As(err, &ae) && ae.Code == amqp.AccessRefused) {
		return fmt.Errorf("%w: %w", relay.ErrUnavailable, err)
	}
	return err
}

// Publish sends msgs and waits for every confirm (see the package doc for
// order, errors and what a confirm means). It returns nil when all were
// confirmed and none returned; relay.PublishErrors when some failed; one
// error for the batch when the broker could not be reached, the
// connection was lost, ctx ended, every message's route is unavailable
// (wrapping relay.ErrUnavailable), or after Close (ErrClosed).
func (p *Publisher) Publish(ctx context.Context, msgs []relay.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(msgs) == 0 {
		p.mu.Lock()
		closed := p.closed
		p.mu.Unlock()
		if closed {
			return ErrClosed
		}
		return nil
	}
	s, err := p.session(ctx)
	if err != nil {
		return fmt.Errorf("outbox/rabbitmq: %w", err)
	}
	// The exchanges of the batch, each checked once.
	exchangeErr := map[string]error{}
	for i := range msgs {
		ex := p.exchangeOf(&msgs[i])
		if _, done := exchangeErr[ex]; done {
			continue
		}
		err := p.exchangeOK(ctx, s, ex)
		if be := (*relay.BatchError)(nil); errors.As(err, &be) {
			return err
		}
		exchangeErr[ex] = err
	}

	// One aggregate at a time, in batch order, each message after the
	// previous one's confirm; aggregates concurrently.
	err = relay.PublishInOrder(ctx, msgs, p.cfg.MaxInFlight, func(ctx context.Context, i int) error {
		if err := exchangeErr[p.exchangeOf(&msgs[i])]; err != nil {
			return err
		}
		return p.publishOne(ctx, s, &msgs[i])
	})
	var pe relay.PublishErrors
	if err == nil || errors.As(err, &pe) {
		return err
	}
	if be := (*relay.BatchError)(nil); errors.As(err, &be) {
		// The connection lost, ctx done, confirms of this batch that may
		// still arrive: the next Publish starts on a new channel.
		s.breakOff()
	}
	return fmt.Errorf("outbox/rabbitmq: %w", err)
}

func (p *Publisher) exchangeOf(m *relay.Message) string {
	if m.Topic != "" {
		return m.Topic
	}
	return p.cfg.Exchange
}

// publishOne sends m and waits for its confirm.
func (p *Publisher) publishOne(ctx context.Context, s *session, m *relay.Message) error {
	pub, size := p.publishing(m)
	if size > p.cfg.MaxMessageBytes {
		return fmt.Errorf("%w: message %s of %d bytes exceeds MaxMessageBytes %d", relay.ErrPermanent, m.MessageID, size, p.cfg.MaxMessageBytes)
	}
	key := p.cfg.RoutingKey(*m)
	if len(key) > MaxRoutingKeyBytes {
		return fmt.Errorf("%w: message %s: routing key of %d bytes exceeds %d", relay.ErrPermanent, m.MessageID, len(key), MaxRoutingKeyBytes)
	}
	release, err := s.claimID(ctx, m.MessageID)
	if err != nil {
		return err
	}
	defer release()
	dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, p.exchangeOf(m), key, true, false, pub)
	if err != nil {
		if ctx.Err() != nil {
			return &relay.BatchError{Err: ctx.Err()}
		}
		return p.closedErr(ctx, s, err)
	}
	select {
	case <-dc.Done():
	case <-ctx.Done():
		return &relay.BatchError{Err: ctx.Err()}
	case <-s.chDone:
		return p.closedErr(ctx, s, nil)
	}
	if !dc.Acked() {
		// A nack, or the channel closed under the confirm.
		if s.ch.IsClosed() {
			return p.closedErr(ctx, s, nil)
		}
		// The broker refused to enqueue it: a queue full with x-overflow
		// reject-publish, or an internal error of a queue. Never the
		// message's fault (an oversized one closes the channel, an
		// unroutable one is returned): unavailable, no attempt counted.
		return fmt.Errorf("%w: %w: message %s to exchange %q with routing key %q (a queue it routes to is full with x-overflow reject-publish, or failed to store it)",
			relay.ErrUnavailable, ErrNacked, m.MessageID, p.exchangeOf(m), key)
	}
	if r, ok := s.wasReturned(m.MessageID); ok {
		return fmt.Errorf("%w: %w: message %s to exchange %q with routing key %q: %d %s (%s)",
			relay.ErrUnavailable, ErrReturned, m.MessageID, p.exchangeOf(m), key, r.ReplyCode, r.ReplyText, ReturnedHint(p.exchangeOf(m), key))
	}
	return nil
}

// closeWait bounds how long a failed publish waits for the channel's
// close reason (amqp091-go marks the channel closed before it delivers the
// reason).
const closeWait = time.Second

// closedErr classifies a publish on a channel that closed (err: what the
// publish call itself returned, if anything): the connection gone fails
// the batch; a 404 or 403 from the broker is relay.ErrUnavailable; else
// the message fails (retriable). The next Publish opens a new channel.
func (p *Publisher) closedErr(ctx context.Context, s *session, err error) error {
	s.breakOff()
	t := time.NewTimer(closeWait)
	defer t.Stop()
	select {
	case <-s.chDone:
		s.mu.Lock()
		err = s.closeErr
		s.mu.Unlock()
	case <-ctx.Done():
		return &relay.BatchError{Err: ctx.Err()}
	case <-t.C:
		if err == nil {
			err = amqp.ErrClosed
		}
	}
	if s.conn.IsClosed() {
		return &relay.BatchError{Err: fmt.Errorf("connection lost: %w", err)}
	}
	var ae *amqp.Error
	if errors.As(err, &ae) && (ae.Code == amqp.AccessRefused || ae.Code == amqp.NotFound) {
		// An exchange deleted (or access revoked) since it was checked:
		// check again on the next Publish.
		p.mu.Lock()
		clear(p.verified)
		p.mu.Unlock()
		if ae.Code == amqp.AccessRefused {
			return fmt.Errorf("channel closed by the broker: %w", accessRefused("", err))
		}
		return fmt.Errorf("%w: channel closed by the broker: %w", relay.ErrUnavailable, err)
	}
	return fmt.Errorf("outbox/rabbitmq: channel closed, outcome unknown: %w", err)
}

// publishing builds m's AMQP message and its size (body plus header names
// and values).
func (p *Publisher) publishing(m *relay.Message) (amqp.Publishing, int) {
	h := make(amqp.Table, 7+len(m.Headers))
	size := len(m.Payload)
	set := func(k, v string) {
		h[k] = v
		size += len(k) + len(v)
	}
	set(emit.HeaderMessageID, m.MessageID)
	set(emit.HeaderEventType, m.EventType)
	set(emit.HeaderAggregateType, m.AggregateType)
	set(emit.HeaderAggregateID, m.AggregateID)
	set(emit.HeaderContentType, m.ContentType)
	set(emit.HeaderPartition, strconv.Itoa(m.Partition))
	set(emit.HeaderEpoch, strconv.FormatInt(m.Epoch, 10))
	for k, v := range m.Headers {
		set(k, v)
	}
	body := m.Payload
	if body == nil {
		body = []byte{}
	}
	return amqp.Publishing{
		Headers:      h,
		ContentType:  m.ContentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    m.MessageID,
		Type:         m.EventType,
		Body:         body,
	}, size
}

// ReturnedHint returns what to do about a message the broker returned as
// unroutable from exchange with routing key: no queue is bound for that
// key. It names the exchange and a binding key that takes the key's
// aggregate type (its first word, then ".#"), in the command that
// declares such a queue (`outbox rabbitmq declare --exchange EXCHANGE
// --queue NAME --binding-key 'TYPE.#'`), and says a mistyped Topic (the
// exchange) is the other way out. Publisher errors quote it.
func ReturnedHint(exchange, key string) string {
	binding := "#"
	if word, _, ok := strings.Cut(key, "."); ok && word != "" {
		binding = word + ".#"
	}
	cmd := Topology{Exchange: exchange, Queue: "NAME"}.declareCommand()
	if exchange == DefaultExchange {
		cmd = strings.Replace(cmd, " --queue", " --exchange "+exchange+" --queue", 1)
	}
	return fmt.Sprintf("no queue is bound to exchange %q for routing key %q: bind your consumers' queues to it, or declare one: `%s --binding-key '%s'`; or fix the event's Topic if it names the wrong exchange", exchange, key, cmd, binding)
}
