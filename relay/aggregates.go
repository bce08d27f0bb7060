package relay

import (
	"context"
	"sync"
)

// EachAggregate is the per-aggregate fan-out a Publisher for a broker
// without Kafka's in-partition ordering needs (PublishInOrder, which
// relay/nats, relay/rabbitmq and relay/redis use, is built on it; call
// EachAggregate directly only for a send loop of your own): it groups
// msgs by (AggregateType, AggregateID) and calls send once per aggregate with the indexes into msgs of that
// aggregate's messages, in batch order (which is id order, the order the
// aggregate must be delivered in). Different aggregates run concurrently,
// at most maxInFlight at once (below 1 counts as 1); one aggregate's
// messages are never split across calls, so send alone decides how they
// are sent one after another (and holds back the later ones once an
// earlier one failed).
//
// EachAggregate returns when every send it started has returned. If ctx
// ends before every aggregate has started, the aggregates not yet started
// are not sent and EachAggregate returns ctx.Err(); otherwise nil. send
// must be safe for concurrent use with itself (it is called from several
// goroutines) and should honour ctx.
func EachAggregate(ctx context.Context, msgs []Message, maxInFlight int, send func(idx []int)) error {
	type key struct{ typ, id string }
	index := make(map[key]int)
	var groups [][]int
	for i := range msgs {
		k := key{msgs[i].AggregateType, msgs[i].AggregateID}
		g, ok := index[k]
		if !ok {
			g = len(groups)
			index[k] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	sem := make(chan struct{}, max(maxInFlight, 1))
	var wg sync.WaitGroup
	var err error
	for _, g := range groups {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if err = ctx.Err(); err != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			send(g)
		}()
	}
	wg.Wait()
	return err
}
