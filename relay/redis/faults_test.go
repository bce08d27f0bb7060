package redispub_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox/internal/testkit/e2e"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	redispub "github.com/sqloutbox/outbox/relay/redis"
	"github.com/sqloutbox/outbox/relay/redis/redistest"
)

// TestBrokerFaults is issue 21's fault matrix against Redis Streams: a
// relay publishing through this publisher while writers serialized per
// aggregate commit, on each database (lib/pq, pgx, MariaDB, SQLite; on pgx
// also with the relay reading the WAL, table mode), hit by
// a server fault in the middle (e2e.RunFaults):
//
//   - ResetMidPublish: the connection cut four times in one run while
//     publishes are in flight, alternately right after an XADD to the
//     test's stream reached the server (its reply never arrives) and just
//     before (the XADD lost);
//   - Unreachable: the server unreachable through the proxy for 2 s;
//   - StallShort and StallLong: the proxy holds every byte for 0.4 s and
//     for 1.5 s (the relay's publish deadline is 1 s);
//   - PermissionRevoked: a Redis ACL user created for the test (keys of
//     the test's prefix only) loses XADD while publishes run (ACL SETUSER
//     -xadd: NOPERM on its open connections at once, relay.ErrUnavailable)
//     for a second, then gets it back (+xadd).
//
// The publisher's client has go-redis's own retries off (MaxRetries -1,
// as the package doc advises): the relay retries. Each run's ledger, on
// first deliveries in entry ID order: nothing lost, no ghost, each
// aggregate in commit order, no order violation reported by the relay,
// nothing dead-lettered; duplicates (Redis does not dedupe) at most the
// messages the failed publishes left unresolved.
func TestBrokerFaults(t *testing.T) {
	t.Parallel()
	viaProxy := func(fault func(*faultproxy.Proxy, *space) func(context.Context, *testing.T, *e2e.Probe)) func(t *testing.T) e2e.FaultConfig[redistest.Record] {
		return func(t *testing.T) e2e.FaultConfig[redistest.Record] {
			s := newSpace(t)
			proxy := startProxy(t)
			return faultConfig(t, s, connect(t, proxy.Addr()), fault(proxy, s))
		}
	}
	e2e.RunFaults(t,
		e2e.FaultCase[redistest.Record]{Name: "ResetMidPublish", Setup: viaProxy(func(p *faultproxy.Proxy, s *space) func(context.Context, *testing.T, *e2e.Probe) {
			// An XADD's key, the only command naming the test's prefix.
			return e2e.ResetMidPublish(p, []byte(s.Prefix), 4)
		})},
		e2e.FaultCase[redistest.Record]{Name: "Unreachable", Setup: viaProxy(func(p *faultproxy.Proxy, _ *space) func(context.Context, *testing.T, *e2e.Probe) {
			return e2e.Unreachable(p, 2*time.Second)
		})},
		e2e.FaultCase[redistest.Record]{Name: "StallShort", Setup: viaProxy(func(p *faultproxy.Proxy, _ *space) func(context.Context, *testing.T, *e2e.Probe) {
			return e2e.Stall(p, 400*time.Millisecond)
		})},
		e2e.FaultCase[redistest.Record]{Name: "StallLong", Setup: viaProxy(func(p *faultproxy.Proxy, _ *space) func(context.Context, *testing.T, *e2e.Probe) {
			return e2e.Stall(p, 1500*time.Millisecond)
		})},
		e2e.FaultCase[redistest.Record]{Name: "PermissionRevoked", Setup: permissionRevoked},
	)
}

// faultConfig is a fault case's configuration for a publisher on client
// c into s's streams, read back by a consumer of s's stream of the
// aggregate type e2e commits.
func faultConfig(t *testing.T, s *space, c *redis.Client, fault func(context.Context, *testing.T, *e2e.Probe)) e2e.FaultConfig[redistest.Record] {
	p := newPublisher(t, redispub.Config{Client: c, Stream: s.Stream})
	cons := s.consume(t, e2e.AggregateType)
	return e2e.FaultConfig[redistest.Record]{Publisher: p, Fault: fault, WaitForAll: cons.WaitForMessageIDs, Check: redistest.Check}
}

// permissionRevoked sets up the PermissionRevoked case on the shared
// server, safely: an ACL user of the test's own (deleted when the test
// ends) that may run any command on the keys of the test's prefix only.
// The fault takes XADD away from it and gives it back; ACL changes apply
// to the user's open connections at once.
func permissionRevoked(t *testing.T) e2e.FaultConfig[redistest.Record] {
	s := newSpace(t)
	ctx := testCtx(t, time.Minute)
	user, pass := "outboxtest-"+unique(), unique()
	acl := func(t *testing.T, rules ...any) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.c.Do(ctx, append([]any{"ACL", "SETUSER", user}, rules...)...).Err(); err != nil {
			t.Fatalf("ACL SETUSER %s %v: %v", user, rules, err)
		}
	}
	acl(t, "on", ">"+pass, "~"+s.Prefix+"*", "+@all")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.c.Do(ctx, "ACL", "DELUSER", user).Err(); err != nil {
			t.Errorf("ACL DELUSER %s: %v", user, err)
		}
	})
	c := connect(t, redisAddr(), func(o *redis.Options) { o.Username, o.Password = user, pass })
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	return faultConfig(t, s, c, e2e.Revoked(time.Second,
		func(t *testing.T) { acl(t, "-xadd") },
		func(t *testing.T) { acl(t, "+xadd") }))
}
