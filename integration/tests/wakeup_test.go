package tests

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
)

// TestCrossProcessWakeup: a relay in another process learns of commits
// quickly: on PostgreSQL through LISTEN/NOTIFY (its fallback poll is an
// hour, so only the notification can explain delivery), on MariaDB through
// the adaptive poll (fallback 1 s, 10 ms after work). Commit-to-consumer
// latency is logged, measured from Commit returning to the consumer's
// poll, at about 100 commits/s.
func TestCrossProcessWakeup(t *testing.T) {
	t.Parallel()
	serverTargets(t, func(t *testing.T, tg testdb.Target) {
		const events = 300
		kb := startKafka(t, 8, orderTopic)
		e := testdb.New(t, tg, driver.Config{})
		env := []string{"OUTBOX_CHILD_POLL=1s"}
		if tg.Dialect == driver.Postgres {
			env = []string{"OUTBOX_CHILD_POLL=1h", "OUTBOX_CHILD_LISTEN=1"}
		}
		c := startChildAs(t, e, kb.broker.Addrs(), 500, "", "remote", env...)
		ctx := testCtx(t, 2*time.Minute)
		testdb.Eventually(t, ctx, "the remote relay owning partitions", func() bool { return ownersOf(t, e)["remote"] == 32 })

		var mu sync.Mutex
		committed := map[string]time.Time{}
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for i := 0; i < events; i++ {
			<-tick.C // offered load, not synchronisation
			id := fmt.Sprintf("x-%d", i)
			err := inTx(ctx, e.DB, func(ctx context.Context, _ *sql.Tx) error {
				return outbox.Emit(ctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: fmt.Sprintf("a-%d", i%50), Type: "t", Payload: []byte(`{}`)})
			})
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			committed[id] = time.Now()
			mu.Unlock()
		}
		recs, err := kb.cons.WaitForCount(ctx, events)
		if err != nil {
			t.Fatal(err)
		}
		c.terminate(t, ctx)
		var lat []time.Duration
		seen := map[string]bool{}
		for _, r := range recs {
			id := r.Headers[emit.HeaderMessageID]
			if seen[id] {
				continue
			}
			seen[id] = true
			lat = append(lat, r.Received.Sub(committed[id]))
		}
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		t.Logf("%s, relay in another process: commit -> consumer p50 %v, p99 %v, max %v (%d events)",
			tg.Name, lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1], len(lat))
	})
}

var _ = kafkatest.Record{}
