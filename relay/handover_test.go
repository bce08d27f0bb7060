package relay_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay"
)

// leaseCount records the partitions a relay owns (Observer.Leases).
type leaseCount struct {
	relay.NopObserver
	owned atomic.Int64
}

func (o *leaseCount) Leases(n int) { o.owned.Store(int64(n)) }

// TestJoiningRelayTakesItsShareBeforeItsNextHeartbeat: a relay joining a
// table whose partitions another relay owns takes its share as soon as the
// other releases it, not at its own next heartbeat. The owner here beats
// every 100 ms and the joining relay every 20 s: before, the joining relay
// took its 16 partitions at its second heartbeat, 20 s after it started,
// and every event of those partitions waited meanwhile (issue 36: a
// handover from one relay to two raised emit-to-consumer p99 to 1.5 s at
// the default 2.5 s heartbeat). Now it beats every catchUpBeat (a
// twentieth of its heartbeat) while it owns less than its share.
func TestJoiningRelayTakesItsShareBeforeItsNextHeartbeat(t *testing.T) {
	t.Parallel()
	// The servers' targets: SQLite's tests run one relay per file (one
	// writer at a time); the lease code is the same.
	for _, tg := range testdb.All[:3] {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			e := testdb.New(t, tg, driver.Config{})
			e.RelayDB.SetMaxOpenConns(8)
			first := &leaseCount{}
			a := setupOn(t, e, func(c *relay.Config) {
				c.Observer = first
				c.LeaseTTL, c.LeaseHeartbeat = 2*time.Second, 100*time.Millisecond
			})
			eventually(t, a.ctx, "the first relay owning every partition", func() bool { return first.owned.Load() == 32 })
			second := &leaseCount{}
			start := time.Now()
			setupOn(t, e, func(c *relay.Config) {
				c.Observer = second
				c.LeaseTTL, c.LeaseHeartbeat = 60*time.Second, 20*time.Second
			})
			eventually(t, a.ctx, "the second relay owning its share", func() bool { return second.owned.Load() == 16 })
			if took := time.Since(start); took >= 10*time.Second {
				t.Errorf("the joining relay took its share %v after it started, want well before its next heartbeat (20 s)", took.Round(time.Millisecond))
			}
			if n := first.owned.Load(); n != 16 {
				t.Errorf("the first relay owns %d partitions, want 16", n)
			}
		})
	}
}
