package inboxkafka_test

import (
	"testing"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestLedgerExactlyOnceUnderKillsAndRebalances is the inbox's proof, from
// a producer database to a consumer database through the outbox, a relay
// and Kafka: writers commit total business changes, each with its event;
// relay processes publish them; consumer processes (two at a time, so the
// group rebalances whenever one starts or dies) apply each event to a
// ledger table through the inbox. Consumers are SIGKILLed at the named
// points (after a record's outcome is stored, before its offset is
// committed; just before an offset commit) and at random moments, and
// the relay is SIGKILLed at a random moment and after a publish before
// mark-sent. At the end every event is applied exactly once (one ledger
// row per message), in order per aggregate (seq 1, 2, 3, ...), and the
// consumers together recognised duplicates: the redeliveries the kills
// caused, stopped by the inbox.
func TestLedgerExactlyOnceUnderKillsAndRebalances(t *testing.T) {
	t.Parallel()
	for _, tg := range []testdb.Target{pgx, {Name: "mysql", Dialect: driver.MySQL}} {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			ledgerProof(t, tg)
		})
	}
}

func ledgerProof(t *testing.T, tg testdb.Target) {
	b, topic := startBroker(t, 6)
	env := kafkaEnv(b.Addrs(), randomName("g-"), topic)
	ledgertest.Run(t, ledgertest.Proof{Target: tg, ConsumerEnv: env, RelayEnv: env,
		AfterStore: "inboxkafka/after-store", BeforeCommit: "inboxkafka/before-commit", Timeout: 110 * time.Second})
}
