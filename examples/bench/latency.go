package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/internal/kafkatest"
	"github.com/sqloutbox/outbox/relay"
)

// LatencyPoint is one offered load.
type LatencyPoint struct {
	OfferedPerSec  int     `json:"offered_per_sec"`
	AchievedPerSec float64 `json:"achieved_per_sec"`
	Events         int     `json:"events"`
	// Ack: Commit returned -> the broker acknowledged (relay.Observer.Published).
	AckP50Ms  float64 `json:"ack_p50_ms"`
	AckP99Ms  float64 `json:"ack_p99_ms"`
	AckP999Ms float64 `json:"ack_p999_ms"`
	// Recv: Commit returned -> a consumer received the record.
	RecvP50Ms  float64 `json:"recv_p50_ms"`
	RecvP99Ms  float64 `json:"recv_p99_ms"`
	RecvP999Ms float64 `json:"recv_p999_ms"`
	// CommitP50Ms is the writers' commit time at this load.
	CommitP50Ms float64 `json:"commit_p50_ms"`
}

// LatencyResult is part 2 (in-process relay).
type LatencyResult struct {
	Writers int            `json:"writers"`
	Seconds float64        `json:"seconds_per_load"`
	Points  []LatencyPoint `json:"points"`
}

func ms(d time.Duration) float64 { return round2(float64(d) / float64(time.Millisecond)) }

// runLatency offers each rate for dur (open loop: event k is due at
// start + k/rate, taken by one of `writers` goroutines, each in its own
// transaction inserting an order and emitting one event).
func runLatency(ctx context.Context, db *database, brokers []string, rates []int, dur time.Duration, writers int) (*LatencyResult, error) {
	env, err := db.newOutbox(ctx, "ob_latency", writers)
	if err != nil {
		return nil, err
	}
	defer env.close()
	orders := db.table("orders_latency")
	if _, err := env.plainApp.ExecContext(ctx, "CREATE TABLE "+orders+
		" (id VARCHAR(64) PRIMARY KEY, status VARCHAR(16) NOT NULL, amount_cents BIGINT NOT NULL)"); err != nil {
		return nil, err
	}
	insOrder := "INSERT INTO " + orders + " (id, status, amount_cents) VALUES (" + db.ph(1) + ", 'paid', " + db.ph(2) + ")"
	topic, err := topicFor(ctx, brokers, "lat-"+randomHex(3))
	if err != nil {
		return nil, err
	}
	cons, err := kafkatest.NewConsumer(brokers, []string{topic})
	if err != nil {
		return nil, err
	}
	defer cons.Close()
	pub, err := newPublisher(brokers, topic)
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	var mu sync.Mutex
	acks := map[string]time.Time{}
	obs := &observer{published: func(m relay.Message) {
		now := time.Now()
		mu.Lock()
		acks[m.MessageID] = now
		mu.Unlock()
	}}
	r, err := relay.New(env.relay, relay.Config{Dialect: db.dialect, Table: env.table, Publisher: pub,
		Wakeup: env.ob.Wakeup(), Observer: obs, Logger: quietLogger})
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(rctx) }()
	defer func() { cancel(); <-runErr }()

	res := &LatencyResult{Writers: writers, Seconds: dur.Seconds()}
	consumed := 0
	for _, rate := range rates {
		n := int(float64(rate) * dur.Seconds())
		commits := make([]time.Time, n)
		commitTook := make([]time.Duration, n)
		ids := make([]string, n)
		for k := range ids {
			ids[k] = fmt.Sprintf("lat-%d-%d", rate, k)
		}
		jobs := make(chan int, n)
		errc := make(chan error, writers)
		var wg sync.WaitGroup
		for w := 0; w < writers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range jobs {
					t := time.Now()
					tctx := outbox.NewContext(ctx)
					tx, err := env.app.BeginTx(tctx, nil)
					if err == nil {
						if _, err = tx.ExecContext(tctx, insOrder, ids[k], int64(k)); err == nil {
							if err = outbox.Emit(tctx, outbox.Event{ID: ids[k], AggregateType: "order", AggregateID: ids[k], Type: "order.paid", Payload: payload}); err == nil {
								err = tx.Commit()
							}
						}
						if err != nil {
							_ = tx.Rollback()
						}
					}
					if err != nil {
						select {
						case errc <- err:
						default:
						}
						continue
					}
					commits[k] = time.Now()
					commitTook[k] = commits[k].Sub(t)
				}
			}()
		}
		start := time.Now()
		for k := 0; k < n; k++ {
			due := start.Add(time.Duration(float64(k) / float64(rate) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
			jobs <- k
		}
		close(jobs)
		wg.Wait()
		select {
		case err := <-errc:
			return nil, fmt.Errorf("latency writer at %d/s: %w", rate, err)
		default:
		}
		last := start
		for _, c := range commits {
			if c.After(last) {
				last = c
			}
		}
		wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
		recs, err := cons.WaitForCount(wctx, consumed+n)
		wcancel()
		if err != nil {
			return nil, fmt.Errorf("latency at %d/s: %w", rate, err)
		}
		consumed = len(recs)
		recv := map[string]time.Time{}
		for _, rc := range recs {
			recv[rc.Headers["outbox-message-id"]] = rc.Received
		}
		var ack, rcv []time.Duration
		mu.Lock()
		for k, id := range ids {
			if a, ok := acks[id]; ok {
				ack = append(ack, a.Sub(commits[k]))
			}
			if c, ok := recv[id]; ok {
				rcv = append(rcv, c.Sub(commits[k]))
			}
		}
		mu.Unlock()
		res.Points = append(res.Points, LatencyPoint{
			OfferedPerSec: rate, Events: n,
			AchievedPerSec: round2(float64(n) / last.Sub(start).Seconds()),
			AckP50Ms:       ms(quantile(ack, 0.5)), AckP99Ms: ms(quantile(ack, 0.99)), AckP999Ms: ms(quantile(ack, 0.999)),
			RecvP50Ms: ms(quantile(rcv, 0.5)), RecvP99Ms: ms(quantile(rcv, 0.99)), RecvP999Ms: ms(quantile(rcv, 0.999)),
			CommitP50Ms: ms(quantile(commitTook, 0.5)),
		})
	}
	return res, nil
}
