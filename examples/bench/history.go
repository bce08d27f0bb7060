package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sqloutbox/outbox/relay"
)

// HistoryPoint is the claim cost with one amount of sent history.
type HistoryPoint struct {
	SentRows int `json:"sent_rows"`
	// ClaimMedianMicros is the median duration of the relay's claim
	// (relay.Observer.Claimed) over the batches draining HistoryPending
	// pending rows written after the history.
	ClaimMedianMicros float64 `json:"claim_median_us"`
	ClaimP99Micros    float64 `json:"claim_p99_us"`
	Claims            int     `json:"claims"`
	// SeedClaimMedianMicros is the seed's claim query (status = 0 ORDER BY
	// id LIMIT 100) on the same table before the drain, median of 21.
	SeedClaimMedianMicros float64 `json:"seed_claim_median_us"`
}

// HistoryResult is part 4.
type HistoryResult struct {
	Pending int            `json:"pending"`
	Points  []HistoryPoint `json:"points"`
	// Ratio is the claim median with the most history over the least.
	Ratio     float64 `json:"ratio"`
	SeedRatio float64 `json:"seed_ratio"`
}

func runHistory(ctx context.Context, db *database, brokers []string, sizes []int, pendingRows int) (*HistoryResult, error) {
	res := &HistoryResult{Pending: pendingRows}
	for _, h := range sizes {
		p, err := historyPoint(ctx, db, brokers, h, pendingRows)
		if err != nil {
			return nil, err
		}
		res.Points = append(res.Points, *p)
	}
	first, last := res.Points[0], res.Points[len(res.Points)-1]
	res.Ratio = ratio(last.ClaimMedianMicros, first.ClaimMedianMicros)
	res.SeedRatio = ratio(last.SeedClaimMedianMicros, first.SeedClaimMedianMicros)
	return res, nil
}

func historyPoint(ctx context.Context, db *database, brokers []string, hist, pendingRows int) (*HistoryPoint, error) {
	env, err := db.newOutbox(ctx, fmt.Sprintf("ob_hist_%d", hist), 1)
	if err != nil {
		return nil, err
	}
	defer env.close()
	if err := preload(ctx, db, env, hist, historyAggregates, true, "h-"); err != nil {
		return nil, err
	}
	if err := preload(ctx, db, env, pendingRows, historyAggregates, false, "p-"); err != nil {
		return nil, err
	}
	pt := &HistoryPoint{SentRows: hist}
	if err := seedIndex(ctx, db, env.table); err != nil {
		return nil, err
	}
	sel := "SELECT id, message_id, aggregate_type, aggregate_id, event_type, payload FROM " + env.table + " WHERE status = 0 ORDER BY id LIMIT 100"
	var seed []time.Duration
	for i := 0; i < 21; i++ {
		t := time.Now()
		rs, err := env.relay.QueryContext(ctx, sel)
		if err != nil {
			return nil, err
		}
		for rs.Next() {
		}
		if err := rs.Close(); err != nil {
			return nil, err
		}
		seed = append(seed, time.Since(t))
	}
	pt.SeedClaimMedianMicros = micros(quantile(seed, 0.5))

	pub, err := publisherFor(ctx, brokers, "hist-"+randomHex(3))
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	var mu sync.Mutex
	var claims []time.Duration
	sent := 0
	done := make(chan struct{})
	obs := &observer{
		claimed: func(n int, took time.Duration) {
			if n > 0 {
				mu.Lock()
				claims = append(claims, took)
				mu.Unlock()
			}
		},
		published: func(relay.Message) {
			mu.Lock()
			sent++
			if sent == pendingRows {
				close(done)
			}
			mu.Unlock()
		},
	}
	r, err := relay.New(env.ob, env.relay, relay.Config{Publisher: pub, Observer: obs, Logger: quietLogger})
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(rctx) }()
	defer func() { cancel(); <-runErr }()
	select {
	case <-done:
	case err := <-runErr:
		runErr <- err
		return nil, fmt.Errorf("relay stopped: %v", err)
	case <-time.After(5 * time.Minute):
		return nil, fmt.Errorf("history drain timed out")
	}
	mu.Lock()
	defer mu.Unlock()
	pt.Claims = len(claims)
	pt.ClaimMedianMicros = micros(quantile(claims, 0.5))
	pt.ClaimP99Micros = micros(quantile(claims, 0.99))
	return pt, nil
}
