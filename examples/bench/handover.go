package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
)

// handoverRate is part "handover"'s offered load (issue 36, item 8: a
// handover from one relay to two under 1,000 events/s raised
// emit-to-consumer p99 to 1.5 s over 4,500 events).
const handoverRate = 1000

// HandoverResult is part "handover": the same open-loop load with one
// in-process relay throughout (steady: no lease moves) and with a second
// relay joining a third of the way in (join: half the partitions move to
// it while events flow), interleaved per run; the medians, and every run.
type HandoverResult struct {
	Steady *LatencyResult `json:"steady"`
	Join   *LatencyResult `json:"join"`
	// JoinTakeoverMs is the median time from the second relay's start
	// until it owned its share of the partitions.
	JoinTakeoverMs float64          `json:"join_takeover_ms"`
	Runs           []*LatencyResult `json:"runs"`
}

// runHandover runs part "handover" runs times, steady then join per run.
func runHandover(ctx context.Context, db *database, ep endpoint, dur time.Duration, writers, runs int, logf func(string, ...any)) (*HandoverResult, error) {
	res := &HandoverResult{}
	var steady, join []*LatencyResult
	var takeovers []time.Duration
	for run := 1; run <= runs; run++ {
		for _, joining := range []bool{false, true} {
			logf("part handover: %d events/s for %s, %d writers, second relay joining: %v, run %d of %d", handoverRate, dur, writers, joining, run, runs)
			l, took, err := runHandoverOnce(ctx, db, ep, dur, writers, run, joining)
			if err != nil {
				return nil, fmt.Errorf("handover (run %d, joining %v): %w", run, joining, err)
			}
			res.Runs = append(res.Runs, l)
			if joining {
				join = append(join, l)
				takeovers = append(takeovers, took)
			} else {
				steady = append(steady, l)
			}
		}
	}
	res.Steady, res.Join = medianLatency(steady), medianLatency(join)
	res.JoinTakeoverMs = ms(quantile(takeovers, 0.5))
	return res, nil
}

// shareObserver closes its channel once the relay owns at least want
// partitions.
type shareObserver struct {
	observer
	want  int
	once  sync.Once
	owned chan struct{}
}

func (o *shareObserver) Leases(n int) {
	if n >= o.want {
		o.once.Do(func() { close(o.owned) })
	}
}

// runHandoverOnce measures one load on a table of its own. With joining,
// a second relay on the same table starts a third of the way through the
// load; it returns how long that relay took to own its share.
func runHandoverOnce(ctx context.Context, db *database, ep endpoint, dur time.Duration, writers, run int, joining bool) (*LatencyResult, time.Duration, error) {
	name := fmt.Sprintf("handover_steady_%d", run)
	if joining {
		name = fmt.Sprintf("handover_join_%d", run)
	}
	rig, err := newLatencyRig(ctx, db, ep, name, "hand", writers, !db.noNotify)
	if err != nil {
		return nil, 0, err
	}
	defer rig.close()
	env, pub := rig.env, rig.route.pub
	acks := newAckLog()
	published := func(m relay.Message) { acks.add(m.MessageID, time.Now()) }
	obs, up := leasedObserver(observer{published: published})
	r, err := relay.New(env.ob, env.relay, relay.Config{Publisher: pub, Observer: obs, Logger: quietLogger, InstanceID: "first"})
	if err != nil {
		return nil, 0, err
	}
	defer runInBackground(ctx, acks, "first relay", r.Run)()
	if err := waitUp(ctx, up, acks); err != nil {
		return nil, 0, err
	}

	var took time.Duration
	var stopSecond func()
	var joinErr error
	joined := make(chan struct{})
	if joining {
		share := &shareObserver{observer: observer{published: published}, want: partition.DefaultCount / 2, owned: make(chan struct{})}
		second, err := relay.New(env.ob, env.relay, relay.Config{Publisher: pub, Observer: share, Logger: quietLogger, InstanceID: "second"})
		if err != nil {
			return nil, 0, err
		}
		// The join is placed a third of the way into the load: pacing, not
		// synchronisation.
		timer := time.AfterFunc(dur/3, func() {
			defer close(joined)
			began := time.Now()
			stopSecond = runInBackground(ctx, acks, "second relay", second.Run)
			select {
			case <-share.owned:
				took = time.Since(began)
			case <-acks.dead:
				joinErr = acks.failure()
			case <-ctx.Done():
				joinErr = ctx.Err()
			}
		})
		defer func() {
			if timer.Stop() {
				close(joined)
			}
			<-joined
			if stopSecond != nil {
				stopSecond()
			}
		}()
	}
	label := "in-process relay alone (no lease moves)"
	if joining {
		label = "in-process relay, a second relay joining a third of the way in (half the partitions move)"
	}
	res := &LatencyResult{Relay: label + notifyNote(db), Writers: writers, Seconds: dur.Seconds(), Run: run}
	l := &load{writers: writers, dur: dur, prefix: "hand", write: emitWriter(env, rig.insOrder), acks: acks, cons: rig.route.cons, settle: settleFor(dur)}
	if err := l.run(ctx, res, []int{handoverRate}); err != nil {
		return nil, 0, err
	}
	if joining {
		select {
		case <-joined:
		case <-ctx.Done():
			return nil, 0, ctx.Err()
		}
		if joinErr != nil {
			return nil, 0, fmt.Errorf("the second relay did not take its share: %w", joinErr)
		}
	}
	return res, took, nil
}
