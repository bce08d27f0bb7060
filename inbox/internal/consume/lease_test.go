package consume

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// fakeLease is a lease whose answers the test sets.
type fakeLease struct {
	mu                                 sync.Mutex
	free                               bool  // Acquire succeeds
	renewOK                            bool  // Renew's answer
	renewErr                           error // Renew's error
	tries, acquired, renewed, released int
}

func (l *fakeLease) Acquire(context.Context) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tries++
	if !l.free {
		return false, nil
	}
	l.free = false
	l.acquired++
	return true, nil
}

func (l *fakeLease) Renew(context.Context) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.renewed++
	return l.renewOK, l.renewErr
}

func (l *fakeLease) Release(context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.released++
	return nil
}

func (l *fakeLease) set(f func(*fakeLease)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(l)
}

// counts are a fakeLease's calls.
type counts struct{ tries, acquired, renewed, released int }

func (l *fakeLease) get() counts {
	l.mu.Lock()
	defer l.mu.Unlock()
	return counts{tries: l.tries, acquired: l.acquired, renewed: l.renewed, released: l.released}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestLeadRunsOnlyWhileHeld: no session before the lease is free; a
// session that runs while renewals succeed; its context ends when a
// renewal says the lease is lost, and when renewals fail for longer than
// ttl·4/5; each time the lease is released and acquired again.
func TestLeadRunsOnlyWhileHeld(t *testing.T) {
	t.Parallel()
	const ttl = 300 * time.Millisecond
	l := &fakeLease{renewOK: true}
	ctx, cancel := context.WithCancel(context.Background())
	sessions := make(chan context.Context, 10)
	ends := make(chan time.Duration, 10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Lead(ctx, l, ttl, quiet(), func(sctx context.Context) error {
			start := time.Now()
			sessions <- sctx
			<-sctx.Done()
			ends <- time.Since(start)
			return nil
		})
	}()
	// Busy: Lead keeps trying, runs nothing.
	eventually(t, "a few acquire attempts", func() bool { return l.get().tries >= 3 })
	if len(sessions) != 0 {
		t.Fatal("a session ran without the lease")
	}
	l.set(func(l *fakeLease) { l.free = true })
	s1 := <-sessions
	eventually(t, "renewals", func() bool { return l.get().renewed >= 3 })
	if s1.Err() != nil {
		t.Fatal("the session ended while its renewals succeeded")
	}
	// Lost: the session ends at the next renewal; released, acquired again.
	l.set(func(l *fakeLease) { l.renewOK = false })
	<-s1.Done()
	eventually(t, "the lost lease released", func() bool { return l.get().released == 1 })
	// Renewals failing: the next session ends by ttl·4/5 after its start
	// at the latest (its last successful renewal), never later than ttl.
	l.set(func(l *fakeLease) { l.renewErr = errors.New("unreachable"); l.free = true })
	s2 := <-sessions
	if st := l.get(); st.acquired != 2 {
		t.Fatalf("after a loss: %+v, want acquired twice", st)
	}
	<-ends // s1's
	if last := <-ends; last >= ttl {
		t.Errorf("a session without successful renewals lasted %s, not below the lease's %s", last, ttl)
	}
	if s2.Err() == nil {
		t.Error("the session's context did not end")
	}
	cancel()
	<-done
}
