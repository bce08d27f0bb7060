package inboxnats_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	inboxnats "github.com/sqloutbox/outbox/inbox/nats"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	natspub "github.com/sqloutbox/outbox/relay/nats"
)

// Environment of the ledger proof's children (besides ledgertest's).
const (
	envURL     = "INBOXNATS_URL"
	envStream  = "INBOXNATS_STREAM"
	envBucket  = "INBOXNATS_BUCKET"
	envDurable = "INBOXNATS_DURABLE"
	envPrefix  = "INBOXNATS_PREFIX"
	// leaseTTL of the children: a SIGKILLed holder's lease expires
	// within it, so handovers take about 2 s.
	leaseTTL = 2 * time.Second
)

// TestLedgerExactlyOnceUnderKills is the inbox's proof through NATS
// JetStream (ledgertest.Run): writers commit business changes with their
// events in a producer database, relay processes publish them through
// natspub into the test's stream, and two consumer processes at a time
// run the runner on one durable (one holds the lease and consumes, the
// other waits for it); consumers are SIGKILLed right after storing an
// outcome and before acknowledging it (the failpoint
// inboxnats/after-store) and at random moments, relays after a publish
// before mark-sent and at random. Every event is applied exactly once, in
// order per aggregate, through every lease handover (each recreates the
// consumer from its ack floor), and the delivery each after-store kill
// left unacknowledged came back and was recognised as a duplicate.
func TestLedgerExactlyOnceUnderKills(t *testing.T) {
	t.Parallel()
	for _, tg := range []testdb.Target{pgx, {Name: "mysql", Dialect: driver.MySQL}} {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			s := newSpace(t)
			// The lease bucket exists before the children start, with the
			// children's TTL.
			if _, err := s.js.CreateKeyValue(testCtx(t, 10*time.Second), jetstream.KeyValueConfig{Bucket: s.Bucket, TTL: leaseTTL}); err != nil {
				t.Fatal(err)
			}
			ledgertest.Run(t, ledgertest.Proof{
				Target:      tg,
				ConsumerEnv: []string{envURL + "=" + serverURL(), envStream + "=" + s.Stream, envBucket + "=" + s.Bucket, envDurable + "=ledger"},
				RelayEnv:    []string{envURL + "=" + serverURL(), envPrefix + "=" + s.Prefix},
				AfterStore:  "inboxnats/after-store",
			})
		})
	}
}

// consumerChild runs a Runner from the environment until SIGTERM,
// recording every stored outcome as "<stream>/<sequence>". (The proof
// starts the second consumer once the first consumes, so the first holds
// the lease and reaches its failpoint.)
func consumerChild() int {
	return ledgertest.ConsumerChild(func(ctx context.Context, c *ledgertest.Consumer) error {
		nc, err := nats.Connect(os.Getenv(envURL), nats.MaxReconnects(-1))
		if err != nil {
			return err
		}
		defer nc.Close()
		stream, bucket, durable := os.Getenv(envStream), os.Getenv(envBucket), os.Getenv(envDurable)
		r, err := inboxnats.NewRunner(inboxnats.Config{Conn: nc, Stream: stream, Durable: durable,
			Inbox: c.Inbox, DB: c.DB, Handler: c.Handler, BatchSize: c.Batch, Logger: c.Logger, Backoff: fastRetry,
			Observer: fileObserver{c}, LeaseBucket: bucket, LeaseTTL: leaseTTL, FetchMaxWait: time.Second})
		if err != nil {
			return err
		}
		return r.Run(ctx)
	})
}

// fileObserver records each outcome in the child's events file.
type fileObserver struct{ c *ledgertest.Consumer }

func (o fileObserver) Processed(r inboxnats.Result) {
	o.c.Record(!r.Parked && r.Outcome == inbox.Duplicate, fmt.Sprintf("%s/%d", r.Stream, r.Sequence))
}
func (fileObserver) AttemptFailed(string, uint64, int, error) {}

// relayChild runs a relay publishing through natspub to the test's
// prefixed subjects.
func relayChild() int {
	nc, err := nats.Connect(os.Getenv(envURL), nats.MaxReconnects(-1))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer nc.Close()
	pub, err := natspub.NewPublisher(natspub.Config{Conn: nc, Subject: prefixed(os.Getenv(envPrefix))})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer func() { _ = pub.Close() }()
	return ledgertest.RelayChild(pub)
}
