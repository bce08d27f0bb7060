package relay

import (
	"time"
)

// claimFloor is the PostgreSQL claim's scan floor: the lowest id the
// claim's index walk starts at. Below it, no row of the partitions it
// covers is pending or can still become pending, so the walk never reads
// the index entries of the rows marked sent there since the last VACUUM
// (which PostgreSQL keeps in the pending index until VACUUM removes them;
// at 1,000 events/s without VACUUM they cost an idle claim milliseconds,
// and grow without bound). Owned by the relay's loop goroutine.
//
// The floor only moves up on a proof, taken in two claims (see
// 0006_claim_floor.sql):
//
//  1. A claim reads the id sequence's last value L and then takes a
//     transaction ID Y. The commit hook takes its transaction's ID
//     before it takes ids from the sequence (insert_row_first), so every
//     transaction holding an id <= L has an ID below Y.
//  2. A later claim finds the oldest running transaction ID >= Y: every
//     such transaction has ended, so every row with an id <= L is
//     committed or rolled back for good. The floor moves to the lowest
//     pending id of the covered partitions at or above the old floor, or
//     to L + 1 when there is none.
//
// A row that took a low id but commits late (a stalled COMMIT) is
// running at step 2, so the proof is not taken until it ends, and then
// the row is pending and holds the floor below its id: the floor is never
// "the last id seen". A long-running transaction anywhere on the server
// delays the proof (the floor stays where it is, and claims walk the
// entries of rows sent since); VACUUM could not remove those entries
// either while it runs.
//
// The floor drops back to 0 (the claim walks from the start once) when
// the relay's partitions or their lease epochs change (another instance
// may have had them), and when the table's floor epoch changes: every
// change that makes a row pending again raises it in its own transaction
// (DeadLetters.Retry), and the claim reads it in its own snapshot.
type claimFloor struct {
	floor   int64
	epoch   int64         // the table's floor epoch the floor was proven under
	covered map[int]int64 // partition -> lease epoch the floor covers
	proof   *floorProof   // step 1 taken, step 2 pending
	proofAt time.Time     // when the last proof was taken
}

// floorProof is step 1 of a floor proof.
type floorProof struct{ last, xid int64 }

// floorProofInterval spaces proofs: each takes a transaction ID (a
// commit record, no WAL flush). At most 100 a second per relay.
const floorProofInterval = 10 * time.Millisecond

// floorReport is what the claim function returned about the floor.
type floorReport struct {
	epoch      int64
	resolved   bool
	pendingMin int64 // -1: no pending row at or above the floor
	seqLast    int64 // -1: no new proof taken
	xid        int64 // -1: no new proof taken
}

// cover makes the floor valid for the partitions (and lease epochs) the
// claim is about to read: any partition it did not cover, or covered at
// another lease epoch, resets it to 0. Fewer partitions keep it, and the
// ones left out are no longer covered: a floor proven while a partition
// was left out says nothing about that partition's rows (the proof's
// lowest pending id is of the partitions claimed), so when it comes back,
// even under the same lease epoch (the exactly-once mode's reconcile
// leaves partitions out of a cycle when the trust window runs short; a
// failed release is renewed by the next heartbeat), the floor starts over.
func (f *claimFloor) cover(epochs map[int]int64) {
	for p, e := range epochs {
		if ce, ok := f.covered[p]; !ok || ce != e {
			f.floor = 0
			f.covered = make(map[int]int64, len(epochs))
			for p, e := range epochs {
				f.covered[p] = e
			}
			return
		}
	}
	for p := range f.covered {
		if _, ok := epochs[p]; !ok {
			delete(f.covered, p)
		}
	}
}

// args returns the claim's proof arguments: the pending proof's
// transaction ID (nil: none) and whether to take a new proof.
func (f *claimFloor) args(now time.Time) (check any, want bool) {
	if f.proof != nil {
		return f.proof.xid, false
	}
	return nil, now.Sub(f.proofAt) >= floorProofInterval
}

// update applies what a claim reported.
func (f *claimFloor) update(rep floorReport, now time.Time) {
	if rep.epoch != f.epoch {
		// Rows may be pending below the floor again: start over.
		f.floor, f.epoch, f.proof = 0, rep.epoch, nil
		return
	}
	if rep.resolved && f.proof != nil {
		next := f.proof.last + 1
		if rep.pendingMin >= 0 && rep.pendingMin < next {
			next = rep.pendingMin
		}
		f.floor = max(f.floor, next)
		f.proof = nil
	}
	if rep.xid >= 0 && f.proof == nil {
		f.proof = &floorProof{last: rep.seqLast, xid: rep.xid}
		f.proofAt = now
	}
}
