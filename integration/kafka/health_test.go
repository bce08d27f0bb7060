package kafka_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// advertisedListener reports the proxy's address, so that kfake
// advertises the proxy and every connection goes through it.
type advertisedListener struct {
	net.Listener
	addr net.Addr
}

func (a advertisedListener) Addr() net.Addr { return a.addr }

// proxiedBroker starts kfake behind a faultproxy; it returns the proxy.
func proxiedBroker(t *testing.T, topics ...string) *faultproxy.Proxy {
	t.Helper()
	var proxy *faultproxy.Proxy
	listen := func(network, _ string) (net.Listener, error) {
		ln, err := net.Listen(network, "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		if proxy, err = faultproxy.Start(ln.Addr().String()); err != nil {
			ln.Close()
			return nil, err
		}
		pa, err := net.ResolveTCPAddr("tcp", proxy.Addr())
		if err != nil {
			ln.Close()
			return nil, err
		}
		return advertisedListener{Listener: ln, addr: pa}, nil
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.ListenFn(listen), kfake.SeedTopics(2, topics...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); proxy.Close() })
	return proxy
}

// waitHealthy polls p.Healthy until it returns an error (want false) or
// nil (want true), failing t at ctx's end.
func waitHealthy(t *testing.T, ctx context.Context, p *kafka.Publisher, want bool) error {
	t.Helper()
	for {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := p.Healthy(cctx)
		cancel()
		if (err == nil) == want {
			return err
		}
		select {
		case <-ctx.Done():
			t.Fatalf("Healthy never became %v; last: %v", want, err)
		case <-time.After(20 * time.Millisecond): // poll interval, not synchronisation
		}
	}
}

// TestPublisherHealthy: the Kafka publisher is a relay.HealthChecker that
// fails while no broker answers (connections refused by a proxy) and
// succeeds again once one does, after a publish too (metadata of the
// topics published to), creates no topic, and returns ErrClosed after
// Close.
func TestPublisherHealthy(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t, time.Minute)
	const topic = "outbox.event.health"
	proxy := proxiedBroker(t, topic)
	p, err := kafka.NewPublisher(kafka.Config{Brokers: []string{proxy.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	var hc relay.HealthChecker = p
	if err := hc.Healthy(ctx); err != nil {
		t.Fatalf("Healthy with the broker up: %v", err)
	}
	msg := relay.Message{ID: 1, MessageID: "m1", AggregateType: "health", AggregateID: "a", EventType: "t", Payload: []byte("x")}
	if err := p.Publish(ctx, []relay.Message{msg}); err != nil {
		t.Fatal(err)
	}

	proxy.Refuse(true)
	start := time.Now()
	err = waitHealthy(t, ctx, p, false)
	t.Logf("unhealthy %v after the cut: %v", time.Since(start).Round(time.Millisecond), err)

	proxy.Refuse(false)
	start = time.Now()
	waitHealthy(t, ctx, p, true)
	t.Logf("healthy %v after the broker came back", time.Since(start).Round(time.Millisecond))

	// A check whose context ends first returns the context's error.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := p.Healthy(cctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Healthy with a cancelled context: %v", err)
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Healthy(ctx); !errors.Is(err, kafka.ErrClosed) {
		t.Errorf("Healthy after Close: %v, want ErrClosed", err)
	}
}
