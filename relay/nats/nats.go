// Package natspub publishes outbox messages to NATS JetStream with
// github.com/nats-io/nats.go, so that per-aggregate order and
// at-least-once delivery hold. It is its own module
// (github.com/sqloutbox/outbox/relay/nats): only its users download the
// NATS client.
//
// # What "acknowledged" means
//
// Publish returns nil only after JetStream answered every message with a
// PubAck. A PubAck means the stream stored the message according to its
// own configuration: in memory for MemoryStorage, on disk (fsynced on the
// server's sync interval) for FileStorage, and on a quorum of Replicas for
// a replicated stream. Choose the stream's storage and replicas for the
// durability you need; the publisher reports no more than the stream
// promises. Nothing is reported acknowledged without its PubAck.
//
// # Subjects and order
//
// Every message goes to a subject of its own aggregate: DefaultSubject is
// DefaultSubjectPrefix + AggregateType + "." + SubjectToken(AggregateID)
// ("outbox.event.order.o-17"); a message's Topic, if set, replaces
// DefaultSubjectPrefix + AggregateType; Config.Subject replaces the
// whole scheme. A stream binding "outbox.event.order.>" then stores all
// order events, and each aggregate's messages are the messages of one
// subject.
//
// SubjectToken encodes an arbitrary aggregate ID into one subject token:
// bytes in [A-Za-z0-9_-] are kept, every other byte (the token separator
// '.', the wildcards '*' and '>', spaces, '%' itself, every non-ASCII
// byte) becomes '%' and two upper-case hex digits. The encoding is
// reversible (DecodeSubjectToken), distinct IDs get distinct tokens, and a
// token is never empty, so no ID can reach another aggregate's subject or
// a wildcard.
//
// Within one aggregate Publish does not pipeline: it sends an aggregate's
// next message only after the previous one's PubAck, so the stream stores
// an aggregate's messages in outbox id order, and a stream consumer
// (ordered, or any consumer with one subject's messages in stream
// sequence order) sees them in that order. Once a message fails, the
// aggregate's later messages in the batch fail with ErrHeldBack without
// being sent (the relay re-sends them after the failed one, as its
// contract requires). Different aggregates pipeline freely: up to
// Config.MaxInFlight aggregates have a message awaiting its PubAck at
// once (asynchronous publishes with PubAck futures on one connection).
// This is relay.PublishInOrder, shared with relay/rabbitmq and
// relay/redis; the publisher adds only the sending of one message.
//
// JetStream's Nats-Expected-Last-Subject-Sequence header cannot lift the
// one-at-a-time rule: it names the stream sequence of the subject's
// previous message, which the server assigns only when it stores that
// message, so a second message cannot carry it before the first one's
// PubAck. It could guard the order, never pipeline it; the publisher
// does not set it.
//
// # Provisioning the stream
//
// The publisher creates no stream. CreateStream (or `outbox nats stream
// create`) makes one binding "<prefix>>" with the storage, replicas and
// duplicate window you choose, and CheckStream (`outbox nats stream
// check`) verifies it; both leave an existing stream with other settings
// unchanged and name what differs (ErrStreamMismatch). Set Config.Stream
// to the stream's name: Healthy then checks it, and a relay started
// without it is unready from its first probe, with the command that
// creates it in the reason (ErrStreamMissing).
//
// # Deduplication
//
// The Nats-Msg-Id header is the message ID: JetStream drops a second
// message with the same ID that arrives within the stream's duplicate
// window (Duplicates, 2 minutes by default) and answers it with a PubAck
// marked duplicate. So a relay that re-sends a batch after a timeout or
// a crash (at-least-once) does not store the same event twice in the
// stream within that window; after the window, or across streams, it
// does, and consumers still dedupe by the outbox-message-id header.
//
// # Headers
//
// Each message carries emit's relay headers (outbox-message-id,
// outbox-event-type, outbox-aggregate-type, outbox-aggregate-id,
// outbox-content-type, outbox-partition, outbox-epoch), then the event's
// own headers (trace context included), as NATS headers, byte for byte,
// and Nats-Msg-Id. Emit refuses header names and values NATS cannot carry
// (see emit.Event.Headers); a row written before that rule with such a
// header fails with relay.ErrPermanent (a dead letter), never altered.
//
// # Errors
//
//   - The server unreachable, the connection closed or reconnecting, ctx
//     done, a PubAck that did not arrive in time: Publish returns one error
//     for the batch (not relay.PublishErrors), no further message of the
//     batch is sent, and the relay re-sends the batch later without
//     counting an attempt. While the connection is not CONNECTED, Publish
//     sends nothing and fails at once with ErrNotConnected, naming the
//     connection's state (nats.go would buffer the publishes and the
//     batch would wait out AckTimeout for each).
//   - No stream for the subject (no responders), a JetStream API error
//     with status 403 or 404: the message's error wraps
//     relay.ErrUnavailable; if every message failed so, Publish returns one
//     error wrapping it (the relay backs off, dead-letters nothing).
//   - A publish the connection's user may not make: the server drops the
//     message and reports a permissions violation for its subject (or for
//     the reply subject its PubAck would come back on) instead of a
//     PubAck. The message's error wraps relay.ErrUnavailable as soon as
//     the violation arrives (not after AckTimeout); if every message
//     failed so, Publish returns one error wrapping it. Healthy fails the
//     same way for a user that may not use the JetStream API. (The denied
//     publish keeps its slot among the connection's pending asynchronous
//     publishes until AckTimeout; with so many of them that no slot is
//     left, the batch fails as a whole instead.)
//   - A stream that refuses new messages (full with DiscardNew: MaxMsgs,
//     MaxBytes or MaxMsgsPerSubject reached; JetStream out of resources;
//     API status 503): relay.ErrUnavailable, as a missing stream, so a
//     full stream makes the relay back off instead of counting attempts
//     and dead-lettering the backlog.
//   - A message larger than the server's max_payload or the stream's
//     max_msg_size: relay.ErrPermanent for that message only.
//   - Any other JetStream error: that message fails (retried by the
//     relay), its aggregate's later ones are held back.
//
// The server reports a permissions violation asynchronously, through the
// connection's error handler: NewPublisher puts a handler of its own in
// front of the connection's (which still receives every error) to match
// violations to the publishes waiting. A handler set on the connection
// after NewPublisher replaces it: denied publishes then fail as PubAck
// timeouts of the batch. A violation of the subscription to the reply
// inbox is not matched either (it also ends in timeouts); the connection's
// error handler has the reason.
package natspub

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/relay"
)

// DefaultSubjectPrefix is prepended to the aggregate type by
// DefaultSubject, as relay/kafka's DefaultTopicPrefix names topics.
const DefaultSubjectPrefix = "outbox.event."

// Defaults of Config.
const (
	// DefaultMaxInFlight is how many aggregates may have a message
	// awaiting its PubAck at once.
	DefaultMaxInFlight = 256
	// DefaultAckTimeout is how long one message waits for its PubAck
	// before it fails (as a timeout of the batch).
	DefaultAckTimeout = 30 * time.Second
)

// MsgIDHeader is the JetStream deduplication header, set to the message ID.
const MsgIDHeader = jetstream.MsgIDHeader

var (
	// ErrConfig is returned by NewPublisher for an unusable Config.
	ErrConfig = errors.New("outbox/nats: invalid config")
	// ErrClosed is returned by Publish after Close.
	ErrClosed = errors.New("outbox/nats: publisher closed")
	// ErrNotConnected is wrapped (inside a *relay.BatchError) by Publish
	// while the connection is not CONNECTED (reconnecting, closed): the
	// batch fails at once, without waiting AckTimeout, and the relay
	// re-sends it after its backoff without counting an attempt.
	ErrNotConnected = errors.New("outbox/nats: not connected")
	// ErrHeldBack fails a message that was not sent because an earlier
	// message of its aggregate in the same batch failed. It is
	// relay.ErrHeldBack (relay.PublishInOrder holds messages back), so
	// errors.Is matches either name.
	ErrHeldBack = relay.ErrHeldBack
)

// SubjectToken encodes s into one NATS subject token: bytes in
// [A-Za-z0-9_-] are kept, every other byte becomes '%' followed by two
// upper-case hex digits; "" becomes "%". Distinct inputs give distinct
// tokens (DecodeSubjectToken reverses it).
func SubjectToken(s string) string {
	if s == "" {
		return "%"
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// ErrBadToken is returned by DecodeSubjectToken for a string SubjectToken
// cannot have produced.
var ErrBadToken = errors.New("outbox/nats: not a subject token of SubjectToken")

// DecodeSubjectToken returns the string SubjectToken encoded into tok, or
// an error wrapping ErrBadToken.
func DecodeSubjectToken(tok string) (string, error) {
	switch tok {
	case "":
		return "", fmt.Errorf("%w: empty", ErrBadToken)
	case "%":
		return "", nil
	}
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		if c != '%' {
			if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
				return "", fmt.Errorf("%w: byte %q at %d", ErrBadToken, c, i)
			}
			b.WriteByte(c)
			continue
		}
		if i+2 >= len(tok) {
			return "", fmt.Errorf("%w: truncated escape at %d", ErrBadToken, i)
		}
		v, err := strconv.ParseUint(tok[i+1:i+3], 16, 8)
		if err != nil || strings.ToUpper(tok[i+1:i+3]) != tok[i+1:i+3] {
			return "", fmt.Errorf("%w: bad escape %q at %d", ErrBadToken, tok[i:i+3], i)
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}

// DefaultSubject is the subject of m unless Config.Subject says otherwise:
// m.Topic (if set) or DefaultSubjectPrefix + m.AggregateType, then "."
// and SubjectToken(m.AggregateID).
func DefaultSubject(m relay.Message) string {
	base := m.Topic
	if base == "" {
		base = DefaultSubjectPrefix + m.AggregateType
	}
	return base + "." + SubjectToken(m.AggregateID)
}

// Config configures a Publisher.
type Config struct {
	// Conn is the NATS connection to publish on. Required. Its options
	// (URLs, TLS, credentials, reconnect behaviour) are the caller's, and
	// so is closing it: Publisher.Close does not. NewPublisher chains a
	// handler in front of its error handler (see the package doc,
	// Errors); set the connection's own handler before NewPublisher.
	Conn *nats.Conn
	// Subject returns a message's subject. It must give all messages of
	// one aggregate the same subject and other aggregates other subjects
	// (or the relay's order per aggregate is only as good as the mapping).
	// Nil: DefaultSubject.
	Subject func(relay.Message) string
	// MaxInFlight bounds how many aggregates may have a message awaiting
	// its PubAck at once. 0: DefaultMaxInFlight.
	MaxInFlight int
	// AckTimeout bounds the wait for one message's PubAck, in addition to
	// Publish's ctx. 0: DefaultAckTimeout.
	AckTimeout time.Duration
	// Stream names the stream the messages are stored in (for example
	// the one CreateStream made). Healthy then checks that it exists, so
	// that a missing stream makes the relay unready from its first probe,
	// with the command that creates it. Empty: Healthy checks only that
	// JetStream answers (which subjects the relay will publish to depends
	// on the events' Topics), and a missing stream shows at the first
	// publish (relay.ErrUnavailable, naming the subject and the command;
	// the relay is unready from then on).
	Stream string
}

// Publisher is a relay.Publisher and relay.HealthChecker for NATS
// JetStream. Safe for concurrent use. Create it with NewPublisher.
type Publisher struct {
	cfg     Config
	js      jetstream.JetStream
	denials denials

	mu     sync.RWMutex
	closed bool
}

// NewPublisher returns a Publisher on cfg.Conn. It returns an error
// wrapping ErrConfig if Conn is nil or a bound is negative; it does not
// contact the server (Healthy does).
func NewPublisher(cfg Config) (*Publisher, error) {
	switch {
	case cfg.Conn == nil:
		return nil, fmt.Errorf("%w: Conn is required", ErrConfig)
	case cfg.MaxInFlight < 0:
		return nil, fmt.Errorf("%w: MaxInFlight %d is negative", ErrConfig, cfg.MaxInFlight)
	case cfg.AckTimeout < 0:
		return nil, fmt.Errorf("%w: AckTimeout %s is negative", ErrConfig, cfg.AckTimeout)
	}
	if cfg.Subject == nil {
		cfg.Subject = DefaultSubject
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.AckTimeout == 0 {
		cfg.AckTimeout = DefaultAckTimeout
	}
	js, err := jetstream.New(cfg.Conn, jetstream.WithPublishAsyncTimeout(cfg.AckTimeout),
		// Room beyond MaxInFlight for publishes of earlier batches that
		// gave up on their PubAck (they time out after AckTimeout).
		jetstream.WithPublishAsyncMaxPending(4*cfg.MaxInFlight))
	if err != nil {
		return nil, fmt.Errorf("outbox/nats: %w", err)
	}
	p := &Publisher{cfg: cfg, js: js}
	next := cfg.Conn.ErrorHandler()
	cfg.Conn.SetErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
		p.denials.report(err)
		if next != nil {
			next(nc, sub, err)
		}
	})
	return p, nil
}

// MaxRecordBytes returns the largest record Emit should accept for this
// server: its max_payload less room for the headers NATS adds
// (Nats-Msg-Id, framing), at most emit.DefaultMaxRecordBytes. Pass it to
// driver.Config.Limits.MaxRecordBytes. A stream's max_msg_size, if
// smaller, is not known here: use the smaller one.
func (p *Publisher) MaxRecordBytes() int {
	n := int(p.cfg.Conn.MaxPayload()) - 256
	if n <= 0 || n > emit.DefaultMaxRecordBytes {
		return emit.DefaultMaxRecordBytes
	}
	return n
}

// Healthy reports whether the connection is up and the stream the
// messages go to exists (Config.Stream: its info; without it, JetStream's
// account info: one round trip either way). It implements relay.HealthChecker. A missing stream gives an
// error wrapping relay.ErrUnavailable and ErrStreamMissing that names the
// command creating it, so the relay is unready at once.
func (p *Publisher) Healthy(ctx context.Context) error {
	if s := p.cfg.Conn.Status(); s != nats.CONNECTED {
		return fmt.Errorf("outbox/nats: the connection to the NATS server is %s", s)
	}
	// A denied request gets no answer but a permissions violation: end
	// the wait for the answer when it comes.
	what, subject, call := "JetStream account info", accountInfoSubject, func(ctx context.Context) error {
		_, err := p.js.AccountInfo(ctx)
		return err
	}
	missing := ""
	switch {
	case p.cfg.Stream != "":
		sc := StreamConfig{Name: p.cfg.Stream}
		what, subject = "stream "+p.cfg.Stream, streamInfoSubject+p.cfg.Stream
		missing = fmt.Sprintf("no stream %s: create it with `%s` (or natspub.CreateStream)", p.cfg.Stream, sc.CreateCommand())
		call = func(ctx context.Context) error {
			_, err := p.js.Stream(ctx, p.cfg.Stream)
			return err
		}
	}
	ictx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	denied, stop := p.denials.watch(subject)
	defer stop()
	go func() {
		select {
		case err := <-denied:
			cancel(err)
		case <-ictx.Done():
		}
	}()
	if err := call(ictx); err != nil {
		if cause := context.Cause(ictx); errors.Is(cause, relay.ErrUnavailable) {
			err = cause
		}
		if errors.Is(err, jetstream.ErrStreamNotFound) && missing != "" {
			return fmt.Errorf("outbox/nats: %w: %w: %s", relay.ErrUnavailable, ErrStreamMissing, missing)
		}
		return fmt.Errorf("outbox/nats: %s: %w", what, classify(err))
	}
	return nil
}

// JetStream API subjects Healthy requests (jetstream.New's default API
// prefix).
const (
	accountInfoSubject = "$JS.API.INFO"
	streamInfoSubject  = "$JS.API.STREAM.INFO."
)

// denials matches the server's permissions violations for publishes,
// which arrive through the connection's error handler, to the publishes
// waiting for an answer on that subject. The zero value is ready.
type denials struct {
	mu      sync.Mutex
	waiting map[string]map[chan error]struct{} // subject -> waiters
}

// watch returns a channel that receives an error wrapping
// relay.ErrUnavailable if the server reports a publish to subject (or
// with a reply subject) as a permissions violation, and a func that ends
// the watch. Call watch before publishing.
func (d *denials) watch(subject string) (<-chan error, func()) {
	c := make(chan error, 1)
	d.mu.Lock()
	if d.waiting == nil {
		d.waiting = map[string]map[chan error]struct{}{}
	}
	w := d.waiting[subject]
	if w == nil {
		w = map[chan error]struct{}{}
		d.waiting[subject] = w
	}
	w[c] = struct{}{}
	d.mu.Unlock()
	return c, func() {
		d.mu.Lock()
		// A subject's set is dropped only once empty, so c is still in
		// the set the map holds now.
		if w := d.waiting[subject]; w != nil {
			delete(w, c)
			if len(w) == 0 {
				delete(d.waiting, subject)
			}
		}
		d.mu.Unlock()
	}
}

// report hands err, if it is a permissions violation of a publish, to the
// watchers of its subject; a violation of the reply subject (every
// PubAck of the connection comes back on one inbox) to every watcher.
// Other errors are ignored.
func (d *denials) report(err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	msg := err.Error()
	const publishTo, withReply = "Violation for Publish to ", "Violation for Publish with Reply of "
	var subject string
	all := false
	switch {
	case strings.Contains(msg, withReply):
		all = true
	case strings.Contains(msg, publishTo):
		// The server quotes the subject with Go's %q.
		rest := msg[strings.Index(msg, publishTo)+len(publishTo):]
		q, qerr := strconv.QuotedPrefix(rest)
		if qerr != nil {
			return
		}
		if subject, qerr = strconv.Unquote(q); qerr != nil {
			return
		}
	default:
		return // a subscription's violation: not a publish
	}
	denied := fmt.Errorf("%w: %w", relay.ErrUnavailable, err)
	d.mu.Lock()
	defer d.mu.Unlock()
	for s, w := range d.waiting {
		if !all && s != subject {
			continue
		}
		for c := range w {
			select {
			case c <- denied:
			default: // already told
			}
		}
	}
}

// Close makes later Publish calls return ErrClosed; it does not close
// Config.Conn. It is safe to call more than once and concurrently, and
// waits for running Publish calls to return.
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	return nil
}

// Publish sends msgs and waits for every PubAck (see the package doc for
// order, errors and what an acknowledgement means). It returns nil when
// all were acknowledged; relay.PublishErrors when some failed; one error
// for the batch when the server could not be reached, ctx ended, every
// message's route is unavailable (wrapping relay.ErrUnavailable), or
// after Close (ErrClosed).
func (p *Publisher) Publish(ctx context.Context, msgs []relay.Message) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	// While nats.go reconnects, a publish would wait out AckTimeout
	// (buffered for the reconnect): fail the batch at once instead.
	if s := p.cfg.Conn.Status(); s != nats.CONNECTED {
		return fmt.Errorf("outbox/nats: %w", &relay.BatchError{Err: fmt.Errorf("the connection to the NATS server is %s; nothing sent, the relay retries after its backoff: %w", s, ErrNotConnected)})
	}
	// One aggregate at a time, in batch order, each message after the
	// previous one's PubAck; aggregates concurrently.
	err := relay.PublishInOrder(ctx, msgs, p.cfg.MaxInFlight, func(ctx context.Context, i int) error {
		return p.publishOne(ctx, &msgs[i])
	})
	var pe relay.PublishErrors
	if err == nil || errors.As(err, &pe) {
		return err
	}
	return fmt.Errorf("outbox/nats: %w", err)
}

// publishOne sends m and waits for its PubAck.
func (p *Publisher) publishOne(ctx context.Context, m *relay.Message) error {
	nm, err := p.message(m)
	if err != nil {
		return err
	}
	// The server answers a publish the user may not make with a
	// permissions violation instead of a PubAck.
	denied, stop := p.denials.watch(nm.Subject)
	defer stop()
	// A message's own error names the message and its subject (the one a
	// stream must bind, for "no stream answers"); a batch error is left
	// as it is.
	failed := func(err error) error {
		if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("message %s: %w: %s: %w", m.MessageID, relay.ErrUnavailable, NoStreamHint(nm.Subject), err)
		}
		err = classify(err)
		var be *relay.BatchError
		if errors.As(err, &be) {
			return err
		}
		return fmt.Errorf("message %s: subject %q: %w", m.MessageID, nm.Subject, err)
	}
	f, err := p.js.PublishMsgAsync(nm, jetstream.WithMsgID(m.MessageID))
	if err != nil {
		return failed(err)
	}
	timer := time.NewTimer(p.cfg.AckTimeout)
	defer timer.Stop()
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		return failed(err)
	case err := <-denied:
		return fmt.Errorf("message %s: subject %q: %w", m.MessageID, nm.Subject, err)
	case <-ctx.Done():
		return &relay.BatchError{Err: ctx.Err()}
	case <-timer.C:
		return &relay.BatchError{Err: fmt.Errorf("no PubAck for %s within %s: %w", m.MessageID, p.cfg.AckTimeout, context.DeadlineExceeded)}
	}
}

// message builds the NATS message of m, or an error wrapping
// relay.ErrPermanent if m cannot be carried byte for byte.
func (p *Publisher) message(m *relay.Message) (*nats.Msg, error) {
	subject := p.cfg.Subject(*m)
	if !validSubject(subject) {
		return nil, fmt.Errorf("%w: message %s: subject %q is not a valid NATS subject", relay.ErrPermanent, m.MessageID, subject)
	}
	h := make(nats.Header, 8+len(m.Headers))
	set := func(k, v string) error {
		if !carried(v) {
			return fmt.Errorf("%w: message %s: header %q: value %q cannot be carried in NATS headers byte for byte", relay.ErrPermanent, m.MessageID, k, v)
		}
		h[k] = []string{v}
		return nil
	}
	for _, kv := range [...][2]string{
		{emit.HeaderMessageID, m.MessageID},
		{emit.HeaderEventType, m.EventType},
		{emit.HeaderAggregateType, m.AggregateType},
		{emit.HeaderAggregateID, m.AggregateID},
		{emit.HeaderContentType, m.ContentType},
		{emit.HeaderPartition, strconv.Itoa(m.Partition)},
		{emit.HeaderEpoch, strconv.FormatInt(m.Epoch, 10)},
	} {
		if err := set(kv[0], kv[1]); err != nil {
			return nil, err
		}
	}
	for k, v := range m.Headers {
		if !validHeaderName(k) || strings.HasPrefix(strings.ToLower(k), "nats-") {
			return nil, fmt.Errorf("%w: message %s: header name %q cannot be carried in NATS headers", relay.ErrPermanent, m.MessageID, k)
		}
		if err := set(k, v); err != nil {
			return nil, err
		}
	}
	data := m.Payload
	if data == nil {
		data = []byte{}
	}
	return &nats.Msg{Subject: subject, Header: h, Data: data}, nil
}

// carried reports whether NATS carries header value v unchanged: nats.go
// trims leading and trailing spaces and tabs and replaces CR and LF.
func carried(v string) bool {
	if strings.ContainsAny(v, "\r\n") {
		return false
	}
	return v == strings.Trim(v, " \t")
}

// validHeaderName is nats.go's header key rule: visible ASCII without
// "()/,:;<=>?@[\]{} and the double quote.
func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c < 0x21 || c > 0x7e || strings.IndexByte(`"()/,:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// validSubject reports whether s is a literal NATS subject: tokens
// separated by '.', none empty, none containing a wildcard, whitespace or
// a control character.
func validSubject(s string) bool {
	if s == "" {
		return false
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" || tok == "*" || tok == ">" {
			return false
		}
		for i := 0; i < len(tok); i++ {
			if c := tok[i]; c <= ' ' || c == 0x7f || c == '*' || c == '>' {
				return false
			}
		}
	}
	return true
}

// NoStreamHint returns the text of a publish to subject that no JetStream
// stream stores: it names the subject, says a mistyped Topic is one way
// out, and gives the commands that create a stream binding it. A subject
// with a dot is bound by its parent's wildcard (the last token is the
// aggregate's, see DefaultSubject): `outbox nats stream create --stream
// NAME --subject-prefix PARENT.` or the NATS CLI's `nats stream add NAME
// --subjects 'PARENT.>'`; one without, exactly. NAME is the first token,
// upper-cased. Publisher errors quote it.
func NoStreamHint(subject string) string {
	name := strings.ToUpper(strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, strings.SplitN(subject, ".", 2)[0]))
	hint := fmt.Sprintf("no JetStream stream stores subject %q: fix the event's Topic if it is mistyped, or create a stream that binds it: ", subject)
	if i := strings.LastIndexByte(subject, '.'); i > 0 {
		parent := subject[:i+1]
		return hint + fmt.Sprintf("`outbox nats stream create --stream %s --subject-prefix %s` (binds %s>) or `nats stream add %s --subjects '%s>'` or natspub.CreateStream",
			name, parent, parent, name, parent)
	}
	return hint + fmt.Sprintf("`nats stream add %s --subjects '%s'` or natspub.CreateStream", name, subject)
}

// classify maps a publish error to the relay's classes (see the package
// doc). Errors of the connection fail the batch (relay.BatchError).
func classify(err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return fmt.Errorf("%w: %w", relay.ErrPermanent, err)
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return fmt.Errorf("%w: %w", relay.ErrPermanent, err)
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("%w: no JetStream stream stores the subject (create one binding it: `outbox nats stream create`, natspub.CreateStream): %w", relay.ErrUnavailable, err)
	case errors.As(err, &apiErr) && (apiErr.Code == http.StatusForbidden || apiErr.Code == http.StatusNotFound):
		return fmt.Errorf("%w: %w", relay.ErrUnavailable, err)
	case errors.As(err, &apiErr) && apiErr.Code == http.StatusServiceUnavailable:
		// The stream is full (DiscardNew at MaxMsgs, MaxBytes or
		// MaxMsgsPerSubject: err_code 10077) or JetStream lacks resources:
		// the route's state, not the message's fault.
		return fmt.Errorf("%w: the stream refuses new messages: %w", relay.ErrUnavailable, err)
	case errors.As(err, &apiErr):
		return err // this message fails; the relay retries it
	}
	// The connection (closed, reconnecting, a timeout,
	// a stalled async publisher): the batch as a whole.
	return &relay.BatchError{Err: err}
}
