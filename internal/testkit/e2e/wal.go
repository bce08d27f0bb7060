package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay"
)

// WALSlot creates a replication slot of t's own, named outbox_test_..., and
// the publication for e's table (relay.CreateWAL: log-only writers refuse
// to commit without a slot), dropped when t ends (DropWALAtCleanup: call
// it before starting relays, so that it runs after they stopped). It
// returns the WALConfig of a relay on it (DSN e.DSN). It skips t, or fails
// it under OUTBOX_TEST_REQUIRE, unless the server runs with
// wal_level = logical (.ci/run sets it).
func WALSlot(t testing.TB, ctx context.Context, e *testdb.Env) relay.WALConfig {
	t.Helper()
	testdb.RequireLogicalWAL(t, e.RelayDB)
	cfg := relay.WALConfig{DSN: e.DSN, Slot: strings.ToLower(testdb.RandomName("outbox_test_"))}
	DropWALAtCleanup(t, e, cfg)
	st, err := relay.CreateWAL(ctx, e.Outbox, e.RelayDB, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if st.Loss != nil && st.Loss.Reason == relay.WALLossUnreadableAtCreation {
		// The server could not read the first slot (other tests drop
		// tables meanwhile) and CreateWAL created another; no writer of
		// t's has run yet, so nothing was lost.
		t.Logf("slot %s: the first one created could not be read by the server and was created again", cfg.Slot)
		if _, err := relay.AckWALLoss(ctx, e.Outbox, e.RelayDB, cfg); err != nil {
			t.Fatal(err)
		}
	}
	return cfg
}

// DropWALAtCleanup drops cfg's slot and publication (relay.DropWAL) when t
// ends, failed or not: a slot left behind keeps the shared server's WAL
// for ever. While the slot is still held (the walsender of a relay that
// just stopped, or of a killed relay process, is exiting) it tries again,
// for up to 30 s. Register it before the relays, so that it runs after
// they stopped.
func DropWALAtCleanup(t testing.TB, e *testdb.Env, cfg relay.WALConfig) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for {
			err := relay.DropWAL(ctx, e.Outbox, e.RelayDB, cfg)
			if err == nil {
				return
			}
			if !errors.Is(err, relay.ErrWALUnavailable) || ctx.Err() != nil {
				t.Errorf("dropping the test's slot %s: %v", cfg.Slot, err)
				return
			}
			_, _ = e.RelayDB.ExecContext(ctx, "SELECT pg_sleep(0.05)") // the walsender is exiting
		}
	})
}
