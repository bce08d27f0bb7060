package rabbitmq_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/testkit/e2e"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/rabbitmq"
	"github.com/sqloutbox/outbox/relay/rabbitmq/rabbitmqtest"
)

// repeatTo returns unit repeated and cut to n bytes.
func repeatTo(unit string, n int) string {
	return strings.Repeat(unit, n/len(unit)+1)[:n]
}

// The forms of the word after the type in a default routing key.
const (
	plainWord = "token"  // RoutingToken(ID)
	hexWord   = "hex"    // "~" + 64 hex digits
	b64Word   = "base64" // "~" + 43 base64url characters
)

// routingCases are aggregate types and IDs at and around the limits: the
// type's (emit.MaxAggregateTypeBytes, 200), the ID's
// (emit.MaxAggregateIDBytes, 255; up to 765 bytes as a token), the
// routing key's (255), and the type length above which the hex hash no
// longer fits (189).
var routingCases = []struct {
	name, typ, id string
	word          string // the form of the ID's word
	keyLen        int    // the key's length, 0: not checked
}{
	{"Short", "order", "o-17", plainWord, 10},
	{"TypeExtendedByDot", "order.v2", "o-17", plainWord, 13}, // "order.*" must not take it
	{"TokenFillsKey", "order", repeatTo("a", 249), plainWord, 255},
	{"TokenOneOver", "order", repeatTo("a", 250), hexWord, 71},
	{"WildcardsFillKey", "order", repeatTo("#*.", 83), plainWord, 255}, // 83 bytes, 249 encoded
	{"LongestID", "order", repeatTo("ü", 254) + "x", hexWord, 71},
	{"Type189LongID", repeatTo("t", 189), repeatTo("ü", 254) + "x", hexWord, 255},
	{"Type190LongID", repeatTo("t", 190), repeatTo("ü", 254) + "x", b64Word, 235},
	{"Type190ShortID", repeatTo("t", 190), "o-17", plainWord, 195},
	{"LongestTypeShortID", repeatTo("t", 200), "x", plainWord, 202},
	{"LongestTypeTokenFillsKey", repeatTo("t", 200), repeatTo("a", 54), plainWord, 255},
	{"LongestTypeTokenOneOver", repeatTo("t", 200), repeatTo("a", 55), b64Word, 245},
	{"LongestTypeLongestID", repeatTo("u", 200), repeatTo("ü", 254) + "x", b64Word, 245},
	{"LongestDottedTypeLongestID", repeatTo("ab.", 200), repeatTo("é", 254) + "y", b64Word, 245},
	{"LongestDottedTypeDottedID", repeatTo("ab.", 200), "a.b.c", plainWord, 210},
}

// checkKeyForm reports how key departs from the documented form: type,
// ".", one word of the given form, at most MaxRoutingKeyBytes in all.
func checkKeyForm(t *testing.T, key, typ, word string, keyLen int) {
	t.Helper()
	if len(key) > rabbitmq.MaxRoutingKeyBytes || keyLen != 0 && len(key) != keyLen {
		t.Errorf("key of %d bytes, want %d (at most %d)", len(key), keyLen, rabbitmq.MaxRoutingKeyBytes)
	}
	w, ok := strings.CutPrefix(key, typ+".")
	if !ok || strings.Contains(w, ".") || w == "" {
		t.Fatalf("key %q is not the type and one word", key)
	}
	isB64 := func(c rune) bool {
		return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_'
	}
	switch h, hashed := strings.CutPrefix(w, "~"); {
	case word == plainWord && hashed, word != plainWord && !hashed:
		t.Errorf("word %q, want a %s", w, word)
	case word == hexWord && (len(h) != 64 || strings.Trim(h, "0123456789abcdef") != ""):
		t.Errorf("word %q, want ~ and 64 hex digits", w)
	case word == b64Word && (len(h) != 43 || strings.IndexFunc(h, func(c rune) bool { return !isB64(c) }) >= 0):
		t.Errorf("word %q, want ~ and 43 base64url characters", w)
	}
}

// TestRoutingKeyForm (no broker): every default key is the aggregate type
// and one word, of the expected form and length, a function of type and
// ID alone, distinct for IDs differing in their last byte.
func TestRoutingKeyForm(t *testing.T) {
	t.Parallel()
	for _, tc := range routingCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := relay.Message{AggregateType: tc.typ, AggregateID: tc.id, MessageID: "a", Topic: "x", EventType: "e"}
			key := rabbitmq.DefaultRoutingKey(m)
			checkKeyForm(t, key, tc.typ, tc.word, tc.keyLen)
			if again := rabbitmq.DefaultRoutingKey(relay.Message{AggregateType: tc.typ, AggregateID: tc.id, MessageID: "b"}); again != key {
				t.Errorf("key %q for another message of the aggregate, want %q", again, key)
			}
			other := tc.id[:len(tc.id)-1] + "Z"
			if k := rabbitmq.DefaultRoutingKey(relay.Message{AggregateType: tc.typ, AggregateID: other}); k == key {
				t.Errorf("aggregates %q and %q share the key %q", tc.id, other, k)
			}
		})
	}
	// A type Emit refuses has no key that fits: Publish fails it with
	// relay.ErrPermanent rather than sending an unmatchable key.
	if k := rabbitmq.DefaultRoutingKey(relay.Message{AggregateType: repeatTo("t", 211), AggregateID: repeatTo("a", 100)}); len(k) <= rabbitmq.MaxRoutingKeyBytes {
		t.Errorf("a 211-byte type gave a key of %d bytes, want more than %d", len(k), rabbitmq.MaxRoutingKeyBytes)
	}
}

// TestRoutingKeyBindings: events of aggregate types and IDs at and around
// the limits, emitted (Emit accepts each; a type one byte over its limit
// is refused there, before any row exists), committed on SQLite and
// published by a running relay, reach the queue bound "<type>.*" for
// their type (the binding the package doc and README give), only that
// one, each aggregate in outbox id order, with the routing key
// DefaultRoutingKey gives. REGRESSION: a type over 189 bytes with a long
// ID got the key "~<sha256>", which no "<type>..." binding matches: the
// message came back unroutable and stayed pending, the relay reporting
// the route unavailable.
func TestRoutingKeyBindings(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, 120*time.Second)
	conn, ch := admin(t)
	ex, err := rabbitmqtest.DeclareExchange(ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.ExchangeDelete(ex, false, false) })
	consumers := map[string]*rabbitmqtest.Consumer{} // by aggregate type
	for _, tc := range routingCases {
		if consumers[tc.typ] != nil {
			continue
		}
		c, err := rabbitmqtest.NewConsumer(conn, ex, tc.typ+".*")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		consumers[tc.typ] = c
	}

	e := testdb.New(t, testdb.Target{Name: "sqlite", Dialect: driver.SQLite}, driver.Config{})
	var mu sync.Mutex
	var unavailable []error
	r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{
		Publisher:    newPublisher(t, rabbitmq.Config{URL: brokerURL(), Exchange: ex}),
		PollInterval: 50 * time.Millisecond, RetryInitial: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond,
		OnUnavailable: func(err error) {
			mu.Lock()
			unavailable = append(unavailable, err)
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	e2e.RunRelay(t, ctx, r)

	// Three events per case, interleaved over the cases, in one
	// transaction; a type over Emit's limit is refused there.
	const perCase = 3
	ids := map[string][]string{} // by aggregate type
	sctx := outbox.NewContext(ctx)
	tx, err := e.DB.BeginTx(sctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for n := range perCase {
		for i, tc := range routingCases {
			id := fmt.Sprintf("rk-%02d-%d-%s", i, n, unique())
			if err := outbox.Emit(sctx, outbox.Event{ID: id, AggregateType: tc.typ, AggregateID: tc.id,
				Type: "updated", Payload: fmt.Appendf(nil, "%q", id)}); err != nil {
				t.Fatalf("%s: Emit: %v", tc.name, err)
			}
			ids[tc.typ] = append(ids[tc.typ], id)
		}
	}
	tooLong := repeatTo("t", emit.MaxAggregateTypeBytes+1)
	if err := outbox.Emit(sctx, outbox.Event{AggregateType: tooLong, AggregateID: "x", Type: "updated", Payload: []byte("{}")}); !errors.Is(err, emit.ErrInvalidField) {
		t.Errorf("Emit with a %d-byte aggregate type = %v, want ErrInvalidField", len(tooLong), err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	// Every type's queue gets its events, unless the relay reports a
	// route unavailable first (a key no binding matches).
	delivered := func() bool {
		for typ, want := range ids {
			if len(consumers[typ].Records()) < len(want) {
				return false
			}
		}
		return true
	}
	testdb.Eventually(t, ctx, "every event in its type's queue, or a route reported unavailable", func() bool {
		mu.Lock()
		n := len(unavailable)
		mu.Unlock()
		return n > 0 || delivered()
	})
	mu.Lock()
	if len(unavailable) > 0 {
		err := unavailable[0]
		mu.Unlock()
		t.Fatalf("the relay reported a route unavailable: %v", err)
	}
	mu.Unlock()

	rows := outboxRows(t, ctx, e)
	for _, tc := range routingCases {
		t.Run(tc.name, func(t *testing.T) {
			c := consumers[tc.typ]
			recs, err := c.WaitForMessageIDs(ctx, ids[tc.typ]...)
			if err != nil {
				t.Fatal(err)
			}
			var mine []outboxtest.Row
			for _, row := range rows {
				if row.AggregateType == tc.typ {
					mine = append(mine, row)
				}
			}
			// Only this type's events, every one, each aggregate in order.
			if err := rabbitmqtest.Check(mine, recs).Err(); err != nil {
				t.Error(err)
			}
			want := rabbitmq.DefaultRoutingKey(relay.Message{AggregateType: tc.typ, AggregateID: tc.id})
			checkKeyForm(t, want, tc.typ, tc.word, tc.keyLen)
			n := 0
			for _, rec := range recs {
				if rec.Headers[emit.HeaderAggregateID] != tc.id {
					continue
				}
				n++
				if rec.RoutingKey != want {
					t.Errorf("%s: routing key %q, want %q", rec.Delivery.MessageId, rec.RoutingKey, want)
				}
			}
			if n < perCase {
				t.Errorf("%d of the aggregate's %d events in the %q queue", n, perCase, tc.typ+".*")
			}
		})
	}
}
