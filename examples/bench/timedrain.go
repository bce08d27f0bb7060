package main

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/sqloutbox/outbox/relay"
)

// drainTimer is what timeDrain measured.
type drainTimer struct {
	// Elapsed is from the relay's start until every event was
	// acknowledged and no row is pending.
	Elapsed time.Duration
	// From and To sample the CPU at the start and at that moment.
	From, To cpuTicks
}

// timeDrain runs r until done is closed (every one of events
// acknowledged: published counts them) and then until table holds no
// pending row (the background mark-sent of the last batch committed; no
// signal reports that, so the table is polled up to 60 s). It stops r
// before it returns. The deadline is events/500 + 60 s.
func timeDrain(ctx context.Context, r *relay.Relay, done <-chan struct{}, published func() int64, events int, db *sql.DB, table string) (drainTimer, error) {
	rctx, cancel := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	t := drainTimer{From: sampleCPU()}
	start := time.Now()
	go func() { runErr <- r.Run(rctx) }()
	stopped := false
	defer func() {
		cancel()
		if !stopped {
			<-runErr
		}
	}()
	select {
	case <-done:
	case err := <-runErr:
		stopped = true
		return t, fmt.Errorf("relay stopped: %v", err)
	case <-time.After(time.Duration(events/500+60) * time.Second):
		return t, fmt.Errorf("drain timed out after %d of %d events", published(), events)
	case <-ctx.Done():
		return t, ctx.Err()
	}
	marked := time.Now().Add(60 * time.Second)
	for {
		n, err := pending(ctx, db, table)
		if err != nil {
			return t, err
		}
		if n == 0 {
			break
		}
		if time.Now().After(marked) {
			return t, fmt.Errorf("%d rows still pending 60 s after the last acknowledgement", n)
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Elapsed = time.Since(start)
	t.To = sampleCPU()
	return t, nil
}
