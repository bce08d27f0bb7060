package redistest_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox/emit"
	redispub "github.com/sqloutbox/outbox/relay/redis"
	"github.com/sqloutbox/outbox/relay/redis/redistest"
)

func options(t *testing.T) *redis.Options {
	t.Helper()
	addr := os.Getenv("OUTBOX_TEST_REDIS")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	o := &redis.Options{Addr: addr}
	c := redis.NewClient(o)
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
			t.Fatalf("Redis at %s: %v", addr, err)
		}
		t.Skipf("Redis at %s not available: %v", addr, err)
	}
	return o
}

// TestConsumer: two streams (one created after the consumer started),
// fields mapped to payload and headers, each stream in ID order; a key of
// another type is an error kept, not the end; Wait ends with ctx's error;
// DeleteKeys removes the prefix's keys.
func TestConsumer(t *testing.T) {
	t.Parallel()
	o := options(t)
	cl := redis.NewClient(o)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	prefix := redistest.UniqueName("kit:") + ":"
	defer func() { _, _ = redistest.DeleteKeys(context.Background(), cl, prefix+"*") }()
	a, b := prefix+"a", prefix+"b"
	if err := cl.XAdd(ctx, &redis.XAddArgs{Stream: a, Values: []any{redispub.PayloadField, "p1", emit.HeaderMessageID, "1", "h", "v"}}).Err(); err != nil {
		t.Fatal(err)
	}
	c, err := redistest.NewConsumer(o, a, b)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := time.Now()
	for _, x := range []struct{ stream, id string }{{b, "2"}, {a, "3"}} {
		if err := cl.XAdd(ctx, &redis.XAddArgs{Stream: x.stream, Values: []any{redispub.PayloadField, "p" + x.id, emit.HeaderMessageID, x.id}}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := c.WaitForMessageIDs(ctx, "1", "2", "3")
	if err != nil {
		t.Fatal(err)
	}
	var inA []string
	for _, r := range recs {
		id, _ := r.MessageID()
		if string(r.Payload) != "p"+id || r.ID == "" || r.Headers[redispub.PayloadField] != "" {
			t.Errorf("record %+v", r)
		}
		if r.Stream == a {
			inA = append(inA, id)
		}
		if id != "1" && r.Received.Before(before) {
			t.Errorf("record %s received before it was added", id)
		}
	}
	if len(recs) != 3 || len(inA) != 2 || inA[0] != "1" || recs[0].Headers["h"] != "v" {
		t.Errorf("records %+v", recs)
	}
	short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	defer stop()
	if got, err := c.WaitForCount(short, 4); !errors.Is(err, context.DeadlineExceeded) || len(got) != 3 {
		t.Errorf("WaitForCount(4) = %d records, %v; want 3 and the deadline", len(got), err)
	}
	c.Close()
	c.Close()

	wrong := prefix + "string"
	if err := cl.Set(ctx, wrong, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	w, err := redistest.NewConsumer(o, wrong)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	waitFor(ctx, t, func() bool { return len(w.Errors()) > 0 })
	n, err := redistest.DeleteKeys(ctx, cl, prefix+"*")
	if err != nil || n != 3 {
		t.Errorf("DeleteKeys = %d, %v; want 3", n, err)
	}
}

func waitFor(ctx context.Context, t *testing.T, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-tick.C:
		}
	}
}
