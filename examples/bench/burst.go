package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sqloutbox/outbox/relay"
)

// burstWorkers are part "burst"'s default closed loops (-burst-writers):
// that many writers, each committing its next transaction as soon as its
// last one returned.
var burstWorkers = []int{16, 64}

// runBurst measures part "burst" (issue 26): the saturated closed loop the
// open-loop points of part 2 do not show. For each count of writers, on
// tables of its own, an in-process relay is started and, at the same
// moment, that many writers commit events transactions (one order INSERT
// and one event each) as fast as they can, as examples/quickstart's
// workers do and as a service bursts; the relay is not given time to take
// its leases first, so its start-up under load counts (a relay that took
// one commit per partition kept its first claim waiting 100-140 ms while
// the writers ran; BENCHMARKS.md). Each point reports commit -> consumer
// and commit -> ack latency over every event, the writers' achieved
// events/s, and the relay's claim and Publish durations.
func runBurst(ctx context.Context, db *database, ep endpoint, writers []int, events, run int) (*LatencyResult, error) {
	res := &LatencyResult{Run: run, Relay: "in-process relay.Relay, started together with the writers (closed loop: each writer commits its next transaction as soon as the last returned)" + notifyNote(db)}
	for _, w := range writers {
		p, err := burstPoint(ctx, db, ep, events, w, run)
		if err != nil {
			return nil, fmt.Errorf("%d writers: %w", w, err)
		}
		res.Points = append(res.Points, p)
	}
	return res, nil
}

// burstPoint runs one closed loop of workers writers on tables of its own.
func burstPoint(ctx context.Context, db *database, ep endpoint, events, workers, run int) (LatencyPoint, error) {
	rig, err := newLatencyRig(ctx, db, ep, fmt.Sprintf("burst%d_%d", workers, run), fmt.Sprintf("burst%d", workers), workers, !db.noNotify)
	if err != nil {
		return LatencyPoint{}, err
	}
	defer rig.close()
	acks := newAckLog()
	phases := &phaseLog{}
	cfg, dropSlot := db.withSource(rig.env, relay.Config{Publisher: timedPublisher{rig.route.pub, phases},
		Observer: &observer{published: func(m relay.Message) { acks.add(m.MessageID, time.Now()) }, claimed: phases.claimed}, Logger: quietLogger})
	defer dropSlot()
	r, err := relay.New(rig.env.ob, rig.env.relay, cfg)
	if err != nil {
		return LatencyPoint{}, err
	}
	defer runInBackground(ctx, acks, "in-process relay", r.Run)()
	l := &load{writers: workers, events: events, prefix: fmt.Sprintf("burst%d", workers), write: emitWriter(rig.env, rig.insOrder),
		acks: acks, cons: rig.route.cons, settle: settleFor(time.Duration(events) * time.Millisecond), phases: phases}
	p, err := l.offer(ctx, 0)
	if err != nil {
		return LatencyPoint{}, err
	}
	phases.fill(&p)
	p.Writers = workers
	return p, nil
}
