package rabbitmq_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/sqloutbox/outbox/internal/testkit/e2e"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/internal/testkit/privateserver"
	"github.com/sqloutbox/outbox/relay/rabbitmq"
	"github.com/sqloutbox/outbox/relay/rabbitmq/rabbitmqtest"
)

// basicPublish is the class and method ID of AMQP's basic.publish (60,
// 40) as they open its method frame's payload: the pattern of a publish.
var basicPublish = []byte{0, 60, 0, 40}

// TestBrokerFaults is issue 21's fault matrix against RabbitMQ: a relay
// publishing through this publisher while writers serialized per
// aggregate commit, on each database (lib/pq, pgx, MariaDB, SQLite; on pgx
// also with the relay reading the WAL, table mode), hit by
// a broker fault in the middle (e2e.RunFaults):
//
//   - ResetMidPublish: the connection cut four times in one run while
//     publishes are in flight, alternately right after a basic.publish
//     reached the broker (its confirm never arrives) and just before (the
//     publish lost);
//   - Unreachable: the broker unreachable through the proxy for 2 s;
//   - StallShort and StallLong: the proxy holds every byte for 0.4 s and
//     for 1.5 s (the relay's publish deadline is 1 s);
//   - PermissionRevoked: a user created for the test, allowed to write to
//     the test's exchange only, loses that permission while publishes run
//     (rabbitmqctl set_permissions, and its connection closed: see
//     permissionRevoked; each basic.publish then closes its channel with
//     403, which the publisher reports as relay.ErrUnavailable), for a
//     second at least, then gets it back.
//
// Each run's ledger, on first deliveries in the queue's delivery order:
// nothing lost, no ghost, each aggregate in commit order, no order
// violation reported by the relay, nothing dead-lettered; duplicates
// (RabbitMQ does not dedupe) at most the messages the failed publishes
// left unresolved.
func TestBrokerFaults(t *testing.T) {
	t.Parallel()
	viaProxy := func(fault func(*faultproxy.Proxy) func(context.Context, *testing.T, *e2e.Probe)) func(t *testing.T) e2e.FaultConfig[rabbitmqtest.Record] {
		return func(t *testing.T) e2e.FaultConfig[rabbitmqtest.Record] {
			s := newSpace(t, "#")
			proxy := startProxy(t)
			p := newPublisher(t, rabbitmq.Config{URL: viaProxy(t, proxy.Addr()), Exchange: s.Exchange})
			return faultConfig(p, s, fault(proxy))
		}
	}
	e2e.RunFaults(t,
		e2e.FaultCase[rabbitmqtest.Record]{Name: "ResetMidPublish", Setup: viaProxy(func(p *faultproxy.Proxy) func(context.Context, *testing.T, *e2e.Probe) {
			return e2e.ResetMidPublish(p, basicPublish, 4)
		})},
		e2e.FaultCase[rabbitmqtest.Record]{Name: "Unreachable", Setup: viaProxy(func(p *faultproxy.Proxy) func(context.Context, *testing.T, *e2e.Probe) {
			return e2e.Unreachable(p, 2*time.Second)
		})},
		e2e.FaultCase[rabbitmqtest.Record]{Name: "StallShort", Setup: viaProxy(func(p *faultproxy.Proxy) func(context.Context, *testing.T, *e2e.Probe) {
			return e2e.Stall(p, 400*time.Millisecond)
		})},
		e2e.FaultCase[rabbitmqtest.Record]{Name: "StallLong", Setup: viaProxy(func(p *faultproxy.Proxy) func(context.Context, *testing.T, *e2e.Probe) {
			return e2e.Stall(p, 1500*time.Millisecond)
		})},
		e2e.FaultCase[rabbitmqtest.Record]{Name: "PermissionRevoked", Setup: permissionRevoked},
	)
}

// faultConfig is a fault case's configuration for publisher p, read back
// by s's consumer in delivery order.
func faultConfig(p *rabbitmq.Publisher, s *space, fault func(context.Context, *testing.T, *e2e.Probe)) e2e.FaultConfig[rabbitmqtest.Record] {
	return e2e.FaultConfig[rabbitmqtest.Record]{Publisher: p, Fault: fault, WaitForAll: s.cons.WaitForMessageIDs, Check: rabbitmqtest.Check}
}

// permissionRevoked sets up the PermissionRevoked case on the shared
// broker, safely: a user of the test's own (privateserver.RabbitMQUser,
// deleted when the test ends) whose only permission is to write to the
// test's own exchange; the publisher connects as that user through a
// proxy. The fault takes the write permission away and gives it back.
//
// RabbitMQ (3.10 here) caches a channel's permission checks: the
// publisher's channel, publishing all along, went on publishing for
// minutes after the permission was gone (seen here), while a new channel
// is refused at once. So the revocation also closes the publisher's connection, as
// an operator revoking access would (rabbitmqctl close_connection; here
// the test's proxy cuts it, leaving other users of the shared broker
// alone): the publisher reconnects, and its new channel's basic.publish
// is refused (403).
func permissionRevoked(t *testing.T) e2e.FaultConfig[rabbitmqtest.Record] {
	s := newSpace(t, "#")
	u, err := amqp.ParseURI(brokerURL())
	if err != nil {
		t.Fatal(err)
	}
	vhost := u.Vhost
	if vhost == "" {
		vhost = "/"
	}
	user, pass := "outboxtest-"+unique(), unique()
	privateserver.RabbitMQUser(t, user, pass)
	// Configure nothing, write the test's exchange (or nothing), read
	// nothing.
	setWrite := func(t *testing.T, regexp string) {
		privateserver.Rabbitmqctl(t, "set_permissions", "-p", vhost, user, "", regexp, "")
	}
	allowed := "^" + s.Exchange + "$"
	setWrite(t, allowed)
	proxy := startProxy(t)
	p := newPublisher(t, rabbitmq.Config{URL: fmt.Sprintf("amqp://%s:%s@%s/%s", user, pass, proxy.Addr(), url.PathEscape(vhost)), Exchange: s.Exchange})
	return faultConfig(p, s, e2e.Revoked(time.Second,
		func(t *testing.T) { setWrite(t, ""); proxy.CutAll() },
		func(t *testing.T) { setWrite(t, allowed) }))
}
