package relay_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// startModeRelay starts a relay with publisher pub on e's table and returns
// it with the channel Run's error arrives on. The caller stops it.
func startModeRelay(t *testing.T, e *testdb.Env, pub relay.Publisher, log *syncLog) (*relay.Relay, chan error) {
	t.Helper()
	cfg := relay.Config{Publisher: pub, PollInterval: 20 * time.Millisecond, Logger: quiet(),
		LeaseTTL: 2 * time.Second, LeaseHeartbeat: 100 * time.Millisecond}
	if log != nil {
		cfg.Logger = slog.New(slog.NewJSONHandler(log, nil))
	}
	r, err := relay.New(e.Outbox, e.RelayDB, cfg)
	if err != nil {
		t.Fatal(err)
	}
	run := make(chan error, 1)
	go func() { run <- r.Run(context.Background()) }()
	return r, run
}

func stopRelay(t *testing.T, r *relay.Relay, run chan error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.Stop(ctx); err != nil {
		t.Errorf("stop: %v", err)
	}
	if err := <-run; err != nil {
		t.Errorf("run: %v", err)
	}
}

// runError waits for run to deliver Run's error.
func runError(t *testing.T, run chan error) error {
	t.Helper()
	select {
	case err := <-run:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return within 30 s")
		return nil
	}
}

func liveMembers(t *testing.T, e *testdb.Env) int {
	t.Helper()
	var n int
	if err := e.RelayDB.QueryRow("SELECT COUNT(*) FROM " + e.Table + "_relay").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestModeMismatchRefusedAtStart: beside a live relay in the exactly-once
// mode, a relay at least once, and one exactly once under another scope,
// are refused at start with ErrModeMismatch naming the live relay, and
// leave no membership behind; one in the same mode and scope joins. Once
// the exactly-once relays stopped, a relay at least once starts.
func TestModeMismatchRefusedAtStart(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		eos, eosRun := startModeRelay(t, e, newTxnBroker(), nil)
		eventually(t, ctx, "exactly-once relay ready", func() bool { return eos.Ready() == nil })

		for _, c := range []struct {
			name string
			pub  relay.Publisher
			want string
		}{
			{"at least once", outboxtest.NewPublisher(), `runs "at-least-once", live relay `},
			{"another scope", &txnBroker{scope: "elsewhere"}, `runs "exactly-once elsewhere", live relay `},
		} {
			_, run := startModeRelay(t, e, c.pub, nil)
			err := runError(t, run)
			if !errors.Is(err, relay.ErrModeMismatch) {
				t.Fatalf("%s: Run = %v, want ErrModeMismatch", c.name, err)
			}
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "(exactly-once txnBroker)") {
				t.Errorf("%s: error %q does not name both modes", c.name, err)
			}
			if n := liveMembers(t, e); n != 1 {
				t.Errorf("%s: %d membership rows after the refusal, want the exactly-once relay's only", c.name, n)
			}
		}

		same, sameRun := startModeRelay(t, e, newTxnBroker(), nil)
		eventually(t, ctx, "second exactly-once relay ready", func() bool { return same.Ready() == nil })
		stopRelay(t, same, sameRun)
		stopRelay(t, eos, eosRun)

		alo, aloRun := startModeRelay(t, e, outboxtest.NewPublisher(), nil)
		eventually(t, ctx, "at-least-once relay ready after the exactly-once ones left", func() bool { return alo.Ready() == nil })
		stopRelay(t, alo, aloRun)
	})
}

// TestModeMismatchNeverBothStart: relays in different modes started at
// the same moment never both run: each writes its membership before it
// looks for another mode, so at least one is refused.
func TestModeMismatchNeverBothStart(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		for round := 0; round < 5; round++ {
			a, aRun := startModeRelay(t, e, newTxnBroker(), nil)
			b, bRun := startModeRelay(t, e, outboxtest.NewPublisher(), nil)
			refused := 0
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			// Each either returns ErrModeMismatch from Run or becomes ready.
			for _, x := range []struct {
				r   *relay.Relay
				run chan error
			}{{a, aRun}, {b, bRun}} {
				for done := false; !done; {
					select {
					case err := <-x.run:
						if !errors.Is(err, relay.ErrModeMismatch) {
							t.Fatalf("round %d: Run = %v, want ErrModeMismatch or running", round, err)
						}
						refused++
						x.run <- nil // for the stop below
						done = true
					case <-ctx.Done():
						t.Fatalf("round %d: a relay neither started nor was refused", round)
					case <-time.After(5 * time.Millisecond):
						done = x.r.Ready() == nil
					}
				}
			}
			cancel()
			if refused == 0 {
				t.Fatalf("round %d: relays in two delivery modes both started", round)
			}
			stopRelay(t, a, aRun)
			stopRelay(t, b, bRun)
		}
	})
}

// TestModeMismatchLoggedWhileRunning: a relay that finds, at a heartbeat,
// a live relay in another mode (one whose membership lapsed and came back)
// logs it as an error; it keeps running.
func TestModeMismatchLoggedWhileRunning(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		log := &syncLog{}
		r, run := startModeRelay(t, e, newTxnBroker(), log)
		eventually(t, ctx, "ready", func() bool { return r.Ready() == nil })
		// The lapsed relay's membership, as its heartbeat writes it back.
		far := "'2999-01-01 00:00:00'"
		if tg.Dialect == driver.SQLite {
			far = "32503680000000" // Unix ms
		}
		if _, err := e.RelayDB.Exec("INSERT INTO " + e.Table + "_relay (instance_id, expires_at, mode) VALUES ('lapsed', " + far + ", 'at-least-once')"); err != nil {
			t.Fatal(err)
		}
		eventually(t, ctx, "the mismatch logged", func() bool {
			for _, l := range log.lines() {
				if l["level"] == "ERROR" && strings.HasPrefix(l["msg"].(string), "a relay in another delivery mode runs on this table") && l["other_instance"] == "lapsed (at-least-once)" {
					return true
				}
			}
			return false
		})
		if err := r.Ready(); err != nil {
			t.Errorf("Ready = %v after the mismatch, want the relay still running", err)
		}
		if _, err := e.RelayDB.Exec("DELETE FROM " + e.Table + "_relay WHERE instance_id = 'lapsed'"); err != nil {
			t.Fatal(err)
		}
		stopRelay(t, r, run)
	})
}

// TestExpiredMembershipsPruned: a relay deletes the membership rows of
// relays that were killed (expired for longer than MemberPruneAfter
// LeaseTTLs: 20 s here), and keeps the recently expired ones and the
// live ones.
func TestExpiredMembershipsPruned(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		e := testdb.New(t, tg, driver.Config{})
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		long, recent := "'2000-01-01 00:00:00'", "clock_timestamp() - interval '1 second'"
		switch tg.Dialect {
		case driver.SQLite:
			long, recent = "946684800000", "CAST(unixepoch('subsec') * 1000 AS INTEGER) - 1000"
		case driver.MySQL:
			recent = "UTC_TIMESTAMP(6) - INTERVAL 1 SECOND"
		}
		for id, at := range map[string]string{"killed-long-ago": long, "killed-just-now": recent} {
			if _, err := e.RelayDB.Exec("INSERT INTO " + e.Table + "_relay (instance_id, expires_at, mode) VALUES ('" + id + "', " + at + ", 'at-least-once')"); err != nil {
				t.Fatal(err)
			}
		}
		r, run := startModeRelay(t, e, outboxtest.NewPublisher(), nil)
		members := func() []string {
			return testdb.Column(t, ctx, e.RelayDB, "SELECT instance_id FROM "+e.Table+"_relay ORDER BY instance_id")
		}
		eventually(t, ctx, "the long-expired membership pruned", func() bool {
			m := members()
			return len(m) == 2 && m[0] == "killed-just-now" && m[1] != "killed-long-ago"
		})
		stopRelay(t, r, run)
	})
}
