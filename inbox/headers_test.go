package inbox

import (
	"math/rand/v2"
	"reflect"
	"testing"
)

// TestHeadersRoundTrip: headers come back byte for byte (NUL, invalid
// UTF-8, empty values); empty and nil maps are NULL and come back nil.
func TestHeadersRoundTrip(t *testing.T) {
	t.Parallel()
	for name, h := range map[string]map[string]string{
		"Nil":    nil,
		"Empty":  {},
		"One":    {"outbox-message-id": "m-1"},
		"Binary": {"a\x00": "\xff\xfe\x00", "": "", "traceparent": "00-abc-def-01"},
	} {
		enc := encodeHeaders(h)
		if len(h) == 0 {
			if enc != nil {
				t.Fatalf("%s: encoded %v, want NULL", name, enc)
			}
			continue
		}
		got, err := decodeHeaders(enc.([]byte))
		if err != nil || !reflect.DeepEqual(got, h) {
			t.Fatalf("%s: %q, %v; want %q", name, got, err, h)
		}
	}
}

// TestDecodeHeadersCorrupt: corrupt bytes are an error, never a panic.
func TestDecodeHeadersCorrupt(t *testing.T) {
	t.Parallel()
	good := encodeHeaders(map[string]string{"k": "v", "key2": "value2"}).([]byte)
	for i := range good { // every truncation
		if _, err := decodeHeaders(good[:i]); i > 0 && err == nil {
			t.Fatalf("truncated to %d bytes: no error", i)
		}
	}
	if _, err := decodeHeaders(append(good[:len(good):len(good)], 0)); err == nil {
		t.Fatal("trailing byte: no error")
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 10000; i++ {
		b := make([]byte, r.IntN(40))
		for j := range b {
			b[j] = byte(r.UintN(256))
		}
		_, _ = decodeHeaders(b) // must not panic
	}
	huge := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}
	if _, err := decodeHeaders(huge); err == nil {
		t.Fatal("a count beyond the bytes: no error")
	}
}
