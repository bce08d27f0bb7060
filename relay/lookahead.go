package relay

// Reading ahead: the claim of the next batch overlaps the publish of the
// current one.
//
// A draining relay's cycle was serial: claim a batch, publish it, record
// its outcomes (the mark-sent of the batch before runs beside the claim
// and the publish). On PostgreSQL the claim of a full batch took about
// half of each cycle (BENCHMARKS.md, "Issue 34: the pending set"), time
// in which the broker waited; during the publish the database waited.
// When a claim comes back full (more is likely pending), the cycle now
// starts the next claim on its own goroutine as the publish begins, and
// waits for it when the publish returns, before it records anything.
//
// What keeps this as safe as the serial cycle:
//   - The claim ahead leaves out the ids being published (and, as every
//     claim does, those being marked sent), so no row is in two batches.
//   - Its batch is used only if the batch published meanwhile was
//     acknowledged as a whole. A failure of any kind (a message refused,
//     a retry scheduled, the batch failed, an outcome unknown) drops it:
//     its rows stay pending and the next claim, made after the outcomes
//     are recorded, sees the holds and retry times they wrote. So an
//     aggregate never has a later event published past an earlier one
//     that failed.
//   - Per aggregate, the rows it holds come after the acknowledged
//     batch's rows in the claim's order, as a claim made after the
//     publish would return them: it was made after the claim of that
//     batch, under the same floor proof.
//   - It is used only under the same lease epochs for every partition
//     (the next cycle's snapshot): a partition given up, lost or taken in
//     between drops it; a stop drops it.
//   - The two goroutines share nothing while both run: the publish runs
//     the Publisher alone, the claim touches only the claim's state
//     (floor, claim connection, batch size).
//
// It is off with the WAL source (its stream reader has its own pace) and
// in the exactly-once mode of a Reconciler that is not a Pipeliner (that
// mode marks a batch sent before it claims the next).

import (
	"context"
	"maps"
	"time"
)

// aheadBatch is a batch claimed while the batch before it was published.
type aheadBatch struct {
	msgs   []Message
	limit  int           // the claim's size: len(msgs) == limit means more may wait
	epochs map[int]int64 // the lease epochs it was claimed under
	took   time.Duration // the claim's duration (Observer.Claimed)
}

// lookahead is a claim running while a batch is published.
type lookahead struct {
	done chan struct{}
	ab   *aheadBatch // set before done closes, if the claim returned rows
}

// readAhead starts claiming the batch after msgs (claimed with a limit of
// limit rows, under set) if msgs filled it, and returns the running claim,
// or nil if it does not read ahead.
func (r *Relay) readAhead(ctx context.Context, set leaseSet, msgs []Message, limit int) *lookahead {
	if r.noLookahead || len(msgs) < limit || r.wal != nil || (r.rec != nil && r.pipe == nil) {
		return nil
	}
	select {
	case <-r.stopping:
		return nil
	default:
	}
	ids := make([]int64, 0, len(msgs))
	for i := range msgs {
		ids = append(ids, msgs[i].ID)
	}
	la := &lookahead{done: make(chan struct{})}
	go func() {
		defer close(la.done)
		start, limit := time.Now(), r.batch // the claim's size (claimSkipping then sets the next)
		got, err := r.claimSkipping(ctx, set, ids)
		if err != nil {
			// The next cycle claims again and reports what still fails.
			r.log.Debug("claiming ahead failed", "error", err)
			return
		}
		if r.aheadHook != nil {
			r.aheadHook(len(got))
		}
		if len(got) > 0 {
			la.ab = &aheadBatch{msgs: got, limit: limit, epochs: set.epochs, took: time.Since(start)}
		}
	}()
	return la
}

// wait waits for the claim and returns its batch if use (the batch
// published meanwhile was acknowledged as a whole), else nil. A nil
// lookahead returns nil.
func (la *lookahead) wait(use bool) *aheadBatch {
	if la == nil {
		return nil
	}
	<-la.done
	if !use {
		return nil
	}
	return la.ab
}

// adoptAhead returns the batch read ahead, if any, its claim's size and
// its claim's duration, provided set holds the same partitions under the
// same lease epochs as when it was claimed; it is consumed either way.
func (r *Relay) adoptAhead(set leaseSet) ([]Message, int, time.Duration) {
	ab := r.ahead
	r.ahead = nil
	if ab == nil || !maps.Equal(ab.epochs, set.epochs) {
		return nil, 0, 0
	}
	return ab.msgs, ab.limit, ab.took
}
