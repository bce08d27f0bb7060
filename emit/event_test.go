package emit

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/google/uuid"
)

// payloadMarker is put into the payload of every validation case; no error
// message may echo it (ValidationError.Reason never contains payload bytes).
const payloadMarker = "PAYLOAD-MARKER-Zq7x"

// validPayload is a valid JSON payload carrying payloadMarker.
var validPayload = []byte(`{"note":"` + payloadMarker + `","total":42}`)

// allSentinels are the specific sentinels a *ValidationError may carry.
var allSentinels = []error{
	ErrMissingField, ErrInvalidField, ErrPayloadNotJSON, ErrRecordTooLarge,
	ErrInvalidHeader, ErrReservedHeader, ErrDuplicateID,
}

// baseEvent returns a fresh, valid event.
func baseEvent() Event {
	return Event{
		AggregateType: "order",
		AggregateID:   "o-1",
		Type:          "order.paid",
		Payload:       append([]byte(nil), validPayload...),
	}
}

// checkRejected asserts err is a *ValidationError for field with sentinel,
// matching ErrInvalidEvent and no other sentinel, and not echoing payload
// bytes.
func checkRejected(t *testing.T, err error, field string, sentinel error) {
	t.Helper()
	if err == nil {
		t.Fatalf("accepted; want rejection on Field %q with %v", field, sentinel)
	}
	if !errors.Is(err, ErrInvalidEvent) {
		t.Errorf("errors.Is(%v, ErrInvalidEvent) = false", err)
	}
	if !errors.Is(err, sentinel) {
		t.Errorf("errors.Is(%v, %v) = false", err, sentinel)
	}
	for _, s := range allSentinels {
		if s != sentinel && errors.Is(err, s) {
			t.Errorf("error %v also matches unrelated sentinel %v", err, s)
		}
	}
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("errors.As(%T, *ValidationError) = false", err)
	}
	if ve.Field != field {
		t.Errorf("Field = %q, want %q (error: %v)", ve.Field, field, err)
	}
	if ve.Err != sentinel {
		t.Errorf("Err = %v, want %v", ve.Err, sentinel)
	}
	msg := err.Error()
	if strings.Contains(msg, payloadMarker) || strings.Contains(ve.Reason, payloadMarker) {
		t.Errorf("error message echoes payload bytes: %q", msg)
	}
	if !strings.HasPrefix(msg, "outbox: invalid event: ") {
		t.Errorf("message %q lacks the \"outbox: invalid event: \" prefix", msg)
	}
	if field != "" && !strings.Contains(msg, field) {
		t.Errorf("message %q does not name field %q", msg, field)
	}
	if ve.Reason == "" {
		t.Errorf("empty Reason in %v", err)
	}
}

func TestPrepareValidation(t *testing.T) {
	t.Parallel()

	rep := strings.Repeat
	bigJSON := []byte(`"` + payloadMarker + rep("a", DefaultMaxRecordBytes) + `"`)
	bigRaw := append([]byte(payloadMarker), make([]byte, DefaultMaxRecordBytes)...)
	allVisible := func() string {
		var b strings.Builder
		for c := byte(0x21); c <= 0x7e; c++ {
			b.WriteByte(c)
		}
		return b.String()
	}()
	euro85 := rep("€", 85) // 255 bytes, 85 runes

	type tc struct {
		name     string
		mod      func(*Event)
		limits   Limits // zero: defaults
		field    string // expected ValidationError.Field on rejection
		sentinel error  // nil: must be accepted
	}
	tests := []tc{
		// The base event itself.
		{name: "base/accepted", mod: func(*Event) {}},

		// ID.
		{name: "ID/empty generates", mod: func(e *Event) { e.ID = "" }},
		{name: "ID/max length accepted", mod: func(e *Event) { e.ID = rep("a", MaxIDBytes) }},
		{name: "ID/all visible ASCII accepted", mod: func(e *Event) { e.ID = allVisible }},
		{name: "ID/too long", mod: func(e *Event) { e.ID = rep("a", MaxIDBytes+1) }, field: "ID", sentinel: ErrInvalidField},
		{name: "ID/space", mod: func(e *Event) { e.ID = "msg 1" }, field: "ID", sentinel: ErrInvalidField},
		{name: "ID/only space", mod: func(e *Event) { e.ID = " " }, field: "ID", sentinel: ErrInvalidField},
		{name: "ID/tab", mod: func(e *Event) { e.ID = "msg\t1" }, field: "ID", sentinel: ErrInvalidField},
		{name: "ID/newline", mod: func(e *Event) { e.ID = "msg-1\n" }, field: "ID", sentinel: ErrInvalidField},
		{name: "ID/NUL", mod: func(e *Event) { e.ID = "msg\x001" }, field: "ID", sentinel: ErrInvalidField},
		{name: "ID/DEL", mod: func(e *Event) { e.ID = "msg\x7f" }, field: "ID", sentinel: ErrInvalidField},
		{name: "ID/non-ASCII UTF-8", mod: func(e *Event) { e.ID = "nachricht-ä" }, field: "ID", sentinel: ErrInvalidField},
		{name: "ID/invalid UTF-8", mod: func(e *Event) { e.ID = "id-\xff" }, field: "ID", sentinel: ErrInvalidField},

		// AggregateType.
		{name: "AggregateType/missing", mod: func(e *Event) { e.AggregateType = "" }, field: "AggregateType", sentinel: ErrMissingField},
		{name: "AggregateType/legal chars accepted", mod: func(e *Event) { e.AggregateType = "Order_2.v-1" }},
		{name: "AggregateType/dots accepted", mod: func(e *Event) { e.AggregateType = ".." }},
		{name: "AggregateType/max length accepted", mod: func(e *Event) { e.AggregateType = rep("t", MaxAggregateTypeBytes) }},
		{name: "AggregateType/too long", mod: func(e *Event) { e.AggregateType = rep("t", MaxAggregateTypeBytes+1) }, field: "AggregateType", sentinel: ErrInvalidField},
		{name: "AggregateType/slash", mod: func(e *Event) { e.AggregateType = "order/line" }, field: "AggregateType", sentinel: ErrInvalidField},
		{name: "AggregateType/space", mod: func(e *Event) { e.AggregateType = "order line" }, field: "AggregateType", sentinel: ErrInvalidField},
		{name: "AggregateType/colon", mod: func(e *Event) { e.AggregateType = "order:line" }, field: "AggregateType", sentinel: ErrInvalidField},
		{name: "AggregateType/plus", mod: func(e *Event) { e.AggregateType = "order+x" }, field: "AggregateType", sentinel: ErrInvalidField},
		{name: "AggregateType/non-ASCII", mod: func(e *Event) { e.AggregateType = "bestellüng" }, field: "AggregateType", sentinel: ErrInvalidField},
		{name: "AggregateType/NUL", mod: func(e *Event) { e.AggregateType = "order\x00" }, field: "AggregateType", sentinel: ErrInvalidField},
		{name: "AggregateType/invalid UTF-8", mod: func(e *Event) { e.AggregateType = "\xff" }, field: "AggregateType", sentinel: ErrInvalidField},

		// AggregateID.
		{name: "AggregateID/missing", mod: func(e *Event) { e.AggregateID = "" }, field: "AggregateID", sentinel: ErrMissingField},
		{name: "AggregateID/max length accepted", mod: func(e *Event) { e.AggregateID = rep("i", MaxAggregateIDBytes) }},
		{name: "AggregateID/max length multibyte accepted", mod: func(e *Event) { e.AggregateID = euro85 }},
		{name: "AggregateID/space NBSP emoji accepted", mod: func(e *Event) { e.AggregateID = "a b\u00a0c😀/é:#" }},
		{name: "AggregateID/too long", mod: func(e *Event) { e.AggregateID = rep("i", MaxAggregateIDBytes+1) }, field: "AggregateID", sentinel: ErrInvalidField},
		{name: "AggregateID/too long in bytes not runes", mod: func(e *Event) { e.AggregateID = euro85 + "a" }, field: "AggregateID", sentinel: ErrInvalidField},
		{name: "AggregateID/invalid UTF-8", mod: func(e *Event) { e.AggregateID = "o-\xff" }, field: "AggregateID", sentinel: ErrInvalidField},
		{name: "AggregateID/truncated UTF-8", mod: func(e *Event) { e.AggregateID = "o-\xc3" }, field: "AggregateID", sentinel: ErrInvalidField},
		{name: "AggregateID/surrogate", mod: func(e *Event) { e.AggregateID = "o-\xed\xa0\x80" }, field: "AggregateID", sentinel: ErrInvalidField},
		{name: "AggregateID/NUL", mod: func(e *Event) { e.AggregateID = "o\x001" }, field: "AggregateID", sentinel: ErrInvalidField},
		{name: "AggregateID/only NUL", mod: func(e *Event) { e.AggregateID = "\x00" }, field: "AggregateID", sentinel: ErrInvalidField},
		{name: "AggregateID/newline", mod: func(e *Event) { e.AggregateID = "o-1\n" }, field: "AggregateID", sentinel: ErrInvalidField},
		{name: "AggregateID/tab", mod: func(e *Event) { e.AggregateID = "o\t1" }, field: "AggregateID", sentinel: ErrInvalidField},
		{name: "AggregateID/unit separator", mod: func(e *Event) { e.AggregateID = "o\x1f1" }, field: "AggregateID", sentinel: ErrInvalidField},
		{name: "AggregateID/DEL", mod: func(e *Event) { e.AggregateID = "o\x7f" }, field: "AggregateID", sentinel: ErrInvalidField},
		{name: "AggregateID/C1 U+0080", mod: func(e *Event) { e.AggregateID = "o\u0080" }, field: "AggregateID", sentinel: ErrInvalidField},
		{name: "AggregateID/C1 NEL U+0085", mod: func(e *Event) { e.AggregateID = "o\u0085" }, field: "AggregateID", sentinel: ErrInvalidField},
		{name: "AggregateID/C1 U+009F", mod: func(e *Event) { e.AggregateID = "o\u009f" }, field: "AggregateID", sentinel: ErrInvalidField},

		// Type.
		{name: "Type/missing", mod: func(e *Event) { e.Type = "" }, field: "Type", sentinel: ErrMissingField},
		{name: "Type/max length accepted", mod: func(e *Event) { e.Type = rep("y", MaxTypeBytes) }},
		{name: "Type/max length multibyte accepted", mod: func(e *Event) { e.Type = euro85 }},
		{name: "Type/unicode and space accepted", mod: func(e *Event) { e.Type = "Bestellung bezahlt ✓" }},
		{name: "Type/too long", mod: func(e *Event) { e.Type = rep("y", MaxTypeBytes+1) }, field: "Type", sentinel: ErrInvalidField},
		{name: "Type/too long multibyte", mod: func(e *Event) { e.Type = euro85 + "€" }, field: "Type", sentinel: ErrInvalidField},
		{name: "Type/invalid UTF-8", mod: func(e *Event) { e.Type = "order.\xfe" }, field: "Type", sentinel: ErrInvalidField},
		{name: "Type/NUL", mod: func(e *Event) { e.Type = "order.paid\x00" }, field: "Type", sentinel: ErrInvalidField},
		{name: "Type/CR", mod: func(e *Event) { e.Type = "order.paid\r" }, field: "Type", sentinel: ErrInvalidField},
		{name: "Type/ESC", mod: func(e *Event) { e.Type = "\x1b[31morder" }, field: "Type", sentinel: ErrInvalidField},
		{name: "Type/DEL", mod: func(e *Event) { e.Type = "order\x7f" }, field: "Type", sentinel: ErrInvalidField},
		{name: "Type/C1", mod: func(e *Event) { e.Type = "order\u0090" }, field: "Type", sentinel: ErrInvalidField},

		// Topic.
		{name: "Topic/empty accepted", mod: func(e *Event) { e.Topic = "" }},
		{name: "Topic/simple accepted", mod: func(e *Event) { e.Topic = "orders" }},
		{name: "Topic/all legal chars accepted", mod: func(e *Event) { e.Topic = "Orders_EU.v-2" }},
		{name: "Topic/three dots accepted", mod: func(e *Event) { e.Topic = "..." }},
		{name: "Topic/leading dot accepted", mod: func(e *Event) { e.Topic = ".a" }},
		{name: "Topic/double dot inside accepted", mod: func(e *Event) { e.Topic = "a..b" }},
		{name: "Topic/underscore accepted", mod: func(e *Event) { e.Topic = "_" }},
		{name: "Topic/dash accepted", mod: func(e *Event) { e.Topic = "-" }},
		{name: "Topic/max length accepted", mod: func(e *Event) { e.Topic = rep("t", MaxTopicBytes) }},
		{name: "Topic/dot", mod: func(e *Event) { e.Topic = "." }, field: "Topic", sentinel: ErrInvalidField},
		{name: "Topic/dotdot", mod: func(e *Event) { e.Topic = ".." }, field: "Topic", sentinel: ErrInvalidField},
		{name: "Topic/250 bytes", mod: func(e *Event) { e.Topic = rep("t", 250) }, field: "Topic", sentinel: ErrInvalidField},
		{name: "Topic/slash", mod: func(e *Event) { e.Topic = "orders/eu" }, field: "Topic", sentinel: ErrInvalidField},
		{name: "Topic/space", mod: func(e *Event) { e.Topic = "orders eu" }, field: "Topic", sentinel: ErrInvalidField},
		{name: "Topic/star", mod: func(e *Event) { e.Topic = "orders*" }, field: "Topic", sentinel: ErrInvalidField},
		{name: "Topic/colon", mod: func(e *Event) { e.Topic = "orders:eu" }, field: "Topic", sentinel: ErrInvalidField},
		{name: "Topic/non-ASCII", mod: func(e *Event) { e.Topic = "tópico" }, field: "Topic", sentinel: ErrInvalidField},
		{name: "Topic/NUL", mod: func(e *Event) { e.Topic = "orders\x00" }, field: "Topic", sentinel: ErrInvalidField},

		// ContentType.
		{name: "ContentType/explicit default accepted", mod: func(e *Event) { e.ContentType = DefaultContentType }},
		{name: "ContentType/octet-stream accepted", mod: func(e *Event) { e.ContentType = "application/octet-stream" }},
		{name: "ContentType/with params and space accepted", mod: func(e *Event) { e.ContentType = "text/plain; charset=utf-8"; e.Payload = []byte("hi " + payloadMarker) }},
		{name: "ContentType/max length accepted", mod: func(e *Event) { e.ContentType = "x/" + rep("c", MaxContentTypeBytes-2) }},
		{name: "ContentType/too long", mod: func(e *Event) { e.ContentType = "x/" + rep("c", MaxContentTypeBytes-1) }, field: "ContentType", sentinel: ErrInvalidField},
		{name: "ContentType/newline", mod: func(e *Event) { e.ContentType = "application/json\n" }, field: "ContentType", sentinel: ErrInvalidField},
		{name: "ContentType/tab", mod: func(e *Event) { e.ContentType = "text/plain;\tq=1" }, field: "ContentType", sentinel: ErrInvalidField},
		{name: "ContentType/NUL", mod: func(e *Event) { e.ContentType = "text/plain\x00" }, field: "ContentType", sentinel: ErrInvalidField},
		{name: "ContentType/DEL", mod: func(e *Event) { e.ContentType = "text/plain\x7f" }, field: "ContentType", sentinel: ErrInvalidField},
		{name: "ContentType/non-ASCII", mod: func(e *Event) { e.ContentType = "text/plaïn" }, field: "ContentType", sentinel: ErrInvalidField},

		// Payload, default content type: one valid JSON value.
		{name: "Payload/JSON string accepted", mod: func(e *Event) { e.Payload = []byte(`"` + payloadMarker + `"`) }},
		{name: "Payload/JSON number accepted", mod: func(e *Event) { e.Payload = []byte(`-1.5e3`) }},
		{name: "Payload/JSON null accepted", mod: func(e *Event) { e.Payload = []byte(`null`) }},
		{name: "Payload/JSON array accepted", mod: func(e *Event) { e.Payload = []byte(`[]`) }},
		{name: "Payload/JSON surrounding whitespace accepted", mod: func(e *Event) { e.Payload = []byte(" \n{\"a\" : [1, 2]}\t\r\n") }},
		{name: "Payload/nil", mod: func(e *Event) { e.Payload = nil }, field: "Payload", sentinel: ErrPayloadNotJSON},
		{name: "Payload/empty", mod: func(e *Event) { e.Payload = []byte{} }, field: "Payload", sentinel: ErrPayloadNotJSON},
		{name: "Payload/whitespace only", mod: func(e *Event) { e.Payload = []byte(" \n ") }, field: "Payload", sentinel: ErrPayloadNotJSON},
		{name: "Payload/truncated", mod: func(e *Event) { e.Payload = []byte(`{"note":"` + payloadMarker) }, field: "Payload", sentinel: ErrPayloadNotJSON},
		{name: "Payload/truncated after colon", mod: func(e *Event) { e.Payload = []byte(`{"` + payloadMarker + `":`) }, field: "Payload", sentinel: ErrPayloadNotJSON},
		{name: "Payload/trailing garbage", mod: func(e *Event) { e.Payload = []byte(`{"note":"` + payloadMarker + `"}x`) }, field: "Payload", sentinel: ErrPayloadNotJSON},
		{name: "Payload/two values", mod: func(e *Event) { e.Payload = []byte(`{"m":"` + payloadMarker + `"} {}`) }, field: "Payload", sentinel: ErrPayloadNotJSON},
		{name: "Payload/trailing NUL", mod: func(e *Event) { e.Payload = append([]byte(`{"m":"`+payloadMarker+`"}`), 0) }, field: "Payload", sentinel: ErrPayloadNotJSON},
		{name: "Payload/bare word", mod: func(e *Event) { e.Payload = []byte(payloadMarker) }, field: "Payload", sentinel: ErrPayloadNotJSON},
		{name: "Payload/single quotes", mod: func(e *Event) { e.Payload = []byte(`{'m':'` + payloadMarker + `'}`) }, field: "Payload", sentinel: ErrPayloadNotJSON},
		{name: "Payload/BOM", mod: func(e *Event) { e.Payload = []byte("\ufeff{\"m\":\"" + payloadMarker + "\"}") }, field: "Payload", sentinel: ErrPayloadNotJSON},
		{name: "Payload/raw control char in string", mod: func(e *Event) { e.Payload = []byte("\"" + payloadMarker + "\x01\"") }, field: "Payload", sentinel: ErrPayloadNotJSON},
		{name: "Payload/explicit JSON content type validated", mod: func(e *Event) {
			e.ContentType = "application/json"
			e.Payload = []byte(`{"m":"` + payloadMarker)
		}, field: "Payload", sentinel: ErrPayloadNotJSON},

		// Payload, other content types: raw bytes, empty included.
		{name: "Payload/raw NUL and invalid UTF-8 accepted", mod: func(e *Event) {
			e.ContentType = "application/octet-stream"
			e.Payload = append([]byte{0x00, 0xff, 0xfe, 0x00, 0xc3}, payloadMarker...)
		}},
		{name: "Payload/raw nil accepted", mod: func(e *Event) { e.ContentType = "application/octet-stream"; e.Payload = nil }},
		{name: "Payload/raw empty accepted", mod: func(e *Event) { e.ContentType = "application/octet-stream"; e.Payload = []byte{} }},
		{name: "Payload/raw truncated JSON accepted", mod: func(e *Event) { e.ContentType = "application/x-protobuf"; e.Payload = []byte(`{"m":`) }},

		// Headers.
		{name: "Headers/nil accepted", mod: func(e *Event) { e.Headers = nil }},
		{name: "Headers/empty map accepted", mod: func(e *Event) { e.Headers = map[string]string{} }},
		{name: "Headers/ordinary accepted", mod: func(e *Event) {
			e.Headers = map[string]string{"trace-id": "abc", "Tenant": "ACME", "nihon": "日本 値", "e": "", "x.y_z~!#$%&'*+-^`|": "a b\tc: d"}
		}},
		{name: "Headers/outbox without dash accepted", mod: func(e *Event) { e.Headers = map[string]string{"outbox": "x"} }},
		{name: "Headers/outbox prefix without dash accepted", mod: func(e *Event) { e.Headers = map[string]string{"outboxes": "x"} }},
		{name: "Headers/outbox underscore accepted", mod: func(e *Event) { e.Headers = map[string]string{"outbox_x": "x"} }},
		{name: "Headers/outbox inside accepted", mod: func(e *Event) { e.Headers = map[string]string{"x-outbox-y": "x"} }},
		{name: "Headers/max name length accepted", mod: func(e *Event) { e.Headers = map[string]string{rep("h", MaxHeaderNameBytes): "x"} }},
		{name: "Headers/value with control chars accepted", mod: func(e *Event) { e.Headers = map[string]string{"v": "a\x00b\x7f\u0085"} }},
		// What NATS headers cannot carry is refused for every broker.
		{name: "Headers/value LF", mod: func(e *Event) { e.Headers = map[string]string{"v": "a\nb"} }, field: "Headers[v]", sentinel: ErrInvalidHeader},
		{name: "Headers/value CR", mod: func(e *Event) { e.Headers = map[string]string{"v": "a\rb"} }, field: "Headers[v]", sentinel: ErrInvalidHeader},
		{name: "Headers/value CRLF injection", mod: func(e *Event) { e.Headers = map[string]string{"v": "x\r\nNats-Msg-Id: forged"} }, field: "Headers[v]", sentinel: ErrInvalidHeader},
		{name: "Headers/value leading space", mod: func(e *Event) { e.Headers = map[string]string{"v": " a"} }, field: "Headers[v]", sentinel: ErrInvalidHeader},
		{name: "Headers/value trailing tab", mod: func(e *Event) { e.Headers = map[string]string{"v": "a\t"} }, field: "Headers[v]", sentinel: ErrInvalidHeader},
		{name: "Headers/value only a space", mod: func(e *Event) { e.Headers = map[string]string{"v": " "} }, field: "Headers[v]", sentinel: ErrInvalidHeader},
		{name: "Headers/NATS instruction", mod: func(e *Event) { e.Headers = map[string]string{"Nats-Msg-Id": "x"} }, field: "Headers[Nats-Msg-Id]", sentinel: ErrReservedHeader},
		{name: "Headers/NATS instruction lower case", mod: func(e *Event) { e.Headers = map[string]string{"nats-expected-stream": "x"} }, field: "Headers[nats-expected-stream]", sentinel: ErrReservedHeader},
		{name: "Headers/nats inside accepted", mod: func(e *Event) { e.Headers = map[string]string{"x-nats-y": "x", "natsy": "y"} }},
		{name: "Headers/name non-ASCII", mod: func(e *Event) { e.Headers = map[string]string{"日本": "v"} }, field: "Headers[日本]", sentinel: ErrInvalidHeader},
		{name: "Headers/name colon", mod: func(e *Event) { e.Headers = map[string]string{"a:b": "v"} }, field: "Headers[a:b]", sentinel: ErrInvalidHeader},
		{name: "Headers/name space", mod: func(e *Event) { e.Headers = map[string]string{"a b": "v"} }, field: "Headers[a b]", sentinel: ErrInvalidHeader},
		{name: "Headers/name slash", mod: func(e *Event) { e.Headers = map[string]string{"a/b": "v"} }, field: "Headers[a/b]", sentinel: ErrInvalidHeader},
		{name: "AggregateID/leading space", mod: func(e *Event) { e.AggregateID = " o-1" }, field: "AggregateID", sentinel: ErrInvalidField},
		{name: "AggregateID/inner space accepted", mod: func(e *Event) { e.AggregateID = "o 1" }},
		{name: "Type/trailing space", mod: func(e *Event) { e.Type = "order.paid " }, field: "Type", sentinel: ErrInvalidField},
		{name: "ContentType/trailing space", mod: func(e *Event) { e.ContentType = "text/plain " }, field: "ContentType", sentinel: ErrInvalidField},
		{name: "Headers/reserved lower", mod: func(e *Event) { e.Headers = map[string]string{"outbox-x": "v"} }, field: "Headers[outbox-x]", sentinel: ErrReservedHeader},
		{name: "Headers/reserved mixed case", mod: func(e *Event) { e.Headers = map[string]string{"OUTBOX-Message-Id": "v"} }, field: "Headers[OUTBOX-Message-Id]", sentinel: ErrReservedHeader},
		{name: "Headers/reserved prefix only", mod: func(e *Event) { e.Headers = map[string]string{"Outbox-": "v"} }, field: "Headers[Outbox-]", sentinel: ErrReservedHeader},
		{name: "Headers/reserved relay header", mod: func(e *Event) { e.Headers = map[string]string{HeaderContentType: "text/plain"} }, field: "Headers[outbox-content-type]", sentinel: ErrReservedHeader},
		{name: "Headers/reserved weird case", mod: func(e *Event) { e.Headers = map[string]string{"oUtBoX-aggregate-id": "o-2"} }, field: "Headers[oUtBoX-aggregate-id]", sentinel: ErrReservedHeader},
		{name: "Headers/reserved long name truncated in field", mod: func(e *Event) {
			e.Headers = map[string]string{"outbox-" + rep("z", 60): "v"}
		}, field: "Headers[outbox-" + rep("z", 33) + "...]", sentinel: ErrReservedHeader},
		{name: "Headers/empty name", mod: func(e *Event) { e.Headers = map[string]string{"": "v"} }, field: "Headers[]", sentinel: ErrInvalidHeader},
		{name: "Headers/name too long", mod: func(e *Event) {
			e.Headers = map[string]string{rep("h", MaxHeaderNameBytes+1): "v"}
		}, field: "Headers[" + rep("h", 40) + "...]", sentinel: ErrInvalidHeader},
		{name: "Headers/name NUL", mod: func(e *Event) { e.Headers = map[string]string{"a\x00b": "v"} }, field: "Headers[a\x00b]", sentinel: ErrInvalidHeader},
		{name: "Headers/name newline", mod: func(e *Event) { e.Headers = map[string]string{"a\nb": "v"} }, field: "Headers[a\nb]", sentinel: ErrInvalidHeader},
		{name: "Headers/name DEL", mod: func(e *Event) { e.Headers = map[string]string{"\x7f": "v"} }, field: "Headers[\x7f]", sentinel: ErrInvalidHeader},
		{name: "Headers/name C1", mod: func(e *Event) { e.Headers = map[string]string{"a\u0085": "v"} }, field: "Headers[a\u0085]", sentinel: ErrInvalidHeader},
		{name: "Headers/name invalid UTF-8", mod: func(e *Event) { e.Headers = map[string]string{"h\xff": "v"} }, field: "Headers[h\xff]", sentinel: ErrInvalidHeader},
		{name: "Headers/value invalid UTF-8", mod: func(e *Event) { e.Headers = map[string]string{"trace": "abc\xff"} }, field: "Headers[trace]", sentinel: ErrInvalidHeader},
		{name: "Headers/value truncated UTF-8", mod: func(e *Event) { e.Headers = map[string]string{"trace": "\xe2\x82"} }, field: "Headers[trace]", sentinel: ErrInvalidHeader},

		// Record as a whole.
		{name: "Record/too large JSON", mod: func(e *Event) { e.Payload = bigJSON }, field: "", sentinel: ErrRecordTooLarge},
		{name: "Record/too large raw", mod: func(e *Event) { e.ContentType = "application/octet-stream"; e.Payload = bigRaw }, field: "", sentinel: ErrRecordTooLarge},
		{name: "Record/too large by headers", mod: func(e *Event) {
			e.Headers = map[string]string{"blob": rep("b", DefaultMaxRecordBytes)}
		}, field: "", sentinel: ErrRecordTooLarge},
		{name: "Record/too large custom limit", mod: func(e *Event) {
			e.Payload = []byte(`"` + payloadMarker + rep("a", 500) + `"`)
		}, limits: Limits{MaxRecordBytes: 600}, field: "", sentinel: ErrRecordTooLarge},
		{name: "Record/fits custom limit", mod: func(e *Event) {
			e.Payload = []byte(`"` + payloadMarker + `"`)
		}, limits: Limits{MaxRecordBytes: 600}},
	}

	seen := make(map[string]bool)
	for _, tt := range tests {
		if seen[tt.name] {
			t.Fatalf("duplicate case name %q", tt.name)
		}
		seen[tt.name] = true
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ev := baseEvent()
			tt.mod(&ev)
			in := ev // what the caller passed
			inPayload := append([]byte(nil), ev.Payload...)
			size, err := prepare(&ev, tt.limits.WithDefaults())
			if tt.sentinel != nil {
				field := tt.field
				if inner, ok := strings.CutPrefix(field, "Headers["); ok {
					field = headerField(strings.TrimSuffix(strings.TrimSuffix(inner, "]"), "..."))
					if strings.HasSuffix(inner, "...]") { // the case names the truncated form
						field = "Headers[" + strconv.Quote(strings.TrimSuffix(inner, "]")) + "]"
					}
				}
				checkRejected(t, err, field, tt.sentinel)
				if size != 0 {
					t.Errorf("size = %d on rejection, want 0", size)
				}
				return
			}
			if err != nil {
				t.Fatalf("rejected valid event: %v", err)
			}
			checkAccepted(t, in, inPayload, &ev, size, tt.limits.WithDefaults())
		})
	}
}

// checkAccepted asserts what prepare guarantees for an accepted event: ID and
// ContentType filled, payload and headers equal to the input but copied, size
// equal to RecordSize and within limits.
func checkAccepted(t *testing.T, in Event, inPayload []byte, out *Event, size int, limits Limits) {
	t.Helper()
	if in.ID != "" && out.ID != in.ID {
		t.Errorf("ID changed from %q to %q", in.ID, out.ID)
	}
	if in.ID == "" {
		checkUUIDv7(t, out.ID)
	}
	wantCT := in.ContentType
	if wantCT == "" {
		wantCT = DefaultContentType
	}
	if out.ContentType != wantCT {
		t.Errorf("ContentType = %q, want %q", out.ContentType, wantCT)
	}
	if !bytes.Equal(out.Payload, inPayload) {
		t.Errorf("payload changed: got %d bytes, want %d", len(out.Payload), len(inPayload))
	}
	if len(in.Payload) > 0 && &out.Payload[0] == &in.Payload[0] {
		t.Errorf("payload not copied: aliases the caller's slice")
	}
	if len(out.Headers) != len(in.Headers) {
		t.Errorf("headers = %v, want %v", out.Headers, in.Headers)
	}
	for k, v := range in.Headers {
		if got, ok := out.Headers[k]; !ok || got != v {
			t.Errorf("header %q = %q, %v; want %q", k, got, ok, v)
		}
	}
	if in.AggregateType != out.AggregateType || in.AggregateID != out.AggregateID || in.Type != out.Type || in.Topic != out.Topic {
		t.Errorf("string fields changed: %+v -> %+v", in, *out)
	}
	if want := RecordSize(out); size != want {
		t.Errorf("prepare size = %d, RecordSize = %d", size, want)
	}
	if size > limits.MaxRecordBytes {
		t.Errorf("size %d exceeds MaxRecordBytes %d", size, limits.MaxRecordBytes)
	}
}

func checkUUIDv7(t *testing.T, id string) uuid.UUID {
	t.Helper()
	u, err := uuid.Parse(id)
	if err != nil {
		t.Fatalf("generated ID %q does not parse: %v", id, err)
	}
	if u.Version() != 7 {
		t.Errorf("ID %q has version %d, want 7", id, u.Version())
	}
	if u.Variant() != uuid.RFC4122 {
		t.Errorf("ID %q has variant %v, want RFC4122", id, u.Variant())
	}
	if u.String() != id || len(id) != 36 {
		t.Errorf("ID %q is not in canonical 36-byte form (%s)", id, u)
	}
	return u
}

// TestPrepareCopiesInput checks that prepare detaches the event from the
// caller's payload slice and header map.
func TestPrepareCopiesInput(t *testing.T) {
	t.Parallel()
	payload := make([]byte, 0, 64) // spare capacity: an append must not reach the copy
	payload = append(payload, `{"a":1}`...)
	headers := map[string]string{"k": "v"}
	ev := Event{AggregateType: "order", AggregateID: "o-1", Type: "t", Payload: payload, Headers: headers}
	if _, err := prepare(&ev, Limits{}.WithDefaults()); err != nil {
		t.Fatal(err)
	}
	payload[5] = '2'
	_ = append(payload, "garbage"...)
	headers["k"] = "changed"
	headers["new"] = "x"
	if string(ev.Payload) != `{"a":1}` {
		t.Errorf("payload = %q after caller mutation", ev.Payload)
	}
	if &ev.Payload[0] == &payload[0] {
		t.Errorf("payload copy shares the caller's backing array")
	}
	if len(ev.Headers) != 1 || ev.Headers["k"] != "v" {
		t.Errorf("headers = %v after caller mutation", ev.Headers)
	}
}

// errReader fails every read, standing in for a broken system random source.
type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("entropy source unavailable") }

// TestPrepareIDGenerationFailure covers prepare's only rejection path that
// does not depend on the event: the random source failing while generating a
// UUIDv7. That is the system's fault, so the error carries the cause and is
// not a ValidationError (callers must not treat it as bad input). Not parallel: uuid.SetRand is process-global (parallel tests only
// start after all sequential top-level tests have finished).
func TestPrepareIDGenerationFailure(t *testing.T) {
	uuid.SetRand(errReader{})
	defer uuid.SetRand(nil)

	ev := baseEvent()
	_, err := prepare(&ev, Limits{}.WithDefaults())
	var ve *ValidationError
	if err == nil || errors.Is(err, ErrInvalidEvent) || errors.As(err, &ve) {
		t.Errorf("random source failure = %v, want a non-validation error", err)
	}
	if err != nil && !strings.Contains(err.Error(), "entropy source unavailable") {
		t.Errorf("error %q does not carry the random source's error", err)
	}
	if _, err := NewMessageID(); err == nil {
		t.Errorf("NewMessageID succeeded with a failing random source")
	}

	// Through Emit: the batch stays empty and usable once randomness is back.
	ctx := NewContext(t.Context())
	b := FromContext(ctx).Begin(Limits{})
	if err := Emit(ctx, baseEvent()); err == nil || errors.Is(err, ErrInvalidEvent) {
		t.Fatalf("Emit with failing random source = %v, want a non-validation error", err)
	}
	if b.Len() != 0 {
		t.Fatalf("Len = %d after failed Emit", b.Len())
	}
	uuid.SetRand(nil)
	if err := Emit(ctx, baseEvent()); err != nil {
		t.Fatalf("Emit after random source recovered: %v", err)
	}
	if b.Len() != 1 {
		t.Fatalf("Len = %d, want 1", b.Len())
	}
}

func TestNewMessageID(t *testing.T) {
	t.Parallel()
	before := time.Now().Truncate(time.Millisecond)
	var prev string
	for i := 0; i < 1000; i++ {
		id, err := NewMessageID()
		if err != nil {
			t.Fatal(err)
		}
		u := checkUUIDv7(t, id)
		sec, nsec := u.Time().UnixTime()
		ts := time.Unix(sec, nsec)
		// Under heavy load the v7 sub-millisecond sequence may run slightly ahead.
		if ts.Before(before) || ts.After(time.Now().Add(time.Second)) {
			t.Fatalf("ID %q carries time %v, outside [%v, now]", id, ts, before)
		}
		if id <= prev {
			t.Fatalf("IDs not strictly increasing: %q after %q", id, prev)
		}
		prev = id
	}
}

func TestRecordSizeArithmetic(t *testing.T) {
	t.Parallel()
	ev := Event{
		ID:            "id-1",       // 4
		AggregateType: "order",      // 5
		AggregateID:   "o-1",        // 3, counted twice (key and header)
		Type:          "order.paid", // 10
		Payload:       []byte(`{"a":1}`),
		Headers:       map[string]string{"trace": "abc"},
	}
	const want = 61 + 36 + 3 + 7 + 96 + // batch, record framing, key, value, relay reserve
		(17 + 4 + 10) + // outbox-message-id
		(17 + 10 + 10) + // outbox-event-type
		(21 + 5 + 10) + // outbox-aggregate-type
		(19 + 3 + 10) + // outbox-aggregate-id
		(19 + 16 + 10) + // outbox-content-type: application/json
		(5 + 3 + 10) // trace: abc
	if want != 402 {
		t.Fatalf("test arithmetic: %d", want)
	}
	if got := RecordSize(&ev); got != want {
		t.Fatalf("RecordSize = %d, want %d", got, want)
	}
	// Header-name constants are what the arithmetic assumed.
	for name, n := range map[string]int{HeaderMessageID: 17, HeaderEventType: 17, HeaderAggregateType: 21, HeaderAggregateID: 19, HeaderContentType: 19} {
		if len(name) != n {
			t.Errorf("len(%q) = %d, want %d", name, len(name), n)
		}
	}

	// Empty ContentType counts as the default.
	ev2 := ev
	ev2.ContentType = DefaultContentType
	if RecordSize(&ev2) != want {
		t.Errorf("explicit default content type: %d, want %d", RecordSize(&ev2), want)
	}
	ev2.ContentType = "application/octet-stream" // 24 bytes, 8 more
	if got := RecordSize(&ev2); got != want+8 {
		t.Errorf("octet-stream: %d, want %d", got, want+8)
	}

	// Each component adds exactly its length.
	steps := []struct {
		name  string
		mod   func(*Event)
		delta int
	}{
		{"payload +1", func(e *Event) { e.Payload = []byte(`{"a":12}`) }, 1},
		{"aggregate ID +1 (key and header)", func(e *Event) { e.AggregateID = "o-12" }, 2},
		{"type +1", func(e *Event) { e.Type = "order.paidx" }, 1},
		{"aggregate type +1", func(e *Event) { e.AggregateType = "orders" }, 1},
		{"ID +1", func(e *Event) { e.ID = "id-12" }, 1},
		{"header added", func(e *Event) { e.Headers = map[string]string{"trace": "abc", "k": "vv"} }, 1 + 2 + HeaderOverhead},
		{"header removed", func(e *Event) { e.Headers = nil }, -(5 + 3 + HeaderOverhead)},
		{"empty-named header", func(e *Event) { e.Headers = map[string]string{"trace": "abc", "": ""} }, HeaderOverhead},
		{"topic is not in the record", func(e *Event) { e.Topic = "orders-eu" }, 0},
	}
	for _, s := range steps {
		e := ev
		s.mod(&e)
		if got := RecordSize(&e); got != want+s.delta {
			t.Errorf("%s: RecordSize = %d, want %d", s.name, got, want+s.delta)
		}
	}

	// prepare reports the same size.
	e := ev
	size, err := prepare(&e, Limits{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	if size != want {
		t.Errorf("prepare size = %d, want %d", size, want)
	}

	// A generated ID is 36 bytes.
	e = ev
	e.ID = ""
	size, err = prepare(&e, Limits{}.WithDefaults())
	if err != nil {
		t.Fatal(err)
	}
	if size != want-4+36 {
		t.Errorf("prepare size with generated ID = %d, want %d", size, want-4+36)
	}
}

// saramaMessage builds the message the Kafka publisher produces for ev
// (relay/kafka: key AggregateID, value Payload, the five outbox headers, then
// the event's headers).
func saramaMessage(ev *Event) *sarama.ProducerMessage {
	ct := ev.ContentType
	if ct == "" {
		ct = DefaultContentType
	}
	hs := []sarama.RecordHeader{
		{Key: []byte(HeaderMessageID), Value: []byte(ev.ID)},
		{Key: []byte(HeaderEventType), Value: []byte(ev.Type)},
		{Key: []byte(HeaderAggregateType), Value: []byte(ev.AggregateType)},
		{Key: []byte(HeaderAggregateID), Value: []byte(ev.AggregateID)},
		{Key: []byte(HeaderContentType), Value: []byte(ct)},
	}
	for k, v := range ev.Headers {
		hs = append(hs, sarama.RecordHeader{Key: []byte(k), Value: []byte(v)})
	}
	return &sarama.ProducerMessage{
		Topic:   "outbox.event." + ev.AggregateType,
		Key:     sarama.StringEncoder(ev.AggregateID),
		Value:   sarama.ByteEncoder(ev.Payload),
		Headers: hs,
	}
}

func varintLen(x int64) int {
	var buf [binary.MaxVarintLen64]byte
	return binary.PutVarint(buf[:], x)
}

// exactBatchSize is the encoded size of a Kafka v2 record batch holding msg
// alone, uncompressed, with the given timestamp delta: the 61-byte batch
// header, then the record (length varint, attributes, timestampDelta varlong,
// offsetDelta varint, key, value, header count and headers, lengths as
// zig-zag varints).
func exactBatchSize(t *testing.T, msg *sarama.ProducerMessage, tsDelta int64) int {
	t.Helper()
	key, err := msg.Key.Encode()
	if err != nil {
		t.Fatal(err)
	}
	value, err := msg.Value.Encode()
	if err != nil {
		t.Fatal(err)
	}
	body := 1 + varintLen(tsDelta) + varintLen(0) +
		varintLen(int64(len(key))) + len(key) +
		varintLen(int64(len(value))) + len(value) +
		varintLen(int64(len(msg.Headers)))
	for _, h := range msg.Headers {
		body += varintLen(int64(len(h.Key))) + len(h.Key) + varintLen(int64(len(h.Value))) + len(h.Value)
	}
	return RecordBatchOverhead + varintLen(int64(body)) + body
}

// checkConservative asserts RecordSize bounds what sarama checks and what the
// broker sees, leaving RelayHeaderReserve untouched.
func checkConservative(t *testing.T, ev *Event) {
	t.Helper()
	size := RecordSize(ev)
	msg := saramaMessage(ev)
	if bs := msg.ByteSize(2); size-RecordBatchOverhead-RelayHeaderReserve < bs {
		t.Errorf("RecordSize %d - %d - %d = %d < sarama ByteSize(2) %d",
			size, RecordBatchOverhead, RelayHeaderReserve, size-RecordBatchOverhead-RelayHeaderReserve, bs)
	}
	const worstTimestampDelta = 1<<63 - 1
	if exact := exactBatchSize(t, msg, worstTimestampDelta); exact > size-RelayHeaderReserve {
		t.Errorf("encoded v2 batch of %d bytes exceeds RecordSize %d - RelayHeaderReserve %d", exact, size, RelayHeaderReserve)
	}
}

// largestAccepted returns, for ev with Payload unset, the largest payload
// length prepare accepts under limits, computed from the documented record
// layout rather than from RecordSize.
func largestAccepted(ev *Event, maxRecord int) int {
	idLen := len(ev.ID)
	if idLen == 0 {
		idLen = 36
	}
	ct := ev.ContentType
	if ct == "" {
		ct = DefaultContentType
	}
	fixed := RecordBatchOverhead + RecordOverhead + RelayHeaderReserve + len(ev.AggregateID) +
		len(HeaderMessageID) + idLen + HeaderOverhead +
		len(HeaderEventType) + len(ev.Type) + HeaderOverhead +
		len(HeaderAggregateType) + len(ev.AggregateType) + HeaderOverhead +
		len(HeaderAggregateID) + len(ev.AggregateID) + HeaderOverhead +
		len(HeaderContentType) + len(ct) + HeaderOverhead
	for k, v := range ev.Headers {
		fixed += len(k) + len(v) + HeaderOverhead
	}
	return maxRecord - fixed
}

func jsonString(n int) []byte {
	p := bytes.Repeat([]byte("a"), n)
	p[0], p[n-1] = '"', '"'
	return p
}

func TestRecordSizeBoundary(t *testing.T) {
	t.Parallel()
	limits := Limits{}.WithDefaults()
	for _, gen := range []bool{false, true} {
		name := "supplied ID"
		if gen {
			name = "generated ID"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			base := Event{
				AggregateType: "order",
				AggregateID:   "ord-0042-ü",
				Type:          "order.paid",
				Headers:       map[string]string{"trace-id": "4bf92f3577b34da6", "tenant": "acme"},
			}
			if !gen {
				base.ID = "0190d8d2-7c1e-7000-8000-00000000abcd"
			}
			n := largestAccepted(&base, limits.MaxRecordBytes)
			if n < 1<<20-1024 {
				t.Fatalf("largest payload %d: fixed overhead unexpectedly large", n)
			}

			ev := base
			ev.Payload = jsonString(n)
			size, err := prepare(&ev, limits)
			if err != nil {
				t.Fatalf("largest JSON payload (%d bytes) rejected: %v", n, err)
			}
			if size != limits.MaxRecordBytes || RecordSize(&ev) != limits.MaxRecordBytes {
				t.Errorf("size = %d, RecordSize = %d, want exactly %d", size, RecordSize(&ev), limits.MaxRecordBytes)
			}
			if !json.Valid(ev.Payload) {
				t.Fatal("test payload is not JSON")
			}
			checkConservative(t, &ev)
			msg := saramaMessage(&ev)
			if bs, max := msg.ByteSize(2), sarama.NewConfig().Producer.MaxMessageBytes; bs > max {
				t.Errorf("largest accepted record: sarama ByteSize(2) %d > default Producer.MaxMessageBytes %d", bs, max)
			}
			if exact := exactBatchSize(t, msg, 1<<63-1); exact > DefaultMaxRecordBytes {
				t.Errorf("largest accepted record encodes to a %d-byte batch > broker default message.max.bytes %d", exact, DefaultMaxRecordBytes)
			}

			// One byte more is refused.
			ev = base
			ev.Payload = jsonString(n + 1)
			_, err = prepare(&ev, limits)
			checkRejected(t, err, "", ErrRecordTooLarge)

			// Same boundary for raw bytes.
			ev = base
			ev.ContentType = "application/octet-stream"
			nr := largestAccepted(&ev, limits.MaxRecordBytes)
			ev.Payload = make([]byte, nr)
			if _, err := prepare(&ev, limits); err != nil {
				t.Fatalf("largest raw payload (%d bytes) rejected: %v", nr, err)
			}
			ev = base
			ev.ContentType = "application/octet-stream"
			ev.Payload = make([]byte, nr+1)
			_, err = prepare(&ev, limits)
			checkRejected(t, err, "", ErrRecordTooLarge)
		})
	}

	t.Run("custom limit", func(t *testing.T) {
		t.Parallel()
		limits := Limits{MaxRecordBytes: 2000}.WithDefaults()
		base := Event{ID: "m-1", AggregateType: "a", AggregateID: "b", Type: "c"}
		n := largestAccepted(&base, limits.MaxRecordBytes)
		ev := base
		ev.Payload = jsonString(n)
		if size, err := prepare(&ev, limits); err != nil || size != 2000 {
			t.Fatalf("prepare(%d-byte payload) = %d, %v; want 2000, nil", n, size, err)
		}
		ev = base
		ev.Payload = jsonString(n + 1)
		_, err := prepare(&ev, limits)
		checkRejected(t, err, "", ErrRecordTooLarge)
	})
}

// TestRecordSizeConservativeVsSarama compares RecordSize with sarama's own
// size check and the exact v2 encoding over many random events.
func TestRecordSizeConservativeVsSarama(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	str := func(max int, alphabet string) string {
		n := 1 + r.IntN(max)
		b := make([]byte, n)
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		return string(b)
	}
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
	n, checked := 500, 0
	if testing.Short() {
		n = 50
	}
	for i := 0; i < n; i++ {
		ev := Event{
			AggregateType: str(MaxAggregateTypeBytes, letters),
			AggregateID:   str(MaxAggregateIDBytes, letters+" /:"),
			Type:          str(MaxTypeBytes, letters+" "),
			ContentType:   []string{"", "application/octet-stream", "application/x-protobuf"}[r.IntN(3)],
		}
		if r.IntN(2) == 0 {
			ev.ID = str(MaxIDBytes, letters)
		}
		size := 0
		switch r.IntN(3) {
		case 0:
			size = r.IntN(200)
		case 1:
			size = r.IntN(20000)
		case 2:
			size = r.IntN(1 << 20)
		}
		if ev.ContentType == "" {
			ev.Payload = jsonString(size + 2)
		} else {
			ev.Payload = make([]byte, size)
		}
		if nh := r.IntN(5); nh > 0 {
			ev.Headers = make(map[string]string, nh)
			for j := 0; j < nh; j++ {
				ev.Headers[str(300, letters)] = str(1000, letters)
			}
		}
		if _, err := prepare(&ev, Limits{}.WithDefaults()); err != nil {
			continue // e.g. too large or a header name over 255 bytes
		}
		checkConservative(t, &ev)
		checked++
	}
	if checked < n/4 {
		t.Fatalf("only %d of %d random events were accepted; the comparison is vacuous", checked, n)
	}
	t.Logf("compared %d accepted events", checked)
}

// TestValidationErrorFormat pins the documented Error/Unwrap behaviour.
func TestValidationErrorFormat(t *testing.T) {
	t.Parallel()
	e := &ValidationError{Field: "Type", Reason: "why", Err: ErrMissingField}
	if got, want := e.Error(), "outbox: invalid event: Type: required field is empty: why"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	e = &ValidationError{Reason: "why", Err: ErrRecordTooLarge}
	if got, want := e.Error(), "outbox: invalid event: record too large: why"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if !errors.Is(e, ErrInvalidEvent) || !errors.Is(e, ErrRecordTooLarge) || errors.Is(e, ErrMissingField) {
		t.Errorf("errors.Is matching wrong for %v", e)
	}
	wrapped := errors.Join(io.EOF, e)
	var ve *ValidationError
	if !errors.As(wrapped, &ve) || ve != e {
		t.Errorf("errors.As through a wrapper failed")
	}
}

// TestJSONContentTypes is the regression test for JSON validation that
// looked only at the exact string "application/json" and let invalid UTF-8
// inside JSON through.
func TestJSONContentTypes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		ct      string
		payload string
		ok      bool
	}{
		{"", `{"a":1}`, true},
		{"", "\"\xff\"", false},
		{"Application/JSON", `{`, false},
		{"application/json; charset=utf-8", `{`, false},
		{"application/cloudevents+json", `nope`, false},
		{"application/cloudevents+json", `{}`, true},
		{"text/plain", "\xff", true},
	} {
		ev := baseEvent()
		ev.ContentType, ev.Payload = c.ct, []byte(c.payload)
		_, err := prepare(&ev, Limits{}.WithDefaults())
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrPayloadNotJSON)) {
			t.Errorf("content type %q payload %q: err = %v, want ok=%v", c.ct, c.payload, err, c.ok)
		}
	}
}
