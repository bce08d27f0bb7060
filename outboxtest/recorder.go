package outboxtest

import (
	"context"
	"fmt"
	"sync"
)

// Recorder collects records of any type R, in the order added, and lets
// tests wait until what it holds meets a condition: the collector behind
// the broker test kits' consumers (outboxtest/kafkatest, relay/nats/natstest,
// relay/rabbitmq/rabbitmqtest, relay/redis/redistest), for a kit or a
// consumer of your own. It is append-only: a record once added is never
// changed or removed, which is what lets [Recorder.Wait] hand its
// condition a view instead of a copy.
//
// The zero value is an empty Recorder whose errors start with
// "outboxtest"; [NewRecorder] names another prefix. Do not copy a
// Recorder after first use. Safe for concurrent use.
type Recorder[R any] struct {
	name string // starts error messages; "" is "outboxtest"

	mu      sync.Mutex
	recs    []R
	changed chan struct{} // closed and replaced on every Add; nil until needed
}

// NewRecorder returns an empty Recorder whose errors start with name and
// ": " (a kit passes its package name, e.g. "natstest"; "" stands for
// "outboxtest", as in the zero value).
func NewRecorder[R any](name string) *Recorder[R] {
	return &Recorder[R]{name: name}
}

func (r *Recorder[R]) prefix() string {
	if r.name == "" {
		return "outboxtest"
	}
	return r.name
}

// Add appends recs, in order, and wakes every [Recorder.Wait] once (not
// once per record). Adding nothing wakes nobody. Add keeps the records
// themselves, not copies of what they point to: do not modify a record's
// slices or maps after adding it.
func (r *Recorder[R]) Add(recs ...R) {
	if len(recs) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, recs...)
	if r.changed != nil {
		close(r.changed)
		r.changed = nil
	}
}

// Len returns how many records were added so far (duplicates counted).
func (r *Recorder[R]) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.recs)
}

// Records returns a copy of the records added so far, in the order added
// (nil if none).
func (r *Recorder[R]) Records() []R {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]R(nil), r.recs...)
}

// view returns the records so far, capped so that an append never writes
// into it, and the channel the next Add closes.
func (r *Recorder[R]) view() ([]R, chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.changed == nil {
		r.changed = make(chan struct{})
	}
	// Append-only: the first len elements never change, so the view is
	// safe to read after Unlock.
	return r.recs[:len(r.recs):len(r.recs)], r.changed
}

// Wait blocks until cond, called with the records so far once at the
// start and again after every [Recorder.Add], returns true, or ctx ends.
// It returns a copy of the records so far and, if ctx ended first, an
// error wrapping ctx's error (match it with errors.Is(err,
// context.DeadlineExceeded)) that says how many records there were. cond
// runs on the calling goroutine, one call at a time; it must not block,
// and must not modify the slice it is given: that is the Recorder's own
// (not copied on every change, so that waiting on a long run stays
// cheap); keep what it needs between calls, such as how far it has
// scanned (each call's slice extends the previous one's).
func (r *Recorder[R]) Wait(ctx context.Context, cond func([]R) bool) ([]R, error) {
	for {
		recs, ch := r.view()
		if cond(recs) {
			return append([]R(nil), recs...), nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return append([]R(nil), recs...), fmt.Errorf("%s: condition not met (%d records so far): %w", r.prefix(), len(recs), ctx.Err())
		}
	}
}

// WaitForCount waits, as [Recorder.Wait], until at least n records
// (duplicates counted) were added; n <= 0 returns at once.
func (r *Recorder[R]) WaitForCount(ctx context.Context, n int) ([]R, error) {
	return r.Wait(ctx, func(recs []R) bool { return len(recs) >= n })
}

// WaitForMessageIDs waits, as [Recorder.Wait], until a record of every
// given outbox message ID was added, and returns all records so far
// (those of other IDs and duplicates included). messageID returns a
// record's message ID and whether it has one (a kit's Record.MessageID
// method expression fits). Each record is looked at once, however long
// the wait. With no IDs it returns at once. If ctx ends first, the error
// says how many of the distinct IDs are still missing and wraps the error
// of [Recorder.Wait].
func (r *Recorder[R]) WaitForMessageIDs(ctx context.Context, messageID func(R) (string, bool), ids ...string) ([]R, error) {
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	got := make(map[string]bool, len(want))
	scanned, missing := 0, len(want)
	recs, err := r.Wait(ctx, func(recs []R) bool {
		for _, rec := range recs[scanned:] {
			if id, ok := messageID(rec); ok && want[id] {
				got[id] = true
			}
		}
		scanned = len(recs)
		missing = len(want) - len(got)
		return missing == 0
	})
	if err != nil {
		return recs, fmt.Errorf("%s: %d of %d message IDs not received: %w", r.prefix(), missing, len(want), err)
	}
	return recs, nil
}
