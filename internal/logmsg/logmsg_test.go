package logmsg

import (
	"errors"
	"reflect"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	cases := map[string][]Event{
		"none": {},
		"one":  {{MessageID: "m1", AggregateType: "order", AggregateID: "42", EventType: "created", ContentType: "application/json", Payload: []byte(`{"a":1}`), Partition: 7}},
		"many": {
			{MessageID: "m1", AggregateType: "order", AggregateID: "42", EventType: "created", Topic: "orders", ContentType: "x", Headers: `{"traceparent":"00-1"}`, Payload: []byte{}, Partition: 0},
			{MessageID: "m2", AggregateType: "ö", AggregateID: string(make([]byte, 300)), EventType: "e", ContentType: "y", Payload: make([]byte, 70000), Partition: 1<<31 - 1},
		},
	}
	for name, events := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := Encode(nil, events)
			if len(b) > Size(events) {
				t.Fatalf("Size %d < encoded %d", Size(events), len(b))
			}
			got, err := Decode(b)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(events) {
				t.Fatalf("got %d events, want %d", len(got), len(events))
			}
			for i := range events {
				want := events[i]
				if want.Payload == nil {
					want.Payload = []byte{}
				}
				if !reflect.DeepEqual(got[i], want) {
					t.Fatalf("event %d: got %+v, want %+v", i, got[i], want)
				}
			}
		})
	}
}

func TestDecodeRefuses(t *testing.T) {
	t.Parallel()
	good := Encode(nil, []Event{{MessageID: "m", AggregateType: "a", AggregateID: "1", EventType: "e", ContentType: "c", Payload: []byte("p"), Partition: 3}})
	cases := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrCorrupt},
		{"version", append([]byte{2}, good[1:]...), ErrVersion},
		{"cut", good[:len(good)-2], ErrCorrupt},
		{"trailing", append(append([]byte{}, good...), 0), ErrCorrupt},
		{"huge count", []byte{1, 0xff, 0xff, 0xff, 0x0f}, ErrCorrupt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if _, err := Decode(c.in); !errors.Is(err, c.want) {
				t.Fatalf("Decode: %v, want %v", err, c.want)
			}
		})
	}
}

// TestDecodeCopiesStrings: the strings outlive src (the replication
// connection reuses its buffer), and a payload appended to does not
// overwrite the bytes after it.
func TestDecodeCopiesStrings(t *testing.T) {
	t.Parallel()
	events := []Event{
		{MessageID: "m1", AggregateType: "order", AggregateID: "42", EventType: "created", Payload: []byte("ab"), Partition: 3},
		{MessageID: "m2", AggregateType: "order", AggregateID: "43", EventType: "paid", Payload: []byte("cd"), Partition: 4},
	}
	src := Encode(nil, events)
	got, err := Decode(src)
	if err != nil {
		t.Fatal(err)
	}
	_ = append(got[0].Payload, "XXXXXXXX"...)
	if string(got[1].Payload) != "cd" || got[1].MessageID != "m2" {
		t.Fatalf("an append to payload 1 overwrote event 2: %+v", got[1])
	}
	for i := range src {
		src[i] = 'Z'
	}
	if got[0].MessageID != "m1" || got[1].AggregateID != "43" || got[1].EventType != "paid" {
		t.Fatalf("strings changed with src: %+v", got)
	}
}
