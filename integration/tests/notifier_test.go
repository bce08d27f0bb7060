package tests

import (
	"context"
	"database/sql"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// TestNotifierWakesOtherProcessRelay: a relay in the role of another
// process (its own Outbox value, a Wakeup channel the writers never
// signal, PollInterval and MinPollInterval an hour, so only
// relay.ListenPostgres can wake it) publishes every event of many
// concurrent writers, round after round. Each round ends with nothing
// more committed, so the round's last commits are announced by the NOTIFY
// that covers them or never: a lost wake-up fails the round at its
// deadline (20 s, far below the hour's poll), not by timing. Writers run
// on lib/pq, pgx and pgx in simple-protocol mode; commit-to-publish
// latency is logged.
func TestNotifierWakesOtherProcessRelay(t *testing.T) {
	t.Parallel()
	for _, tg := range []testdb.Target{testdb.All[0], testdb.All[1], testdb.PgxSimple} {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			const writers, rounds, perRound = 16, 20, 2 // 640 events
			e := testdb.New(t, tg, driver.Config{Table: testdb.RandomName("w_"), Logger: quietLogger()})
			createOrders(t, e)
			ctx := testCtx(t, 3*time.Minute)

			// The other process: a separate Outbox value and pool.
			rob, err := driver.New(driver.Config{Dialect: driver.Postgres, Table: e.Table})
			if err != nil {
				t.Fatal(err)
			}
			pub := &stampingPublisher{Publisher: outboxtest.NewPublisher(), at: map[string]time.Time{}}
			r, err := relay.New(rob, e.RelayDB, relay.Config{
				Publisher: pub, Wakeup: make(chan struct{}), Logger: quietLogger(),
				PollInterval: time.Hour, MinPollInterval: time.Hour, Observer: outboxtest.WatchOrder(t, nil),
			})
			if err != nil {
				t.Fatal(err)
			}
			rr := &runningRelay{Relay: r, done: make(chan error, 1)}
			go func() { rr.done <- r.Run(ctx) }()
			t.Cleanup(func() { rr.stop(t) })
			eventually(t, ctx, "the relay ready", func() bool { return r.Ready() == nil })
			listening := make(chan struct{})
			var once sync.Once
			lctx, stopListen := context.WithCancel(ctx)
			listened := make(chan struct{})
			go func() {
				defer close(listened)
				_ = relay.ListenPostgres(lctx, rob, e.DSN, func() { once.Do(func() { close(listening) }); r.Notify() }, quietLogger())
			}()
			t.Cleanup(func() { stopListen(); <-listened })
			select {
			case <-listening:
			case <-ctx.Done():
				t.Fatal("ListenPostgres never connected")
			}

			var mu sync.Mutex
			committed := map[string]time.Time{}
			total := 0
			for round := 0; round < rounds; round++ {
				var wg sync.WaitGroup
				errs := make(chan error, writers)
				for w := 0; w < writers; w++ {
					wg.Add(1)
					go func(w int) {
						defer wg.Done()
						for i := 0; i < perRound; i++ {
							id := fmt.Sprintf("r%d-w%d-%d", round, w, i)
							err := inTx(ctx, e.DB, func(ctx context.Context, tx *sql.Tx) error {
								if _, err := tx.ExecContext(ctx, "INSERT INTO "+e.Q("orders")+" (id, seq) VALUES ($1, $2)", id, i); err != nil {
									return err
								}
								return outbox.Emit(ctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: fmt.Sprint(w), Type: "t", Payload: []byte(`{}`)})
							})
							if err != nil {
								errs <- err
								return
							}
							mu.Lock()
							committed[id] = time.Now()
							mu.Unlock()
						}
					}(w)
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
				total += writers * perRound
				rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				_, err := pub.Wait(rctx, func(ms []relay.Message) bool { return distinct(ms) >= total })
				cancel()
				if err != nil {
					t.Fatalf("round %d: %d of %d events published within 20 s (poll: 1 h): a commit's wake-up was lost", round, distinct(pub.Messages()), total)
				}
			}
			var lat []time.Duration
			pub.mu.Lock()
			defer pub.mu.Unlock()
			for id, at := range pub.at {
				lat = append(lat, at.Sub(committed[id]))
			}
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			t.Logf("%s: %d events of %d writers, commit -> publish p50 %v, p99 %v, max %v", tg.Name, len(lat), writers, lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1])
		})
	}
}

// distinct counts the distinct message IDs in ms.
func distinct(ms []relay.Message) int {
	seen := map[string]bool{}
	for _, m := range ms {
		seen[m.MessageID] = true
	}
	return len(seen)
}

// stampingPublisher records when each message ID was first published.
type stampingPublisher struct {
	*outboxtest.Publisher
	mu sync.Mutex
	at map[string]time.Time
}

func (p *stampingPublisher) Publish(ctx context.Context, msgs []relay.Message) error {
	now := time.Now()
	p.mu.Lock()
	for _, m := range msgs {
		if _, ok := p.at[m.MessageID]; !ok {
			p.at[m.MessageID] = now
		}
	}
	p.mu.Unlock()
	return p.Publisher.Publish(ctx, msgs)
}
