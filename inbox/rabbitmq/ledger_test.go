package inboxrabbitmq_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxrabbitmq "github.com/sqloutbox/outbox/inbox/rabbitmq"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay/rabbitmq"
)

// The ledger children's broker settings.
const (
	envURL      = "INBOXRABBITMQ_URL"
	envExchange = "INBOXRABBITMQ_EXCHANGE"
	envQueue    = "INBOXRABBITMQ_QUEUE"
)

func TestMain(m *testing.M) { ledgertest.Main(m, consumerChild, relayChild) }

// TestLedgerExactlyOnceUnderKills is the runner's ledger proof
// (ledgertest): relays publishing through relay/rabbitmq, two consumer
// processes at a time on one queue (one active, one standby: the queue's
// single active consumer fails over at every death), SIGKILLs after a
// stored outcome before its ack and at random moments, every other
// consumer with BatchSize 16; every event applied exactly once, in order
// per aggregate, on PostgreSQL and MariaDB.
func TestLedgerExactlyOnceUnderKills(t *testing.T) {
	t.Parallel()
	for _, tg := range []testdb.Target{pgx, maria} {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			s := newSpace(t)
			env := []string{envURL + "=" + brokerURL(), envExchange + "=" + s.exchange, envQueue + "=" + s.queue}
			// The queue exists before the first publish: nothing is
			// returned unroutable while the first consumer starts.
			s.declare(t)
			ledgertest.Run(t, ledgertest.Proof{Target: tg, ConsumerEnv: env, RelayEnv: env,
				AfterStore: "inboxrabbitmq/after-store"})
		})
	}
}

func consumerChild() int {
	return ledgertest.ConsumerChild(func(ctx context.Context, c *ledgertest.Consumer) error {
		r, err := inboxrabbitmq.NewRunner(inboxrabbitmq.Config{URL: os.Getenv(envURL), Queue: os.Getenv(envQueue),
			Bindings: []inboxrabbitmq.Binding{{Exchange: os.Getenv(envExchange), Key: "#"}},
			Inbox:    c.Inbox, DB: c.DB, Handler: c.Handler, BatchSize: c.Batch, Logger: c.Logger,
			Backoff: fastRetry, Observer: fileObserver{c}})
		if err != nil {
			return err
		}
		return r.Run(ctx)
	})
}

// fileObserver records each outcome under the message ID (a delivery's
// tag is per channel; the ID is what every consumer sees alike).
type fileObserver struct{ c *ledgertest.Consumer }

func (o fileObserver) Processed(r inboxrabbitmq.Result) {
	o.c.Record(!r.Parked && r.Outcome == inbox.Duplicate, r.Queue+"/"+r.MessageID)
}
func (fileObserver) AttemptFailed(string, string, int, error) {}

func relayChild() int {
	pub, err := rabbitmq.NewPublisher(rabbitmq.Config{URL: os.Getenv(envURL), Exchange: os.Getenv(envExchange)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pub.Close()
	return ledgertest.RelayChild(pub)
}
