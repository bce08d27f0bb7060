package emit

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Event is one domain event to publish. The zero value is not valid: set at
// least AggregateType, AggregateID, Type and Payload.
//
// The ordering unit is the pair (AggregateType, AggregateID): the relay
// first-delivers two events of one aggregate in the order of their outbox
// ids. The Kafka record key is AggregateID, so all events of an aggregate
// land in one Kafka partition.
type Event struct {
	// ID is the message ID consumers dedupe by. Empty: Emit assigns a
	// time-ordered UUIDv7 (RFC 9562). Set: 1 to MaxIDBytes bytes of visible
	// ASCII (0x21-0x7E), unique per transaction (ErrDuplicateID) and, through
	// the table's unique index, across transactions.
	ID string
	// AggregateType names the kind of aggregate ("order"). 1 to
	// MaxAggregateTypeBytes bytes of [A-Za-z0-9._-], so that the default
	// topic "outbox.event.<AggregateType>" is always a legal Kafka topic.
	AggregateType string
	// AggregateID identifies the aggregate instance; it is the Kafka key.
	// 1 to MaxAggregateIDBytes bytes of valid UTF-8 without control
	// characters, not beginning or ending with a space (it travels as a
	// header too, and NATS trims header values).
	AggregateID string
	// Type is the event type ("order.paid"). 1 to MaxTypeBytes bytes of valid
	// UTF-8 without control characters, not beginning or ending with a space.
	Type string
	// Payload is the record value, delivered byte for byte. With the default
	// ContentType it must be one valid JSON value (ErrPayloadNotJSON); key
	// order and spacing are kept as given.
	Payload []byte
	// ContentType of Payload, sent as the outbox-content-type header. Empty
	// means DefaultContentType. JSON content types (application/json or a
	// +json suffix, any case, with parameters) are validated as one UTF-8
	// JSON value. Any other value (e.g. "application/octet-stream",
	// "application/x-protobuf") accepts Payload as raw bytes, empty included. At most MaxContentTypeBytes of
	// visible ASCII or spaces, not beginning or ending with a space.
	ContentType string
	// Headers are added to the broker's message (Kafka record headers,
	// NATS headers) as given. Names: 1 to MaxHeaderNameBytes bytes of
	// visible ASCII without any of "()/,:;<=>?@[\]{} and the double quote
	// (NATS refuses them in header keys), not starting with
	// ReservedHeaderPrefix or BrokerHeaderPrefix in any case. Values: valid UTF-8 without CR or LF,
	// not beginning or ending with a space or tab (NATS headers are lines,
	// and their values are trimmed), empty allowed. Emit refuses the rest
	// with ErrInvalidHeader: what one supported broker cannot carry byte
	// for byte is refused for all, so that changing brokers never turns
	// stored rows into poison.
	Headers map[string]string
	// Topic overrides the relay's topic router for this event. Empty: the
	// router decides. Set: a legal Kafka topic name, 1 to 249 bytes of
	// [A-Za-z0-9._-], not "." or ".." (Kafka's Topic.validate).
	Topic string
}

// Field limits, in bytes. They keep every value inside its column and every
// record inside what Kafka accepts.
const (
	MaxIDBytes            = 128
	MaxAggregateTypeBytes = 200 // 249 (Kafka's topic limit) minus len("outbox.event."), rounded down
	MaxAggregateIDBytes   = 255
	MaxTypeBytes          = 255
	MaxContentTypeBytes   = 127
	MaxHeaderNameBytes    = 255
	MaxTopicBytes         = 249 // Kafka: org.apache.kafka.common.internals.Topic.MAX_NAME_LENGTH
)

// DefaultContentType is the content type assumed when Event.ContentType is
// empty; payloads of this type are validated as JSON.
const DefaultContentType = "application/json"

// ReservedHeaderPrefix starts every header the relay writes itself; user
// headers may not use it (compared case-insensitively).
const ReservedHeaderPrefix = "outbox-"

// BrokerHeaderPrefix starts the headers NATS JetStream acts on
// (Nats-Msg-Id, Nats-Expected-Stream, Nats-Expected-Last-Sequence, ...)
// instead of storing them as data; user headers must not start with it,
// in any case (ErrReservedHeader). relay/nats sets Nats-Msg-Id itself.
const BrokerHeaderPrefix = "Nats-"

// Headers the relay adds to every record. Their values come from the event,
// so no user header can override them.
const (
	HeaderMessageID     = "outbox-message-id"
	HeaderEventType     = "outbox-event-type"
	HeaderAggregateType = "outbox-aggregate-type"
	HeaderAggregateID   = "outbox-aggregate-id"
	HeaderContentType   = "outbox-content-type"
	// HeaderPartition and HeaderEpoch carry the relay partition and the
	// lease epoch (fencing token) under which the record was published.
	HeaderPartition = "outbox-partition"
	HeaderEpoch     = "outbox-epoch"
)

// Record size accounting, mirrored from Kafka's v2 record format and
// sarama's ProducerMessage.ByteSize (an upper bound of the encoded record).
const (
	// RecordBatchOverhead is the fixed v2 RecordBatch header (61 bytes,
	// Kafka's DefaultRecordBatch.RECORD_BATCH_OVERHEAD). A record alone in a
	// batch must fit the broker's message.max.bytes together with it.
	RecordBatchOverhead = 61
	// RecordOverhead is sarama's maximumRecordOverhead: 5 varint32 + 1
	// varint64 + attributes byte = 36 bytes, the largest a v2 record's own
	// framing can be.
	RecordOverhead = 36
	// HeaderOverhead is the largest framing of one header (two varint32 lengths).
	HeaderOverhead = 10
	// RelayHeaderReserve is room kept for the headers the relay adds beyond
	// the five above: outbox-partition (up to 4 digits) and outbox-epoch (up
	// to 19), with their framing: 16+4+10 + 12+19+10 = 71, rounded up.
	RelayHeaderReserve = 96
)

// RecordSize returns an upper bound, in bytes, of the Kafka record batch
// that carries ev alone: batch header, record framing, key (AggregateID),
// value (Payload), the relay's headers (including RelayHeaderReserve) and
// ev.Headers. Emit rejects an event whose RecordSize exceeds
// Limits.MaxRecordBytes, so a record Emit accepted can never be refused by
// a broker with the default message.max.bytes for its size. ev.ID and
// ev.ContentType should already be filled in (Emit does so first).
func RecordSize(ev *Event) int {
	n := RecordBatchOverhead + RecordOverhead + len(ev.AggregateID) + len(ev.Payload) + RelayHeaderReserve
	n += len(HeaderMessageID) + len(ev.ID) + HeaderOverhead
	n += len(HeaderEventType) + len(ev.Type) + HeaderOverhead
	n += len(HeaderAggregateType) + len(ev.AggregateType) + HeaderOverhead
	n += len(HeaderAggregateID) + len(ev.AggregateID) + HeaderOverhead
	ct := ev.ContentType
	if ct == "" {
		ct = DefaultContentType
	}
	n += len(HeaderContentType) + len(ct) + HeaderOverhead
	for k, v := range ev.Headers {
		n += len(k) + len(v) + HeaderOverhead
	}
	return n
}

// NewMessageID returns a new time-ordered UUIDv7 (RFC 9562) in its 36-byte
// string form, the ID Emit assigns when Event.ID is empty. Use it when the
// caller needs the ID before emitting. It returns an error only if the
// system's random source fails.
func NewMessageID() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// prepare validates ev against limits, fills ID and ContentType, copies the
// payload and headers (so later changes by the caller do not alter what is
// written) and returns the record size.
func prepare(ev *Event, limits Limits) (int, error) { return prepareOwned(ev, limits, false) }

// prepareOwned is prepare; owned says ev.Headers is already a private copy
// (built by Emit from a Capture), so it is not copied again.
func prepareOwned(ev *Event, limits Limits, owned bool) (int, error) {
	if ev.ID == "" {
		id, err := NewMessageID()
		if err != nil {
			// A failing random source is the system's fault, not the
			// caller's input: not a ValidationError.
			return 0, fmt.Errorf("outbox: generating a UUIDv7 message ID: %w", err)
		}
		ev.ID = id
	} else if len(ev.ID) > MaxIDBytes || !visibleASCII(ev.ID) {
		return 0, invalid("ID", ErrInvalidField, "want 1 to %d bytes of visible ASCII, got %d bytes", MaxIDBytes, len(ev.ID))
	}
	switch {
	case ev.AggregateType == "":
		return 0, invalid("AggregateType", ErrMissingField, "set the kind of aggregate, e.g. \"order\"")
	case len(ev.AggregateType) > MaxAggregateTypeBytes || !topicChars(ev.AggregateType):
		return 0, invalid("AggregateType", ErrInvalidField, "want 1 to %d bytes of [A-Za-z0-9._-], got %q", MaxAggregateTypeBytes, truncate(ev.AggregateType))
	case ev.AggregateID == "":
		return 0, invalid("AggregateID", ErrMissingField, "set the aggregate instance's ID")
	case len(ev.AggregateID) > MaxAggregateIDBytes || !cleanText(ev.AggregateID) || !untrimmed(ev.AggregateID):
		return 0, invalid("AggregateID", ErrInvalidField, "want 1 to %d bytes of UTF-8 without control characters, not beginning or ending with a space, got %d bytes", MaxAggregateIDBytes, len(ev.AggregateID))
	case ev.Type == "":
		return 0, invalid("Type", ErrMissingField, "set the event type, e.g. \"order.paid\"")
	case len(ev.Type) > MaxTypeBytes || !cleanText(ev.Type) || !untrimmed(ev.Type):
		return 0, invalid("Type", ErrInvalidField, "want 1 to %d bytes of UTF-8 without control characters, not beginning or ending with a space, got %d bytes", MaxTypeBytes, len(ev.Type))
	}
	if ev.Topic != "" && (len(ev.Topic) > MaxTopicBytes || !topicChars(ev.Topic) || ev.Topic == "." || ev.Topic == "..") {
		return 0, invalid("Topic", ErrInvalidField, "want a legal Kafka topic: 1 to %d bytes of [A-Za-z0-9._-], not \".\" or \"..\", got %q", MaxTopicBytes, truncate(ev.Topic))
	}
	if ev.ContentType == "" {
		ev.ContentType = DefaultContentType
	} else if len(ev.ContentType) > MaxContentTypeBytes || !printableASCII(ev.ContentType) || !untrimmed(ev.ContentType) {
		return 0, invalid("ContentType", ErrInvalidField, "want at most %d bytes of printable ASCII, not beginning or ending with a space", MaxContentTypeBytes)
	}
	if isJSON(ev.ContentType) && (!utf8.Valid(ev.Payload) || !json.Valid(ev.Payload)) {
		return 0, invalid("Payload", ErrPayloadNotJSON, "%d bytes of content type %s are not one valid UTF-8 JSON value (RFC 8259); emit raw bytes with a non-JSON ContentType", len(ev.Payload), ev.ContentType)
	}
	for k, v := range ev.Headers {
		if len(k) >= len(ReservedHeaderPrefix) && strings.EqualFold(k[:len(ReservedHeaderPrefix)], ReservedHeaderPrefix) {
			return 0, invalid(headerField(k), ErrReservedHeader, "names starting with %q are written by the relay", ReservedHeaderPrefix)
		}
		if len(k) >= len(BrokerHeaderPrefix) && strings.EqualFold(k[:len(BrokerHeaderPrefix)], BrokerHeaderPrefix) {
			return 0, invalid(headerField(k), ErrReservedHeader, "names starting with %q are instructions to NATS JetStream (Nats-Msg-Id, Nats-Expected-*), not data", BrokerHeaderPrefix)
		}
		if k == "" || len(k) > MaxHeaderNameBytes || !headerName(k) {
			return 0, invalid(headerField(k), ErrInvalidHeader, "name must be 1 to %d bytes of visible ASCII other than %s (what every supported broker's headers can carry)", MaxHeaderNameBytes, headerNameForbidden)
		}
		if !utf8.ValidString(v) {
			return 0, invalid(headerField(k), ErrInvalidHeader, "value is not valid UTF-8")
		}
		if strings.ContainsAny(v, "\r\n") || !untrimmed(v) {
			return 0, invalid(headerField(k), ErrInvalidHeader, "value must not contain CR or LF nor begin or end with a space or tab (NATS headers cannot carry them)")
		}
	}
	size := RecordSize(ev)
	if size > limits.MaxRecordBytes {
		return 0, invalid("", ErrRecordTooLarge, "record of %d bytes exceeds Limits.MaxRecordBytes %d (payload %d bytes)", size, limits.MaxRecordBytes, len(ev.Payload))
	}
	ev.Payload = append([]byte(nil), ev.Payload...)
	if ev.Headers != nil && !owned {
		h := make(map[string]string, len(ev.Headers))
		for k, v := range ev.Headers {
			h[k] = v
		}
		ev.Headers = h
	}
	return size, nil
}

// truncate shortens s to at most 40 bytes without splitting a character.
func truncate(s string) string {
	if len(s) <= 40 {
		return s
	}
	cut := 40
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// headerField names a header in errors, quoted so that control characters
// in a rejected name cannot break the log line.
func headerField(name string) string { return "Headers[" + strconv.Quote(truncate(name)) + "]" }

// isJSON reports whether a content type is JSON: application/json or any
// +json structured suffix (RFC 6839), ignoring case and parameters.
func isJSON(ct string) bool {
	base, _, _ := strings.Cut(ct, ";")
	base = strings.ToLower(strings.TrimSpace(base))
	return base == DefaultContentType || strings.HasSuffix(base, "+json")
}

func visibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func topicChars(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// headerNameForbidden are the visible ASCII characters a header name must
// not contain: NATS (ADR-4 and nats.go) refuses them in header keys, and
// ':' would end the name on the wire.
const headerNameForbidden = `"()/,:;<=>?@[\]{}`

// headerName reports whether s is a header name every supported broker
// carries byte for byte: visible ASCII (0x21 to 0x7e) without
// headerNameForbidden.
func headerName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x21 || c > 0x7e || strings.IndexByte(headerNameForbidden, c) >= 0 {
			return false
		}
	}
	return true
}

// untrimmed reports whether s neither begins nor ends with a space or a
// tab: NATS header values are trimmed of both on the wire, so such a value
// (or an aggregate ID, event type or content type, which travel as the
// relay's headers) would not arrive byte for byte.
func untrimmed(s string) bool {
	if s == "" {
		return true
	}
	first, last := s[0], s[len(s)-1]
	return first != ' ' && first != '\t' && last != ' ' && last != '\t'
}

// cleanText reports whether s is valid UTF-8 without control characters
// (C0, DEL, C1); NUL in particular is rejected by PostgreSQL text columns.
func cleanText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || (r >= 0x7f && r < 0xa0) {
			return false
		}
	}
	return true
}
