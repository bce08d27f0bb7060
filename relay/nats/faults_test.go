package natspub_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/internal/testkit/e2e"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/internal/testkit/privateserver"
	"github.com/sqloutbox/outbox/relay"
	natspub "github.com/sqloutbox/outbox/relay/nats"
	"github.com/sqloutbox/outbox/relay/nats/natstest"
)

// TestBrokerFaults is issue 21's fault matrix against JetStream: a relay
// publishing through this publisher while writers serialized per
// aggregate commit, on each database (lib/pq, pgx, MariaDB, SQLite; on pgx
// also with the relay reading the WAL, table mode), hit by
// a broker fault in the middle (e2e.RunFaults):
//
//   - ResetMidPublish: the connection cut four times in one run while
//     publishes are in flight, alternately right after a publish reached
//     the server (its PubAck never arrives) and just before (the publish
//     lost);
//   - Unreachable: the server unreachable through the proxy for 2 s;
//   - StallShort and StallLong: the proxy holds every byte for 0.4 s and
//     for 1.5 s (the relay's publish deadline is 1 s);
//   - PermissionRevoked: on a private nats-server with users, the
//     publisher's user denied publishing to the stream's subjects by a
//     config reload while publishes run, for a second, then allowed
//     again.
//
// Each run's ledger, on first deliveries in stream order: nothing lost,
// no ghost, each aggregate in commit order, no order violation reported
// by the relay, nothing dead-lettered; and no duplicate at all, since
// the stream drops a message sent again with the same Nats-Msg-Id (its
// window is 2 minutes).
func TestBrokerFaults(t *testing.T) {
	t.Parallel()
	viaProxy := func(fault func(*faultproxy.Proxy, *space) func(context.Context, *testing.T, *e2e.Probe)) func(t *testing.T) e2e.FaultConfig[natstest.Record] {
		return func(t *testing.T) e2e.FaultConfig[natstest.Record] {
			s := newSpace(t, 0)
			proxy, err := faultproxy.Start(strings.TrimPrefix(serverURL(), "nats://"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = proxy.Close() })
			nc := connect(t, "nats://"+proxy.Addr(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
			return faultConfig(newPublisher(t, natspub.Config{Conn: nc, Subject: s.Subject}), s.consume(t), fault(proxy, s))
		}
	}
	e2e.RunFaults(t,
		e2e.FaultCase[natstest.Record]{Name: "ResetMidPublish", Setup: viaProxy(func(p *faultproxy.Proxy, s *space) func(context.Context, *testing.T, *e2e.Probe) {
			// A publish to the space: HPUB <subject> <reply> ... (headers).
			return e2e.ResetMidPublish(p, []byte("HPUB "+s.Prefix+"."), 4)
		})},
		e2e.FaultCase[natstest.Record]{Name: "Unreachable", Setup: viaProxy(func(p *faultproxy.Proxy, _ *space) func(context.Context, *testing.T, *e2e.Probe) {
			return e2e.Unreachable(p, 2*time.Second)
		})},
		e2e.FaultCase[natstest.Record]{Name: "StallShort", Setup: viaProxy(func(p *faultproxy.Proxy, _ *space) func(context.Context, *testing.T, *e2e.Probe) {
			return e2e.Stall(p, 400*time.Millisecond)
		})},
		e2e.FaultCase[natstest.Record]{Name: "StallLong", Setup: viaProxy(func(p *faultproxy.Proxy, _ *space) func(context.Context, *testing.T, *e2e.Probe) {
			return e2e.Stall(p, 1500*time.Millisecond)
		})},
		e2e.FaultCase[natstest.Record]{Name: "PermissionRevoked", Setup: permissionRevoked},
	)
}

// faultConfig is a fault case's configuration for publisher p, read back
// by consumer c: the stream stores each message ID once (Dedupes).
func faultConfig(p *natspub.Publisher, c *natstest.Consumer, fault func(context.Context, *testing.T, *e2e.Probe)) e2e.FaultConfig[natstest.Record] {
	return e2e.FaultConfig[natstest.Record]{Publisher: p, Fault: fault, WaitForAll: c.WaitForMessageIDs, Check: natstest.Check, Dedupes: true}
}

// faultUser is the publishing user of permissionRevoked's server;
// faultSubjects the subjects its stream binds.
const (
	faultUser     = "faultpub"
	faultSubjects = "fault"
)

// permissionRevoked sets up the PermissionRevoked case on a private
// nats-server (never the shared one): users permAdmin and faultUser, a
// stream of the faultSubjects subjects, and a publisher connected as
// faultUser. Its fault reloads the server's configuration with
// faultUser denied publishing to those subjects (the server then answers
// each publish with a permissions violation: relay.ErrUnavailable), and
// again without the deny.
func permissionRevoked(t *testing.T) e2e.FaultConfig[natstest.Record] {
	conf := func(deny bool) func(dir string) string {
		return func(dir string) string {
			perms := ""
			if deny {
				perms = fmt.Sprintf(", permissions: { publish: { deny: [%q] } }", faultSubjects+".>")
			}
			return fmt.Sprintf(`
jetstream { store_dir: %q }
authorization {
  users: [
    { user: %q, password: %q }
    { user: %q, password: %q%s }
  ]
}
`, filepath.Join(dir, "js"), permAdmin, permPass, faultUser, permPass, perms)
		}
	}
	srv := privateserver.StartNATS(t, conf(false))
	url := "nats://" + srv.Addr
	js, err := jetstream.New(permConnect(t, url, permAdmin))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testCtx(t, time.Minute)
	st, err := natstest.CreateStream(ctx, js, []string{faultSubjects + ".>"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := natstest.NewConsumer(ctx, js, st.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	p := newPublisher(t, natspub.Config{Conn: permConnect(t, url, faultUser),
		Subject: func(m relay.Message) string { return faultSubjects + "." + natspub.DefaultSubject(m) }})
	return faultConfig(p, c, e2e.Revoked(time.Second,
		func(t *testing.T) { srv.Reload(t, conf(true)) },
		func(t *testing.T) { srv.Reload(t, conf(false)) }))
}
