package inboxredis_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxredis "github.com/sqloutbox/outbox/inbox/redis"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay"
	redispub "github.com/sqloutbox/outbox/relay/redis"
)

// The children's Redis settings.
const (
	envAddr   = "INBOXREDIS_LEDGER_ADDR"
	envStream = "INBOXREDIS_LEDGER_STREAM"
	envGroup  = "INBOXREDIS_LEDGER_GROUP"
	envLease  = "INBOXREDIS_LEDGER_LEASE"
)

// TestMain lets the test binary double as a consumer process or a relay
// process of the ledger proof, so that the proof can SIGKILL them.
func TestMain(m *testing.M) {
	ledgertest.Main(m, consumerChild, relayChild)
}

// TestLedgerExactlyOnceUnderKills is the inbox's proof through Redis
// Streams (package ledgertest): writers commit business changes, each
// with its event; relay processes publish them with redispub to one
// stream; consumer processes (two at a time: the lease holder and a
// standby) apply each event to a ledger through the runner, with a lease
// of 2 s. Consumers are SIGKILLed after storing an outcome before its
// XACK, and at random (the holder or the standby); relays after a publish
// before mark-sent and at random. Every event is applied exactly once, in
// order per aggregate, across the takeovers, and the inbox recognised the
// redeliveries (claimed pending entries) the kills caused.
func TestLedgerExactlyOnceUnderKills(t *testing.T) {
	t.Parallel()
	for _, tg := range []testdb.Target{pgx, {Name: "mysql", Dialect: driver.MySQL}} {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			c := client(t, redisAddr())
			p := prefix(t, c)
			stream := p + "outbox.event.account"
			ledgertest.Run(t, ledgertest.Proof{
				Target: tg,
				ConsumerEnv: []string{envAddr + "=" + redisAddr(), envStream + "=" + stream,
					envGroup + "=" + testdb.RandomName("g_"), envLease + "=" + p + "lease"},
				RelayEnv:   []string{envAddr + "=" + redisAddr(), envStream + "=" + stream},
				AfterStore: "inboxredis/after-store",
			})
		})
	}
}

// consumerChild runs a Runner on the proof's stream until SIGTERM. (The
// proof starts the second consumer once the first consumes, so the first
// holds the lease and reaches its failpoint.)
func consumerChild() int {
	return ledgertest.ConsumerChild(func(ctx context.Context, c *ledgertest.Consumer) error {
		rc := redis.NewClient(&redis.Options{Addr: os.Getenv(envAddr), ContextTimeoutEnabled: true})
		defer rc.Close()
		lease := os.Getenv(envLease)
		r, err := inboxredis.NewRunner(inboxredis.Config{Client: rc, Streams: []string{os.Getenv(envStream)},
			Group: os.Getenv(envGroup), LeaseKey: lease, Inbox: c.Inbox, DB: c.DB, Handler: c.Handler,
			BatchSize: c.Batch, Logger: c.Logger, Backoff: fastRetry, LeaseTTL: 2 * time.Second,
			Block: 200 * time.Millisecond, Observer: ledgerObserver{c}})
		if err != nil {
			return err
		}
		return r.Run(ctx)
	})
}

// ledgerObserver records each stored outcome in the child's events file,
// the entry named "<stream>/<entry ID>" as every consumer names it.
type ledgerObserver struct{ c *ledgertest.Consumer }

func (o ledgerObserver) Processed(r inboxredis.Result) {
	o.c.Record(!r.Parked && r.Outcome == inbox.Duplicate, r.Stream+"/"+r.ID)
}

func (ledgerObserver) AttemptFailed(string, string, int, error) {}

// relayChild runs a relay publishing every event to the proof's stream.
func relayChild() int {
	rc := redis.NewClient(&redis.Options{Addr: os.Getenv(envAddr), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rc.Close()
	stream := os.Getenv(envStream)
	pub, err := redispub.NewPublisher(redispub.Config{Client: rc, Stream: func(relay.Message) string { return stream }})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pub.Close()
	return ledgertest.RelayChild(pub)
}
