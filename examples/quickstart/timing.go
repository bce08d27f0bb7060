package main

import (
	"context"
	"sync"
	"time"

	"github.com/sqloutbox/outbox/relay"
)

// timedPublisher wraps the relay's Publisher and records when each batch
// was handed over and when Publish returned, to split the end-to-end
// latency into the relay's pickup (commit to Publish called: waiting for
// the relay's current cycle, then the claim query) and the publish itself
// (the producer's round trips until every record is acknowledged).
type timedPublisher struct {
	next relay.Publisher

	mu      sync.Mutex
	batches []batchTiming
	first   map[string]int // message ID -> index of the first batch carrying it
}

// batchTiming is one Publish call.
type batchTiming struct {
	start, end time.Time
	n          int
}

func newTimedPublisher(next relay.Publisher) *timedPublisher {
	return &timedPublisher{next: next, first: map[string]int{}}
}

// Unwrap implements relay.PublisherWrapper: the relay looks through the
// timing for what the publisher is (an exactly-once publisher's
// relay.Reconciler).
func (p *timedPublisher) Unwrap() relay.Publisher { return p.next }

// Publish implements relay.Publisher.
func (p *timedPublisher) Publish(ctx context.Context, msgs []relay.Message) error {
	start := time.Now()
	err := p.next.Publish(ctx, msgs)
	end := time.Now()
	p.mu.Lock()
	i := len(p.batches)
	p.batches = append(p.batches, batchTiming{start, end, len(msgs)})
	for _, m := range msgs {
		if _, ok := p.first[m.MessageID]; !ok {
			p.first[m.MessageID] = i
		}
	}
	p.mu.Unlock()
	return err
}

// breakdown returns the pickup and publish latencies of each row's first
// publish, and the number of Publish calls.
func (p *timedPublisher) breakdown(rows []outboxRow, commits map[commitKey]time.Time) (pickup, publish latency, batches int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var pk, pb []time.Duration
	for _, r := range rows {
		at, ok := commits[commitKey{r.AggregateID, r.EventType}]
		i, published := p.first[r.MessageID]
		if !ok || !published {
			continue
		}
		b := p.batches[i]
		pk = append(pk, b.start.Sub(at))
		pb = append(pb, b.end.Sub(b.start))
	}
	return summarize(pk), summarize(pb), len(p.batches)
}
