package emit

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// The oracle below restates the documented field rules in different terms
// than event.go, so that the fuzzer checks prepare against the contract, not
// against a copy of itself.

func oracleID(s string) bool { // 1 to 128 bytes of visible ASCII
	if len(s) < 1 || len(s) > MaxIDBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf || s[i] == ' ' || !unicode.IsPrint(rune(s[i])) {
			return false
		}
	}
	return true
}

const topicAlphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"

func oracleTopicChars(s string, max int) bool {
	return len(s) >= 1 && len(s) <= max && strings.Trim(s, topicAlphabet) == ""
}

func oracleText(s string, max int) bool { // 1 to max bytes of UTF-8 without C0, DEL, C1
	return len(s) >= 1 && len(s) <= max && utf8.ValidString(s) && !strings.ContainsFunc(s, unicode.IsControl)
}

func oracleContentType(s string) bool { // at most 127 bytes of visible ASCII or space
	if len(s) > MaxContentTypeBytes {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf || !unicode.IsPrint(rune(s[i])) {
			return false
		}
	}
	return true
}

// oracleUntrimmed: NATS trims spaces and tabs off both ends of a header
// value, so nothing that travels as one may have them there.
func oracleUntrimmed(s string) bool {
	return strings.TrimLeft(s, " \t") == s && strings.TrimRight(s, " \t") == s
}

// oracleHeaderName: NATS header keys are printable ASCII from '!' to '~'
// except the characters nats.go forbids.
func oracleHeaderName(s string) bool {
	if len(s) < 1 || len(s) > MaxHeaderNameBytes {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r > '~' || strings.ContainsRune(`"()/,:;<=>?@[\]{}`, r) {
			return false
		}
	}
	return true
}

type violation struct {
	field    string
	sentinel error
}

// oracleViolations lists every rule ev breaks (ev as given by the caller;
// headers limited to the names in it) and the record size it would have.
func oracleViolations(ev Event, maxRecord int) ([]violation, int) {
	var v []violation
	add := func(f string, s error) { v = append(v, violation{f, s}) }
	idLen := 36
	if ev.ID != "" {
		idLen = len(ev.ID)
		if !oracleID(ev.ID) {
			add("ID", ErrInvalidField)
		}
	}
	if ev.AggregateType == "" {
		add("AggregateType", ErrMissingField)
	} else if !oracleTopicChars(ev.AggregateType, MaxAggregateTypeBytes) {
		add("AggregateType", ErrInvalidField)
	}
	if ev.AggregateID == "" {
		add("AggregateID", ErrMissingField)
	} else if !oracleText(ev.AggregateID, MaxAggregateIDBytes) || !oracleUntrimmed(ev.AggregateID) {
		add("AggregateID", ErrInvalidField)
	}
	if ev.Type == "" {
		add("Type", ErrMissingField)
	} else if !oracleText(ev.Type, MaxTypeBytes) || !oracleUntrimmed(ev.Type) {
		add("Type", ErrInvalidField)
	}
	if ev.Topic != "" && (!oracleTopicChars(ev.Topic, MaxTopicBytes) || ev.Topic == "." || ev.Topic == "..") {
		add("Topic", ErrInvalidField)
	}
	ct := ev.ContentType
	if ct == "" {
		ct = DefaultContentType
	}
	if !oracleContentType(ct) || !oracleUntrimmed(ct) {
		add("ContentType", ErrInvalidField)
	} else if ct == DefaultContentType && !json.Valid(ev.Payload) {
		add("Payload", ErrPayloadNotJSON)
	}
	size := 61 + 36 + 96 + 2*len(ev.AggregateID) + len(ev.Payload) +
		(17 + idLen + 10) + (17 + len(ev.Type) + 10) + (21 + len(ev.AggregateType) + 10) +
		(19 + 10) + (19 + len(ct) + 10)
	for k, val := range ev.Headers {
		size += len(k) + len(val) + 10
		field := headerField(k)
		if strings.HasPrefix(strings.ToLower(k), "outbox-") || strings.HasPrefix(strings.ToLower(k), "nats-") {
			add(field, ErrReservedHeader)
		}
		if !oracleHeaderName(k) || !utf8.ValidString(val) || strings.ContainsAny(val, "\r\n") || !oracleUntrimmed(val) {
			add(field, ErrInvalidHeader)
		}
	}
	if size > maxRecord {
		add("", ErrRecordTooLarge)
	}
	return v, size
}

func FuzzPrepare(f *testing.F) {
	type seed struct {
		id, aggType, aggID, typ, topic, ct string
		payload                            []byte
		hk, hv                             string
		small                              bool
	}
	seeds := []seed{
		{"", "order", "o-1", "order.paid", "", "", []byte(`{"total":42}`), "", "", false},
		{"m-1", "order", "o-1", "order.paid", "orders", "application/json", []byte(`[1,2,3]`), "trace-id", "abc", false},
		{"", "order", "o-1", "order.paid", "", "application/octet-stream", []byte{0, 0xff, 0xfe}, "", "", false},
		{"", "order", "o-1", "order.paid", "", "", []byte(`{"a":`), "", "", false},
		{"", "order", "o-1", "order.paid", "", "", nil, "", "", false},
		{"", "order", "o-1", "order.paid", "", "", []byte(`{}x`), "", "", false},
		{"has space", "order", "o-1", "order.paid", "", "", []byte(`1`), "", "", false},
		{"", "or/der", "o-1", "t", "", "", []byte(`1`), "", "", false},
		{"", "order", "o\x00", "t", "", "", []byte(`1`), "", "", false},
		{"", "order", "o\xff", "t", "", "", []byte(`1`), "", "", false},
		{"", "order", "o", "t\u0085", "", "", []byte(`1`), "", "", false},
		{"", "order", "o", "t", ".", "", []byte(`1`), "", "", false},
		{"", "order", "o", "t", "..", "", []byte(`1`), "", "", false},
		{"", "order", "o", "t", "...", "", []byte(`1`), "", "", false},
		{"", "order", "o", "t", strings.Repeat("x", 250), "", []byte(`1`), "", "", false},
		{"", "order", "o", "t", "", "text/\x01", []byte(`1`), "", "", false},
		{"", "order", "o", "t", "", "", []byte(`1`), "OUTBOX-Message-Id", "x", false},
		{"", "order", "o", "t", "", "", []byte(`1`), "outbox-", "x", false},
		{"", "order", "o", "t", "", "", []byte(`1`), "", "value", false},
		{"", "order", "o", "t", "", "", []byte(`1`), "h\n", "v", false},
		{"", "order", "o", "t", "", "", []byte(`1`), "h", "\xff", false},
		{"", "order", "o", "t", "", "", []byte(`1`), "h", "a\r\nb", false},
		{"", "order", "o", "t", "", "", []byte(`1`), "h", " a", false},
		{"", "order", "o", "t", "", "", []byte(`1`), "a:b", "v", false},
		{"", "order", "o", "t", "", "", []byte(`1`), "Nats-Msg-Id", "v", false},
		{"", "order", " o", "t", "", "", []byte(`1`), "", "", false},
		{"", "order", "o", "t ", "", "", []byte(`1`), "", "", false},
		{"", "order", "o", "t", "", "", []byte(`"` + strings.Repeat("a", 700) + `"`), "", "", true},
		{"", "order", "o", "t", "", "x/y", bytes.Repeat([]byte{0}, 2000), "", "", true},
		{"", "", "", "", "", "", nil, "", "", false},
	}
	for _, s := range seeds {
		f.Add(s.id, s.aggType, s.aggID, s.typ, s.topic, s.ct, s.payload, s.hk, s.hv, s.small)
	}

	f.Fuzz(func(t *testing.T, id, aggType, aggID, typ, topic, ct string, payload []byte, hk, hv string, small bool) {
		limits := Limits{}.WithDefaults()
		if small {
			limits.MaxRecordBytes = 1024
		}
		in := Event{ID: id, AggregateType: aggType, AggregateID: aggID, Type: typ, Topic: topic, ContentType: ct, Payload: payload}
		if hk != "" || hv != "" {
			in.Headers = map[string]string{hk: hv}
		}
		want, wantSize := oracleViolations(in, limits.MaxRecordBytes)
		inPayload := bytes.Clone(payload)

		ev := in
		size, err := prepare(&ev, limits) // must not panic

		if err != nil {
			var ve *ValidationError
			if !errors.As(err, &ve) || !errors.Is(err, ErrInvalidEvent) || !errors.Is(err, ve.Err) {
				t.Fatalf("rejection %v is not a *ValidationError matching ErrInvalidEvent", err)
			}
			if size != 0 {
				t.Errorf("size %d on rejection", size)
			}
			if len(want) == 0 {
				t.Fatalf("rejected an event the contract accepts: %v\nevent: %+q", err, in)
			}
			for _, w := range want {
				if w.field == ve.Field && w.sentinel == ve.Err {
					return
				}
			}
			t.Fatalf("rejected with (%q, %v); the contract's violations are %v", ve.Field, ve.Err, want)
		}
		if len(want) > 0 {
			t.Fatalf("accepted an event breaking %v\nevent: %+q", want, in)
		}

		// Invariants of every accepted event.
		if size != RecordSize(&ev) || size != wantSize {
			t.Errorf("size = %d, RecordSize = %d, contract = %d", size, RecordSize(&ev), wantSize)
		}
		if size > limits.MaxRecordBytes {
			t.Errorf("accepted record of %d bytes > MaxRecordBytes %d", size, limits.MaxRecordBytes)
		}
		if ev.ContentType == "" {
			t.Errorf("ContentType not filled in")
		}
		if ev.ContentType == DefaultContentType && !json.Valid(ev.Payload) {
			t.Errorf("accepted non-JSON payload with the default content type")
		}
		for k := range ev.Headers {
			if len(k) >= len(ReservedHeaderPrefix) && strings.EqualFold(k[:len(ReservedHeaderPrefix)], ReservedHeaderPrefix) {
				t.Errorf("accepted reserved header %q", k)
			}
		}
		if !bytes.Equal(ev.Payload, inPayload) {
			t.Errorf("payload bytes changed")
		}
		if len(payload) > 0 && &ev.Payload[0] == &payload[0] {
			t.Errorf("payload not copied")
		}
		if id != "" && ev.ID != id {
			t.Errorf("supplied ID %q replaced by %q", id, ev.ID)
		}
		if id == "" && !oracleID(ev.ID) {
			t.Errorf("generated ID %q is not a valid ID", ev.ID)
		}
		if len(ev.Headers) != len(in.Headers) || (in.Headers != nil && ev.Headers[hk] != hv) {
			t.Errorf("headers changed: %q -> %q", in.Headers, ev.Headers)
		}
	})
}
