package relay_test

import (
	"context"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// spanObserver records StartPublish and end calls.
type spanObserver struct {
	relay.NopObserver
	mu      sync.Mutex
	started [][]string // message IDs per StartPublish
	ended   []error
	open    int
}

type spanKey struct{}

func (o *spanObserver) StartPublish(ctx context.Context, msgs []relay.Message) (context.Context, func(error)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	ids := make([]string, len(msgs))
	for i := range msgs {
		ids[i] = msgs[i].MessageID
	}
	o.started = append(o.started, ids)
	o.open++
	return context.WithValue(ctx, spanKey{}, len(o.started)), func(err error) {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.open--
		o.ended = append(o.ended, err)
	}
}

func (o *spanObserver) calls() (started [][]string, ended []error, open int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([][]string(nil), o.started...), append([]error(nil), o.ended...), o.open
}

// ctxPublisher fails its first batch as a whole and checks that Publish
// receives the context StartPublish returned.
type ctxPublisher struct {
	*outboxtest.Publisher
	mu      sync.Mutex
	calls   int
	missing int // Publish calls without StartPublish's context
}

func (p *ctxPublisher) Publish(ctx context.Context, msgs []relay.Message) error {
	p.mu.Lock()
	p.calls++
	first := p.calls == 1
	if ctx.Value(spanKey{}) == nil {
		p.missing++
	}
	p.mu.Unlock()
	if first {
		return errors.New("broker unreachable")
	}
	return p.Publisher.Publish(ctx, msgs)
}

// TestPublishObserver: an Observer implementing PublishObserver wraps
// every Publish call (its context reaches the Publisher, end gets
// Publish's result), and driver.Config.Capture's headers reach the
// published message beside the application's, which win.
func TestPublishObserver(t *testing.T) {
	t.Parallel()
	capture := func(ctx context.Context, _ map[string]string) map[string]string {
		return map[string]string{"traceparent": "captured", "baggage": "k=v"}
	}
	e := testdb.New(t, testdb.All[3], driver.Config{Capture: capture})
	obs := &spanObserver{}
	pub := &ctxPublisher{Publisher: outboxtest.NewPublisher()}
	r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{Publisher: pub, Observer: obs, PollInterval: 10 * time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()

	sctx := outbox.NewContext(ctx)
	tx, err := e.DB.BeginTx(sctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := event("P", 1)
	ev.Headers = map[string]string{"traceparent": "mine"}
	if err := outbox.Emit(sctx, ev); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	msgs, err := pub.WaitForCount(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"traceparent": "mine", "baggage": "k=v"}; !maps.Equal(msgs[0].Headers, want) {
		t.Errorf("published headers %v, want %v", msgs[0].Headers, want)
	}
	eventually(t, ctx, "two ended publishes", func() bool { _, ended, _ := obs.calls(); return len(ended) == 2 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	started, ended, open := obs.calls()
	if len(started) != 2 || open != 0 || started[0][0] != "P-1" || started[1][0] != "P-1" {
		t.Errorf("StartPublish calls %v, %d left open; want two of [P-1], none open", started, open)
	}
	if ended[0] == nil || ended[1] != nil {
		t.Errorf("end errors %v, want [batch error, nil]", ended)
	}
	pub.mu.Lock()
	defer pub.mu.Unlock()
	if pub.missing != 0 {
		t.Errorf("%d Publish calls did not get StartPublish's context", pub.missing)
	}
}

// brokenObserver returns neither a context nor an end func.
type brokenObserver struct{ relay.NopObserver }

func (brokenObserver) StartPublish(context.Context, []relay.Message) (context.Context, func(error)) {
	return nil, nil
}

// TestPublishObserverBroken: a PublishObserver that returns a nil context
// and a nil end does not stop the relay from publishing.
func TestPublishObserverBroken(t *testing.T) {
	t.Parallel()
	b := setup(t, testdb.All[3], func(c *relay.Config) { c.Observer = brokenObserver{} })
	b.emit(t, event("B", 1))
	if _, err := b.pub.WaitForIDs(b.ctx, "B-1"); err != nil {
		t.Fatal(err)
	}
}
