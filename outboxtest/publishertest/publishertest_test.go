package publishertest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/outboxtest/publishertest"
	"github.com/sqloutbox/outbox/relay"
)

// TestSuiteOnMemoryPublisher runs the suite against outboxtest's in-memory
// publisher, whose "broker" is its own record of acknowledged messages:
// it keeps the suite itself honest without a broker.
func TestSuiteOnMemoryPublisher(t *testing.T) {
	t.Parallel()
	const tooLarge = 1 << 20
	publishertest.Run(t, publishertest.Config{
		New: func(t *testing.T) publishertest.Target {
			pub := outboxtest.NewPublisher()
			pub.FailWith(func(m relay.Message) error {
				if len(m.Payload) >= tooLarge {
					return fmt.Errorf("%w: %d bytes", relay.ErrPermanent, len(m.Payload))
				}
				return nil
			})
			return publishertest.Target{Publisher: pub, Received: func(ctx context.Context, n int) ([]publishertest.Record, error) {
				msgs, err := pub.WaitForCount(ctx, n)
				recs := make([]publishertest.Record, len(msgs))
				for i, m := range msgs {
					recs[i] = publishertest.Record{Payload: m.Payload, Headers: publishertest.WantHeaders(m), Raw: m}
				}
				return recs, err
			}}
		},
		Quirks: publishertest.Quirks{TooLargePayload: tooLarge, HoldsBack: true},
	})
}
