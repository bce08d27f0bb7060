// Package logmsg encodes the events of one transaction as the content of
// one transactional logical decoding message (PostgreSQL's
// pg_logical_emit_message), the log-only mode of package driver
// (driver.Config.LogOnly), and decodes it in the relay's WAL source.
//
// The format is ours and versioned: one version byte (1), the event count
// as an unsigned varint, then per event the string fields MessageID,
// AggregateType, AggregateID, EventType, Topic, ContentType and Headers
// (JSON, or empty for none), each as an unsigned varint length and its
// bytes, the payload the same way, and the relay partition as an unsigned
// varint. Decoding a message of another version fails with ErrVersion, so
// a relay older than its writers refuses their events instead of guessing.
package logmsg

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Version is the format version written by Encode.
const Version = 1

// ErrVersion is returned by Decode for a message of another format version.
var ErrVersion = errors.New("logmsg: unknown format version")

// ErrCorrupt is returned by Decode for a message cut short or with trailing bytes.
var ErrCorrupt = errors.New("logmsg: corrupt message")

// Event is one event as carried in a message.
type Event struct {
	MessageID, AggregateType, AggregateID, EventType, Topic, ContentType string
	// Headers is the headers' JSON object, or "" for none.
	Headers   string
	Payload   []byte
	Partition int
}

// Prefix returns the message prefix of the outbox table named table
// ("outbox:" and the table's name as configured): the relay reads the
// messages of its own table only.
func Prefix(table string) string { return "outbox:" + table }

// Encode appends the encoding of events to dst and returns it.
func Encode(dst []byte, events []Event) []byte {
	dst = append(dst, Version)
	dst = binary.AppendUvarint(dst, uint64(len(events)))
	for i := range events {
		e := &events[i]
		for _, s := range [...]string{e.MessageID, e.AggregateType, e.AggregateID, e.EventType, e.Topic, e.ContentType, e.Headers} {
			dst = binary.AppendUvarint(dst, uint64(len(s)))
			dst = append(dst, s...)
		}
		dst = binary.AppendUvarint(dst, uint64(len(e.Payload)))
		dst = append(dst, e.Payload...)
		dst = binary.AppendUvarint(dst, uint64(e.Partition))
	}
	return dst
}

// Size returns an upper bound of Encode's output for events, in bytes.
func Size(events []Event) int {
	n := 1 + binary.MaxVarintLen64
	for i := range events {
		e := &events[i]
		n += 9 * binary.MaxVarintLen64
		n += len(e.MessageID) + len(e.AggregateType) + len(e.AggregateID) + len(e.EventType) + len(e.Topic) + len(e.ContentType) + len(e.Headers) + len(e.Payload)
	}
	return n
}

// Decode returns the events encoded in src. The payloads alias src; the
// strings share one copy of src (one allocation per message, not seven
// per event), which stays alive while any of them does.
// Errors: ErrVersion, ErrCorrupt (wrapped with what was being read).
func Decode(src []byte) ([]Event, error) {
	if len(src) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrCorrupt)
	}
	if src[0] != Version {
		return nil, fmt.Errorf("%w %d (this relay reads %d)", ErrVersion, src[0], Version)
	}
	p := src[1:]
	count, n := binary.Uvarint(p)
	if n <= 0 || count > uint64(len(p)) {
		return nil, fmt.Errorf("%w: event count", ErrCorrupt)
	}
	p = p[n:]
	str := string(src)
	// next returns the next field's bounds in src.
	next := func() (from, to int, err error) {
		l, n := binary.Uvarint(p)
		if n <= 0 || l > uint64(len(p)-n) {
			return 0, 0, ErrCorrupt
		}
		from = len(src) - len(p) + n
		p = p[n+int(l):]
		return from, from + int(l), nil
	}
	out := make([]Event, count)
	for i := range out {
		var f [8][2]int
		for k := range f {
			from, to, err := next()
			if err != nil {
				return nil, fmt.Errorf("%w: event %d of %d, field %d", ErrCorrupt, i+1, count, k+1)
			}
			f[k] = [2]int{from, to}
		}
		part, n := binary.Uvarint(p)
		if n <= 0 || part > 1<<31-1 {
			return nil, fmt.Errorf("%w: event %d of %d, partition", ErrCorrupt, i+1, count)
		}
		p = p[n:]
		field := func(k int) string { return str[f[k][0]:f[k][1]] }
		out[i] = Event{MessageID: field(0), AggregateType: field(1), AggregateID: field(2), EventType: field(3),
			Topic: field(4), ContentType: field(5), Headers: field(6), Payload: src[f[7][0]:f[7][1]:f[7][1]], Partition: int(part)}
	}
	if len(p) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(p))
	}
	return out, nil
}
