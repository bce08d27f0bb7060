package tests

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// orderBreaker is a Publisher that breaks the order rule on purpose: the
// first time it sees message first, it fails it and acknowledges the
// rest of the batch, later messages of its aggregate included.
type orderBreaker struct {
	*outboxtest.Publisher
	first string

	mu     sync.Mutex
	failed bool
}

func (b *orderBreaker) Publish(ctx context.Context, msgs []relay.Message) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, m := range msgs {
		if m.MessageID != b.first || b.failed {
			continue
		}
		b.failed = true
		rest := append(append([]relay.Message(nil), msgs[:i]...), msgs[i+1:]...)
		if err := b.Publisher.Publish(ctx, rest); err != nil {
			return err
		}
		errs := make(relay.PublishErrors, len(msgs))
		errs[i] = errors.New("injected: acknowledged the rest of the batch anyway")
		return errs
	}
	return b.Publisher.Publish(ctx, msgs)
}

// recordingTB is a testing.TB whose Errorf and Cleanup are recorded
// instead of failing or scheduling anything: it shows what a helper
// would do to a test.
type recordingTB struct {
	testing.TB
	errs     []string
	cleanups []func()
}

func (r *recordingTB) Helper()          {}
func (r *recordingTB) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recordingTB) Errorf(format string, a ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, a...))
}

// TestOrderWatchCatchesAViolation: the helpers that fail a test on an
// order violation do catch one. A publisher that fails an aggregate's
// first message and acknowledges its second in the same batch makes the
// relay report it: outboxtest.WatchOrder (wrapped around every relay that
// startRelay starts) records it and fails its test at cleanup, and the
// relay's ERROR line contains orderBrokenLog, which fails a relay child's
// test.
func TestOrderWatchCatchesAViolation(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.All[len(testdb.All)-1], driver.Config{}) // SQLite: the rule is the relay's, not the database's
	ctx := testCtx(t, time.Minute)
	pub := &orderBreaker{Publisher: outboxtest.NewPublisher(), first: "a-1"}
	rec := &recordingTB{TB: t}
	watch := outboxtest.WatchOrder(rec, nil)
	var logs testdb.SyncBuffer
	err := inTx(ctx, e.DB, func(ctx context.Context, _ *sql.Tx) error {
		for _, id := range []string{"a-1", "a-2", "b-1"} {
			agg := strings.Split(id, "-")[0]
			if err := outbox.Emit(ctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: agg, Type: "t", Payload: []byte(`{}`)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The relay is started after the commit so that all three rows are in
	// its first batch.
	startRelayOn(t, e, e.RelayDB, relay.Config{Publisher: pub, PollInterval: 50 * time.Millisecond, Observer: watch,
		RetryInitial: 10 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if _, err := pub.WaitForIDs(ctx, "a-1", "a-2", "b-1"); err != nil {
		t.Fatal(err)
	}
	testdb.Eventually(t, ctx, "the violation reported", func() bool { return len(watch.Violations()) > 0 })
	if v := watch.Violations(); len(v) != 1 || v[0].MessageID != "a-2" {
		t.Fatalf("violations %s, want a-2 alone", outboxtest.DescribeMessages(v))
	}
	for _, f := range rec.cleanups {
		f()
	}
	if len(rec.errs) != 1 || !strings.Contains(rec.errs[0], "a-2") {
		t.Errorf("WatchOrder's cleanup reported %q, want one error naming a-2", rec.errs)
	}
	if !strings.Contains(logs.String(), orderBrokenLog) {
		t.Errorf("the relay's log has no %q line:\n%s", orderBrokenLog, logs.String())
	}
}
