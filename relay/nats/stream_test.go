package natspub_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/relay"
	natspub "github.com/sqloutbox/outbox/relay/nats"
	"github.com/sqloutbox/outbox/relay/nats/natstest"
)

// ownStream returns a StreamConfig with a name and prefix of the test's
// own, and deletes the stream (if made) when the test ends.
func ownStream(t *testing.T, nc *nats.Conn) natspub.StreamConfig {
	t.Helper()
	name := natstest.UniqueName("OUTBOXTEST")
	c := natspub.StreamConfig{Name: strings.ReplaceAll(name, "-", "_"), SubjectPrefix: strings.ToLower(name) + ".", Storage: jetstream.MemoryStorage}
	t.Cleanup(func() {
		js, err := jetstream.New(nc)
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, c.Name)
	})
	return c
}

// TestCreateStreamIdempotent: CreateStream makes the stream once, finds it
// the same the second time, and refuses (without changing it) a stream
// with other settings, naming each one; CheckStream agrees.
func TestCreateStreamIdempotent(t *testing.T) {
	t.Parallel()
	nc := connect(t, serverURL())
	ctx := testCtx(t, time.Minute)
	c := ownStream(t, nc)
	if err := natspub.CheckStream(ctx, nc, c); !errors.Is(err, natspub.ErrStreamMissing) ||
		!strings.Contains(err.Error(), "outbox nats stream create --broker nats://<host>:4222 --nats-stream "+c.Name+" --subject-prefix "+c.SubjectPrefix) {
		t.Fatalf("CheckStream before: %v, want ErrStreamMissing with the command", err)
	}
	for i, want := range []bool{true, false} {
		created, err := natspub.CreateStream(ctx, nc, c)
		if err != nil || created != want {
			t.Fatalf("CreateStream #%d = %v, %v; want %v, nil", i+1, created, err, want)
		}
	}
	if err := natspub.CheckStream(ctx, nc, c); err != nil {
		t.Fatalf("CheckStream: %v", err)
	}
	other := c
	other.Duplicates, other.Storage = 5*time.Minute, jetstream.FileStorage
	for _, f := range []func() error{
		func() error { _, err := natspub.CreateStream(ctx, nc, other); return err },
		func() error { return natspub.CheckStream(ctx, nc, other) },
	} {
		err := f()
		if !errors.Is(err, natspub.ErrStreamMismatch) || !strings.Contains(err.Error(), "duplicate window 2m0s, want 5m0s") ||
			!strings.Contains(err.Error(), "storage Memory, want File") {
			t.Errorf("with other settings: %v, want ErrStreamMismatch naming the window and the storage", err)
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, c.Name)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := s.CachedInfo().Config; cfg.Duplicates != natspub.DefaultDuplicateWindow || cfg.Storage != jetstream.MemoryStorage || cfg.Subjects[0] != c.SubjectPrefix+">" {
		t.Errorf("the stream changed: %+v", cfg)
	}
}

// TestCreateStreamOverlap: a second stream over the same subjects is
// refused by the server; the error says another stream binds them.
func TestCreateStreamOverlap(t *testing.T) {
	t.Parallel()
	nc := connect(t, serverURL())
	ctx := testCtx(t, time.Minute)
	c := ownStream(t, nc)
	if _, err := natspub.CreateStream(ctx, nc, c); err != nil {
		t.Fatal(err)
	}
	second := ownStream(t, nc)
	second.SubjectPrefix = c.SubjectPrefix
	if _, err := natspub.CreateStream(ctx, nc, second); err == nil || !strings.Contains(err.Error(), "another stream already binds") {
		t.Errorf("CreateStream over bound subjects: %v, want the overlap explained", err)
	}
}

func TestStreamConfigRefused(t *testing.T) {
	t.Parallel()
	nc := connect(t, serverURL())
	for _, c := range []natspub.StreamConfig{
		{Name: "a.b"}, {SubjectPrefix: "no.dot"}, {SubjectPrefix: "wild.*."}, {Replicas: 6}, {Duplicates: -time.Second}, {Storage: 7},
	} {
		if _, err := natspub.CreateStream(testCtx(t, 10*time.Second), nc, c); !errors.Is(err, natspub.ErrConfig) {
			t.Errorf("CreateStream(%+v) = %v, want ErrConfig", c, err)
		}
	}
}

// TestHealthyNamesTheMissingStream: with Config.Stream, Healthy fails
// with ErrStreamMissing and relay.ErrUnavailable, naming the command,
// until the stream exists.
func TestHealthyNamesTheMissingStream(t *testing.T) {
	t.Parallel()
	nc := connect(t, serverURL())
	ctx := testCtx(t, time.Minute)
	c := ownStream(t, nc)
	p := newPublisher(t, natspub.Config{Conn: nc, Stream: c.Name})
	err := p.Healthy(ctx)
	if !errors.Is(err, natspub.ErrStreamMissing) || !errors.Is(err, relay.ErrUnavailable) || !strings.Contains(err.Error(), "outbox nats stream create") {
		t.Fatalf("Healthy without the stream: %v, want ErrStreamMissing, ErrUnavailable and the command", err)
	}
	if _, err := natspub.CreateStream(ctx, nc, c); err != nil {
		t.Fatal(err)
	}
	if err := p.Healthy(ctx); err != nil {
		t.Fatalf("Healthy with the stream: %v", err)
	}

}

// TestPublishFailsFastWhileDisconnected: while the connection reconnects,
// Publish sends nothing and fails at once with ErrNotConnected inside a
// batch error, instead of waiting out an AckTimeout (a minute here) per
// message.
func TestPublishFailsFastWhileDisconnected(t *testing.T) {
	t.Parallel()
	px, err := faultproxy.Start(strings.TrimPrefix(serverURL(), "nats://"))
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	nc := connect(t, "nats://"+px.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	s := newSpace(t, 0)
	p := newPublisher(t, natspub.Config{Conn: nc, Subject: s.Subject, AckTimeout: time.Minute})
	ctx := testCtx(t, 30*time.Second)
	px.Refuse(true)
	px.CutAll()
	waitFor(ctx, t, "the connection reconnecting", func() bool { return nc.Status() == nats.RECONNECTING })
	err = p.Publish(ctx, msgs(3, 2))
	var be *relay.BatchError
	if !errors.Is(err, natspub.ErrNotConnected) || !errors.As(err, &be) || !strings.Contains(err.Error(), "RECONNECTING") {
		t.Fatalf("Publish while reconnecting: %v, want a batch error wrapping ErrNotConnected naming the state", err)
	}
	px.Refuse(false)
	waitFor(ctx, t, "reconnected", func() bool { return nc.Status() == nats.CONNECTED })
	if err := p.Publish(ctx, msgs(3, 2)); err != nil {
		t.Fatalf("Publish after the reconnect: %v", err)
	}
}
