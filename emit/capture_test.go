package emit

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
)

type traceKey struct{}

// traceCapture captures the string under traceKey in ctx as "traceparent".
func traceCapture(ctx context.Context, _ map[string]string) map[string]string {
	v, _ := ctx.Value(traceKey{}).(string)
	if v == "" {
		return nil
	}
	return map[string]string{"traceparent": v, "tracestate": "k=v"}
}

func TestCapture(t *testing.T) {
	t.Parallel()
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	begin := func(t *testing.T, limits Limits, c Capture) (context.Context, *Batch) {
		t.Helper()
		ctx := NewContext(context.WithValue(context.Background(), traceKey{}, tp))
		return ctx, FromContext(ctx).BeginWith(limits, c)
	}

	t.Run("AddsHeadersAndCountsThem", func(t *testing.T) {
		t.Parallel()
		ctx, b := begin(t, Limits{}, traceCapture)
		e := ev("m-1")
		mustEmit(t, ctx, e)
		got := b.Take()[0]
		want := map[string]string{"traceparent": tp, "tracestate": "k=v"}
		if !maps.Equal(got.Headers, want) {
			t.Fatalf("headers %v, want %v", got.Headers, want)
		}
		if b.bytes != RecordSize(&got) {
			t.Errorf("batch bytes %d, want RecordSize with the captured headers %d", b.bytes, RecordSize(&got))
		}
	})

	t.Run("ApplicationHeaderWins", func(t *testing.T) {
		t.Parallel()
		ctx, b := begin(t, Limits{}, traceCapture)
		e := ev("m-1")
		app := map[string]string{"traceparent": "mine", "x": "y"}
		e.Headers = app
		mustEmit(t, ctx, e)
		got := b.Take()[0]
		want := map[string]string{"traceparent": "mine", "tracestate": "k=v", "x": "y"}
		if !maps.Equal(got.Headers, want) {
			t.Fatalf("headers %v, want %v", got.Headers, want)
		}
		if len(app) != 2 || app["traceparent"] != "mine" {
			t.Errorf("the caller's map was modified: %v", app)
		}
		got.Headers["x"] = "changed"
		if app["x"] != "y" {
			t.Error("the buffered headers share the caller's map")
		}
	})

	t.Run("SeesApplicationHeaders", func(t *testing.T) {
		t.Parallel()
		var seen map[string]string
		ctx, b := begin(t, Limits{}, func(_ context.Context, h map[string]string) map[string]string {
			seen = maps.Clone(h)
			return nil
		})
		e := ev("m-1")
		e.Headers = map[string]string{"a": "b"}
		mustEmit(t, ctx, e)
		if !maps.Equal(seen, e.Headers) {
			t.Errorf("capture saw %v, want %v", seen, e.Headers)
		}
		if got := b.Take()[0]; !maps.Equal(got.Headers, e.Headers) {
			t.Errorf("headers %v, want %v", got.Headers, e.Headers)
		}
	})

	t.Run("PushedOverTheRecordLimitIsRefused", func(t *testing.T) {
		t.Parallel()
		e := ev("m-1")
		e.ContentType = "application/octet-stream"
		e.Payload = nil
		base := RecordSize(&e)
		limits := Limits{MaxRecordBytes: base + 10}
		// Without capture the event fits; the captured headers push it over.
		ctx, b := begin(t, limits, nil)
		mustEmit(t, ctx, e)
		b.Take()
		ctx, b = begin(t, limits, traceCapture)
		err := Emit(ctx, e)
		var ve *ValidationError
		if !errors.Is(err, ErrRecordTooLarge) || !errors.As(err, &ve) {
			t.Fatalf("Emit = %v, want a *ValidationError matching ErrRecordTooLarge", err)
		}
		if b.Len() != 0 {
			t.Errorf("%d events buffered after the refusal", b.Len())
		}
	})

	t.Run("CapturedHeadersAreValidated", func(t *testing.T) {
		t.Parallel()
		for name, add := range map[string]map[string]string{
			"reserved": {"outbox-trace": "x"},
			"notUTF8":  {"traceparent": "\xff"},
			"control":  {"trace\nparent": "x"},
		} {
			ctx, b := begin(t, Limits{}, func(context.Context, map[string]string) map[string]string { return add })
			err := Emit(ctx, ev(""))
			if !errors.Is(err, ErrInvalidEvent) || !(errors.Is(err, ErrReservedHeader) || errors.Is(err, ErrInvalidHeader)) {
				t.Errorf("%s: Emit = %v, want an invalid header error", name, err)
			}
			if name == "reserved" && !strings.Contains(err.Error(), "outbox-trace") {
				t.Errorf("%s: error %q does not name the header", name, err)
			}
			b.Discard()
		}
	})

	t.Run("NilCaptureAndNilResultAddNothing", func(t *testing.T) {
		t.Parallel()
		for _, c := range []Capture{nil, func(context.Context, map[string]string) map[string]string { return nil }} {
			ctx, b := begin(t, Limits{}, c)
			mustEmit(t, ctx, ev(""))
			if got := b.Take()[0]; got.Headers != nil {
				t.Errorf("headers %v, want nil", got.Headers)
			}
		}
	})
}
