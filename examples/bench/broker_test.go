package main

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestBrokerLatency: the broker child started with a delay (-broker-latency)
// answers a produce request no sooner than that; one started without
// answers it.
func TestBrokerLatency(t *testing.T) {
	t.Parallel()
	const delay = 300 * time.Millisecond
	for _, d := range []time.Duration{0, delay} {
		b, err := startChildBroker(d)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		topic, err := topicFor(ctx, b.addrs, "latency")
		if err != nil {
			t.Fatal(err)
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(b.addrs...))
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		// The first produce also loads the metadata; time the second.
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("warm")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte("x")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); d > 0 && took < d {
			t.Errorf("a produce to the broker delayed by %v was answered after %v", d, took)
		}
	}
}
