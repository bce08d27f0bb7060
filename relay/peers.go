package relay

import (
	"context"
	"sync"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
)

// Waking the other relays when the partitions should move (issue 36,
// item 8).
//
// A relay gives partitions up at its own heartbeat (rebalancing) or when
// it stops; the relays that take them over learn of it at their next
// heartbeat, up to a catch-up beat later (lease.go), and every event of
// those partitions committed meanwhile waits: the last 0.1 % of the
// commit-to-consumer latency while a relay joins (BENCHMARKS.md, "Issue
// 36, item 8"). Likewise a relay that joins a group whose relays own
// every partition gets its share only when they next beat, up to
// LeaseHeartbeat later. So a relay that released partitions, or joined
// and is short of its share, wakes the others' heartbeat at once: in
// this process, every other running relay of the same *driver.Outbox
// directly; in other processes, on PostgreSQL, by a NOTIFY on the
// table's wake-up channel with the payload "lease", which ListenPostgres
// turns into the same wake-up for the relays of its Outbox. Writers'
// commit notifications carry an empty payload and do not wake
// heartbeats. Without a listener (or on MySQL/MariaDB and SQLite, across
// processes) the heartbeats stay the bound.

// leasePayload is the payload of the NOTIFY of a release or a short join.
const leasePayload = "lease"

// peers are the running relays' leases per Outbox, in this process.
var peers = struct {
	sync.Mutex
	m map[*driver.Outbox]map[*leases]struct{}
}{m: map[*driver.Outbox]map[*leases]struct{}{}}

// register adds l to the relays woken when a relay of ob releases
// partitions; the returned func removes it.
func (l *leases) register(ob *driver.Outbox) (unregister func()) {
	peers.Lock()
	defer peers.Unlock()
	if peers.m[ob] == nil {
		peers.m[ob] = map[*leases]struct{}{}
	}
	peers.m[ob][l] = struct{}{}
	return func() {
		peers.Lock()
		defer peers.Unlock()
		delete(peers.m[ob], l)
		if len(peers.m[ob]) == 0 {
			delete(peers.m, ob)
		}
	}
}

// wakePeers asks every running relay of ob in this process but except for
// a heartbeat now (leases.run); a wake-up already pending is enough.
func wakePeers(ob *driver.Outbox, except *leases) {
	peers.Lock()
	defer peers.Unlock()
	for l := range peers.m[ob] {
		if l == except {
			continue
		}
		select {
		case l.kick <- struct{}{}:
		default:
		}
	}
}

// announce wakes the other relays' heartbeat: after l gave partitions
// up (they may take them), or joined short of its share (they may give
// it some). In this process directly, elsewhere (PostgreSQL) by a NOTIFY
// with leasePayload. A failed NOTIFY is not an error: the others act at
// their next heartbeat.
func (l *leases) announce(ctx context.Context) {
	wakePeers(l.r.ob, l)
	if l.r.d.Name() != dialect.Postgres {
		return
	}
	qctx, cancel := context.WithTimeout(ctx, l.r.cfg.QueryTimeout)
	defer cancel()
	if _, err := l.r.db.ExecContext(qctx, "SELECT pg_notify('"+l.r.d.Channel()+"', '"+leasePayload+"')"); err != nil {
		l.r.log.Debug("waking the other relays failed; they act at their next heartbeat", "error", err)
	}
}
