package relay_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay"
)

// TestClaimAfterFragmentedBatch: a batch whose ids do not merge into
// ranges (here every other row, the rows between them held behind a dead
// letter of another aggregate) leaves the next claim over a thousand ids to
// skip while it is being marked sent. SQLite refused that claim ("Expression
// tree is too large (maximum depth 1000)": one condition per id) on every
// retry, and the relay never published again; it must drain everything
// that is not held.
func TestClaimAfterFragmentedBatch(t *testing.T) {
	t.Parallel()
	const free = 3300 // events not held, interleaved with as many held ones
	b := setup(t, testdb.Target{Name: "sqlite", Dialect: driver.SQLite}, func(c *relay.Config) {
		c.BatchSize, c.MaxBatchSize = 1100, 1100
	})
	b.pub.FailWith(func(m relay.Message) error {
		if m.MessageID == "H-0" {
			return fmt.Errorf("%w: refused for the test", relay.ErrPermanent)
		}
		return nil
	})
	evs := []outbox.Event{{ID: "H-0", AggregateType: "t", AggregateID: "H", Type: "e", Payload: []byte("{}")}}
	for i := range free {
		evs = append(evs,
			outbox.Event{ID: fmt.Sprintf("H-%d", i+1), AggregateType: "t", AggregateID: "H", Type: "e", Payload: []byte("{}")},
			outbox.Event{ID: fmt.Sprintf("A-%d", i), AggregateType: "t", AggregateID: fmt.Sprintf("a%d", i), Type: "e", Payload: []byte("{}")})
	}
	for len(evs) > 0 {
		n := min(500, len(evs))
		b.emit(t, evs[:n]...)
		evs = evs[n:]
	}
	msgs, err := b.pub.Wait(b.ctx, func(ms []relay.Message) bool {
		a := 0
		for _, m := range ms {
			if strings.HasPrefix(m.MessageID, "A-") {
				a++
			}
		}
		return a >= free
	})
	if err != nil {
		t.Fatal(err) // it says how many were published
	}
	for _, m := range msgs {
		if m.AggregateID == "H" {
			t.Fatalf("%s published behind the dead H-0", m.MessageID)
		}
	}
}
