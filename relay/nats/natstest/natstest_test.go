package natstest_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/relay/nats/natstest"
)

func jetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	url := os.Getenv("OUTBOX_TEST_NATS")
	if url == "" {
		url = "nats://127.0.0.1:4222"
	}
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
			t.Fatalf("NATS at %s: %v", url, err)
		}
		t.Skipf("NATS at %s not available: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestConsumer: records carry subject, stream sequence, payload, headers
// (the last of a repeated name) and a receive time; PublisherRecord drops
// Nats-Msg-Id; Wait ends with ctx's error; Close twice is fine; Delete of
// a deleted stream errors.
func TestConsumer(t *testing.T) {
	t.Parallel()
	js := jetStream(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	prefix := natstest.UniqueName("kit-")
	s, err := natstest.CreateStream(ctx, js, []string{prefix + ".>"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := natstest.NewConsumer(ctx, js, s.Name)
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	for i, id := range []string{"a", "b"} {
		m := nats.NewMsg(prefix + ".x")
		m.Data = []byte(id)
		m.Header.Add("h", "1")
		m.Header.Add("h", "2")
		m.Header.Set(emit.HeaderMessageID, id)
		m.Header.Set(jetstream.MsgIDHeader, id)
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	recs, err := c.WaitForMessageIDs(ctx, "a", "b")
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range recs {
		id, ok := r.MessageID()
		if !ok || string(r.Payload) != id || r.Sequence != uint64(i+1) || r.Subject != prefix+".x" || r.Headers["h"] != "2" || r.Received.Before(before) {
			t.Errorf("record %d: %+v", i, r)
		}
		if pr := r.PublisherRecord(); pr.Headers[jetstream.MsgIDHeader] != "" || pr.Headers["h"] != "2" || pr.Raw.(natstest.Record).Sequence != r.Sequence {
			t.Errorf("PublisherRecord %d: %+v", i, pr)
		}
	}
	if g := natstest.ByMessageID(recs); len(g) != 2 || len(g["a"]) != 1 {
		t.Errorf("ByMessageID: %v", g)
	}
	short, stop := context.WithTimeout(ctx, 50*time.Millisecond)
	defer stop()
	if got, err := c.WaitForCount(short, 3); !errors.Is(err, context.DeadlineExceeded) || len(got) != 2 {
		t.Errorf("WaitForCount(3) = %d records, %v; want 2 and the deadline", len(got), err)
	}
	c.Close()
	c.Close()
	if err := s.Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx); err == nil {
		t.Error("second Delete = nil")
	}
	if _, err := natstest.CreateStream(ctx, js, nil); err == nil {
		t.Error("CreateStream without subjects = nil error")
	}
}
