package relay

import (
	"context"
	"time"
)

// NextBatch exposes nextBatch to the external tests.
var NextBatch = nextBatch

// ClaimOnce runs one claim of up to n rows over partitions 0..count-1
// (lease epoch 1), as the loop does, scan floor included, and returns the
// claimed messages and the floor after the claim. Not safe beside Run.
func (r *Relay) ClaimOnce(ctx context.Context, n, count int) ([]Message, int64, error) {
	set := leaseSet{epochs: make(map[int]int64, count), trustedUntil: time.Now().Add(time.Hour)}
	for p := 0; p < count; p++ {
		set.epochs[p] = 1
	}
	r.batch = n
	msgs, err := r.claim(ctx, set)
	return msgs, r.floor.floor, err
}

// FloorEpoch is the table floor epoch the relay's floor was proven under.
func (r *Relay) FloorEpoch() int64 { return r.floor.epoch }

// OnLoopsStarted makes Run call fn once its background loops have started
// (before the first cycle). Call it before Run.
func (r *Relay) OnLoopsStarted(fn func()) { r.loopsStarted = fn }

// WALCounts returns how many rows the WAL source's cycles published from
// the stream and how many they claimed from the table.
func (r *Relay) WALCounts() (fromStream, fromTable int64) {
	return r.walPublished.Load(), r.walClaimed.Load()
}

// WALChecks returns how many rows from the stream the WAL source asked
// the database about, and how many it left out unasked because it had
// published them itself (being marked sent, or marked).
func (r *Relay) WALChecks() (checked, knownSent int64) {
	return r.walChecked.Load(), r.walKnownSent.Load()
}

// OnStream reports whether the WAL source vouches for its stream: the
// stream is open and the last claim from the table came back short.
func (r *Relay) OnStream() bool { return r.onStream.Load() }

// OnClaimedAhead makes each claim made while a batch is published call fn
// with its row count, on its own goroutine. Call it before Run.
func (r *Relay) OnClaimedAhead(fn func(n int)) { r.aheadHook = fn }

// NoLookahead makes the relay claim only after each publish. Call it
// before Run.
func (r *Relay) NoLookahead() { r.noLookahead = true }

// OnClaimed makes each MySQL/MariaDB claim that returned rows call fn
// before each of its looks for late rows (claimLate). Not safe beside Run.
func (r *Relay) OnClaimed(fn func()) { r.claimedHook = fn }

// LateRows is how many rows the MySQL/MariaDB claims' late-rows
// statements added.
func (r *Relay) LateRows() int64 { return r.lateRows.Load() }

// OnSlotCheck makes the WAL source call fn before it reads a slot it just
// created; an error of fn with SQLSTATE XX000 stands for the server's
// decoder failing on the slot. Call it before Run.
func (r *Relay) OnSlotCheck(fn func(slot string) error) { r.slotCheckHook = fn }

// RecreateUnreadableAfter sets how long the WAL source's streams must
// fail with a decoder error at one position before it recreates the slot
// (default 30 s). Call it before Run.
func (r *Relay) RecreateUnreadableAfter(d time.Duration) { r.unreadableAfter = d }

// OnRecreate makes the WAL source call fn before it reads again a slot
// whose streams kept failing, to decide whether to recreate it. Call it
// before Run.
func (r *Relay) OnRecreate(fn func(slot string)) { r.recreateHook = fn }

// OnCreateWALCheck makes CreateWAL call fn before it reads a slot it
// created; an error of fn (SQLSTATE XX000: the server's decoder failing)
// stands for the read's. It returns the function that removes fn; fn
// sees the slots of every test, and must return nil for others'.
func OnCreateWALCheck(fn func(slot string) error) (remove func()) {
	createWALCheckHook.Store(&fn)
	return func() { createWALCheckHook.Store(nil) }
}

// WarnSlotCreationAfter sets how long the WAL source's creation of a slot
// may wait before it logs a warning (default 10 s). Call it before Run.
func (r *Relay) WarnSlotCreationAfter(d time.Duration) { r.slotCreateSlow = d }
