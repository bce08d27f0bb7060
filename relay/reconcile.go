package relay

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Reconciler is implemented by a Publisher whose broker records, atomically
// with each publish, which outbox rows it carried, and can fence earlier
// publishers of a relay partition: relay/kafka's exactly-once mode, where
// each relay partition publishes through its own transactional producer and
// each batch is one Kafka transaction.
//
// With such a Publisher the relay:
//   - calls Reconcile for a relay partition before it claims from it the
//     first time under a lease epoch, and again after any outcome of its
//     own it did not learn (a Publish entry wrapping ErrOutcomeUnknown, a
//     mark-sent that failed or timed out); until Reconcile and the
//     mark-sent of the ids it returned succeed, it claims nothing from
//     that partition;
//   - marks the ids Reconcile returns sent (fenced by its lease, as any
//     mark-sent), so rows whose publish committed at the broker but were
//     never marked sent are not sent again;
//   - marks each published batch sent before it claims the next (no
//     pipelining of mark-sent: the broker keeps only the last publish's
//     record per partition, so the one before must be in the database
//     first).
type Reconciler interface {
	// Reconcile fences every earlier publisher of relay partition p
	// (after it returns, nothing published under an earlier epoch can
	// still commit) and returns the outbox ids of the last publish of p
	// that committed at the broker, ascending (none: nil). epoch is this
	// relay's lease epoch on p. An error leaves p unclaimed until a later
	// cycle reconciles it; one wrapping ErrUnavailable is logged and
	// alerted as a misconfiguration (for example a missing topic or
	// authorization).
	Reconcile(ctx context.Context, p int, epoch int64) (ids []int64, err error)
	// Reconciles reports whether the Publisher runs in the mode that
	// records its publishes; if false (relay/kafka without its
	// ExactlyOnce setting), the relay treats it as a plain Publisher and
	// never calls Reconcile. It must not change after New.
	Reconciles() bool
	// Scope names where the Publisher records its publishes (relay/kafka:
	// its state topic, which carries the transactional ID prefix and the
	// table). A relay stores its delivery mode, "exactly-once " + Scope,
	// in its membership row, and refuses to start beside live relays of
	// the table in another mode or scope (ErrModeMismatch): a relay that
	// does not read the same records would send again what another
	// committed. It must not change after New.
	Scope() string
}

// Delivery modes a relay stores in its membership row (<table>_relay.mode,
// schema version 7 on PostgreSQL, 5 on MySQL/MariaDB, 6 on SQLite).
const (
	// ModeAtLeastOnce is the mode of a relay whose Publisher is not a
	// reconciling Reconciler (every broker's default).
	ModeAtLeastOnce = "at-least-once"
	// ModeExactlyOncePrefix starts the mode of a relay whose Publisher
	// reconciles: "exactly-once " + Reconciler.Scope (a scope longer than
	// the column's 255 bytes is replaced by "sha256:" and its hex digest).
	ModeExactlyOncePrefix = "exactly-once "
)

// ErrModeMismatch is returned by Run, at start, when a live relay of the
// same table (its membership unexpired) runs in another delivery mode:
// one in the exactly-once mode beside one at least once, or two
// exactly-once relays with different scopes (relay/kafka: different
// transactional ID prefixes). Either would send again rows the other
// published, so the guarantee would silently fall to at least once. To
// change the mode, stop every relay of the table (a graceful stop leaves
// the group at once; a crashed relay's membership expires after LeaseTTL),
// then start the relays in the new mode. A relay that finds a mismatch
// later (a relay whose membership lapsed, for example one paused past its
// lease, came back in another mode) logs it as an error at the heartbeat
// that finds it (again whenever the other instance changes); it does not
// stop.
var ErrModeMismatch = errors.New("outbox/relay: a relay in another delivery mode runs on this table")

// modeOf is the delivery mode a relay with Reconciler rec stores.
func modeOf(rec Reconciler) string {
	if rec == nil {
		return ModeAtLeastOnce
	}
	m := ModeExactlyOncePrefix + rec.Scope()
	if len(m) > 255 {
		sum := sha256.Sum256([]byte(rec.Scope()))
		m = ModeExactlyOncePrefix + "sha256:" + hex.EncodeToString(sum[:])
	}
	return m
}

// Pipeliner is a Reconciler whose publishes can record the rows of the
// publish before them as well (relay/kafka's exactly-once mode: the
// transaction's manifest lists them), so that the relay marks one batch
// sent while it claims and publishes the next, as in the at-least-once
// mode, instead of marking each batch before the next claim.
//
// Before each Publish the relay calls Carry with the rows of the previous
// batch whose mark-sent has not been confirmed yet, by relay partition
// (ascending ids; nil when none): every transaction that Publish commits
// for a relay partition must record them beside its own rows, so that
// Reconcile, after a crash or an unknown outcome, returns them too. The
// relay confirms a mark before the Publish after the next (it waits for
// the mark-sent of one batch before it records the outcomes of the next),
// and in this mode its marks are durable (the database's commit waits for
// the WAL flush), so a confirmed row is never pending again after a
// database crash. Carry is called from the relay's loop only, never
// concurrently with Publish.
type Pipeliner interface {
	Reconciler
	Carry(ids map[int][]int64)
}

// PublisherWrapper is implemented by a Publisher that wraps another (for
// timing, logging, tracing): the relay looks through Unwrap for a
// Reconciler, so that wrapping relay/kafka's exactly-once publisher keeps
// the mode. A wrapper without Unwrap hides it, and the exactly-once
// publisher then fails every Publish (kafka.ErrNotReconciled).
type PublisherWrapper interface {
	Unwrap() Publisher
}

// reconcilerOf returns the Reconciler p is or wraps (through
// PublisherWrapper), if it reconciles; nil otherwise.
func reconcilerOf(p Publisher) Reconciler {
	for i := 0; p != nil && i < 100; i++ { // bounded: a wrapper that unwraps to itself
		if rec, ok := p.(Reconciler); ok {
			if rec.Reconciles() {
				return rec
			}
			return nil
		}
		w, ok := p.(PublisherWrapper)
		if !ok {
			return nil
		}
		p = w.Unwrap()
	}
	return nil
}

// ErrOutcomeUnknown fails a message whose publish may or may not have
// committed at the broker (a transaction commit that went unanswered and
// could not be resolved). The relay counts no attempt, leaves the message
// pending, backs off as a whole, and, if the Publisher is a Reconciler,
// reconciles the message's relay partition before it claims from it
// again; otherwise it re-sends the message (a possible duplicate, as for a
// *BatchError).
var ErrOutcomeUnknown = errors.New("outbox: publish outcome unknown")

// ErrFenced is wrapped, with ErrOutcomeUnknown, by the errors of a
// Reconciler Publisher whose producer of a relay partition was fenced: a
// later owner reconciled the partition, or the broker aborted a
// transaction left open too long. Nothing of the fenced transaction can
// commit any more; the relay reconciles the partition if it still owns it.
var ErrFenced = errors.New("outbox: publisher fenced")

// ErrAborted fails a message that was not delivered because the broker
// transaction that carried it was aborted for another message's failure
// (a transaction commits whole or not at all). The relay counts no
// attempt and holds nothing for it: it stays pending and is published
// again in the next cycle, behind the failed message's retry only if it
// belongs to the same aggregate.
var ErrAborted = errors.New("outbox: not delivered: its transaction was aborted")

// reconcileState is the loop's record of which partitions are reconciled,
// under which epoch. Only the Run goroutine uses it.
type reconcileState struct {
	done map[int]int64 // partition -> the lease epoch it was reconciled under
}

// reconcile reconciles the partitions of set that need it and returns set
// without those that could not be reconciled, and the first error (the
// loop then backs off). Partitions set no longer holds are forgotten, so
// a lease acquired again (a new epoch) is reconciled again.
func (r *Relay) reconcile(ctx context.Context, set leaseSet) (leaseSet, error) {
	if r.recon.done == nil {
		r.recon.done = map[int]int64{}
	}
	for p := range r.recon.done {
		if _, ok := set.epochs[p]; !ok {
			delete(r.recon.done, p)
		}
	}
	var todo []int
	for p, e := range set.epochs {
		if done, ok := r.recon.done[p]; !ok || done != e {
			todo = append(todo, p)
		}
	}
	if len(todo) == 0 {
		return set, nil
	}
	sort.Ints(todo)
	out := leaseSet{epochs: make(map[int]int64, len(set.epochs)), trustedUntil: set.trustedUntil}
	for p, e := range set.epochs {
		out.epochs[p] = e
	}
	for _, p := range todo {
		delete(out.epochs, p)
	}
	// Partitions are reconciled reconcileParallel at a time: each is a few
	// round trips to the broker (a fence and a read), and a starting relay
	// has all of its partitions to do.
	type result struct {
		p     int
		epoch int64
		err   error
	}
	results := make(chan result, len(todo))
	sem := make(chan struct{}, reconcileParallel)
	var wg sync.WaitGroup
	for _, p := range todo {
		epoch := set.epochs[p]
		// Within the trust window: a paused instance must not reconcile
		// (fence) for a partition it may have lost.
		budget := min(r.cfg.PublishTimeout, time.Until(set.trustedUntil))
		if budget <= 0 {
			break
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			rctx, cancel := context.WithTimeout(ctx, budget)
			defer cancel()
			ids, err := r.rec.Reconcile(rctx, p, epoch)
			if err == nil {
				err = r.markReconciledIDs(ctx, ids)
			} else {
				r.unavailable(err)
			}
			if err == nil {
				if to, ok := r.cfg.Observer.(TransactionObserver); ok {
					to.Reconciled(p, len(ids))
				}
			}
			if err == nil && len(ids) > 0 {
				r.log.Info("reconciled a relay partition: rows the broker committed are marked sent",
					"partition", p, "epoch", epoch, "rows", len(ids))
			}
			results <- result{p, epoch, err}
		}()
	}
	wg.Wait()
	close(results)
	var first error
	for res := range results {
		if res.err != nil {
			if first == nil {
				first = fmt.Errorf("reconciling relay partition %d: %w", res.p, res.err)
			}
			continue
		}
		r.recon.done[res.p] = res.epoch
		out.epochs[res.p] = res.epoch
	}
	if first == nil && len(out.epochs) > 0 {
		// Reconciling took time: the claim and publish that follow get the
		// trust window as renewed meanwhile, over the same partitions.
		fresh, _ := r.leases.snapshot()
		for p, e := range out.epochs {
			if fe, ok := fresh.epochs[p]; !ok || fe != e {
				delete(out.epochs, p)
			}
		}
		out.trustedUntil = fresh.trustedUntil
	}
	return out, first
}

// reconcileParallel is how many partitions reconcile at once.
const reconcileParallel = 8

// unreconcile makes the partitions of msgs reconcile again before their
// next claim (an outcome of theirs is unknown).
func (r *Relay) unreconcile(msgs []Message) {
	for i := range msgs {
		delete(r.recon.done, msgs[i].Partition)
	}
}

// observeTransactions tells a TransactionObserver the outcome of each
// relay partition's transaction in a Publish of msgs that returned perr.
func (r *Relay) observeTransactions(msgs []Message, perr error) {
	to, ok := r.cfg.Observer.(TransactionObserver)
	if !ok || len(msgs) == 0 {
		return
	}
	var pe PublishErrors
	perMessage := errors.As(perr, &pe) && len(pe) == len(msgs)
	type tally struct {
		n                       int
		failed, unknown, fenced bool
	}
	var order []int
	byPart := map[int]*tally{}
	for i := range msgs {
		p := msgs[i].Partition
		t := byPart[p]
		if t == nil {
			t = &tally{}
			byPart[p] = t
			order = append(order, p)
		}
		t.n++
		err := perr
		if perMessage {
			err = pe[i]
		}
		if err != nil {
			t.failed = true
			t.unknown = t.unknown || errors.Is(err, ErrOutcomeUnknown)
			t.fenced = t.fenced || errors.Is(err, ErrFenced)
		}
	}
	for _, p := range order {
		t := byPart[p]
		outcome := TxnCommitted
		switch {
		case t.fenced:
			outcome = TxnFenced
		case t.unknown:
			outcome = TxnUnknown
		case t.failed:
			outcome = TxnAborted
		}
		to.Transaction(p, outcome, t.n)
	}
}
