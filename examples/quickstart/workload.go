package main

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqloutbox/outbox"
)

// step is one transition of an order's life, each in its own transaction.
type step int

const (
	stepCreate step = iota
	stepPay
	stepShip
)

var stepEvent = [...]string{stepCreate: eventCreated, stepPay: eventPaid, stepShip: eventShipped}

// job asks a worker to run one step of one order.
type job struct {
	id     string
	step   step
	amount int64
}

// maxRetries bounds how often one transaction is re-run after a transient
// concurrency error (deadlock, serialization failure, busy database).
const maxRetries = 5

// workload runs every order through create, pay and ship with concurrent
// workers and records when each event's transaction committed.
type workload struct {
	db     *sql.DB
	orders *orders

	mu      sync.Mutex
	commits map[commitKey]time.Time

	txns    atomic.Int64
	retries atomic.Int64
}

// run creates, pays and ships every order in ids. All workers share one
// work channel; when an order's step commits, the worker enqueues the
// order's next step for any worker to pick up, so an order's steps are
// sequential (each begins after the previous one committed) while
// different orders interleave freely. It returns the first error that
// survived its retries, after all workers stopped.
func (w *workload) run(ctx context.Context, ids []string, amounts []int64, workers int) error {
	w.commits = make(map[commitKey]time.Time, 3*len(ids))
	if len(ids) == 0 {
		return nil
	}
	// At most one step per order is queued or running at any time, so a
	// buffer of len(ids) never blocks a send.
	work := make(chan job, len(ids))
	for i, id := range ids {
		work <- job{id: id, step: stepCreate, amount: amounts[i]}
	}
	var remaining atomic.Int64
	remaining.Store(int64(3 * len(ids)))

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		errOnce  sync.Once
		firstErr error
		wg       sync.WaitGroup
	)
	for range max(1, workers) {
		wg.Go(func() {
			for {
				var j job
				var ok bool
				select {
				case <-ctx.Done():
					return
				case j, ok = <-work:
					if !ok {
						return
					}
				}
				if err := w.do(ctx, j); err != nil {
					errOnce.Do(func() { firstErr = err })
					cancel()
					return
				}
				if j.step < stepShip {
					work <- job{id: j.id, step: j.step + 1, amount: j.amount}
				}
				if remaining.Add(-1) == 0 {
					close(work) // every step of every order committed
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// do runs one step's transaction, retrying transient failures.
func (w *workload) do(ctx context.Context, j job) error {
	for attempt := 0; ; attempt++ {
		err := w.tx(ctx, j)
		if err == nil {
			return nil
		}
		if !retryable(err) || attempt >= maxRetries {
			return fmt.Errorf("%s of order %s (attempt %d): %w", stepEvent[j.step], j.id, attempt+1, err)
		}
		w.retries.Add(1)
		t := time.NewTimer(time.Duration(attempt+1) * 2 * time.Millisecond) // back off before retrying
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// tx is one unit of work exactly as an application writes it: a fresh
// emit scope, BEGIN, domain code, COMMIT.
func (w *workload) tx(ctx context.Context, j job) error {
	err := outbox.InTx(ctx, w.db, func(ctx context.Context, tx *sql.Tx) error {
		switch j.step {
		case stepCreate:
			return w.orders.Create(ctx, tx, j.id, j.amount)
		case stepPay:
			return w.orders.Pay(ctx, tx, j.id)
		case stepShip:
			return w.orders.Ship(ctx, tx, j.id)
		}
		return nil
	})
	if err != nil {
		return err
	}
	at := time.Now() // the event is committed from here on
	w.txns.Add(1)
	w.mu.Lock()
	w.commits[commitKey{j.id, stepEvent[j.step]}] = at
	w.mu.Unlock()
	return nil
}
