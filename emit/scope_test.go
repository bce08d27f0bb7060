package emit

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/google/uuid"
)

// ev returns a small valid event; id may be empty (generated).
func ev(id string) Event {
	return Event{ID: id, AggregateType: "order", AggregateID: "o-1", Type: "order.paid", Payload: []byte(`{"a":1}`)}
}

// bufferedIDs returns the IDs buffered in b without taking them.
func bufferedIDs(b *Batch) []string {
	b.scope.mu.Lock()
	defer b.scope.mu.Unlock()
	ids := make([]string, len(b.events))
	for i := range b.events {
		ids[i] = b.events[i].ID
	}
	return ids
}

// batchBytes returns b's running byte total.
func batchBytes(b *Batch) int {
	b.scope.mu.Lock()
	defer b.scope.mu.Unlock()
	return b.bytes
}

func mustEmit(t *testing.T, ctx context.Context, e Event) {
	t.Helper()
	if err := Emit(ctx, e); err != nil {
		t.Fatalf("Emit(%q): %v", e.ID, err)
	}
}

// notInvalidEvent asserts err is a transaction-level error, not a
// per-event validation error.
func notInvalidEvent(t *testing.T, err error) {
	t.Helper()
	var ve *ValidationError
	if errors.Is(err, ErrInvalidEvent) || errors.As(err, &ve) {
		t.Errorf("%v should not match ErrInvalidEvent / *ValidationError", err)
	}
}

func TestEmitNoScope(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if FromContext(ctx) != nil {
		t.Fatal("FromContext(Background) != nil")
	}
	err := Emit(ctx, ev(""))
	if !errors.Is(err, ErrNoTransaction) {
		t.Fatalf("Emit without scope = %v, want ErrNoTransaction", err)
	}
	notInvalidEvent(t, err)
	// Checked before validation: even an invalid event gets ErrNoTransaction.
	if err := Emit(ctx, Event{}); !errors.Is(err, ErrNoTransaction) {
		t.Errorf("Emit(zero Event) without scope = %v, want ErrNoTransaction", err)
	}
}

func TestEmitScopeWithoutTransaction(t *testing.T) {
	t.Parallel()
	ctx := NewContext(context.Background())
	if FromContext(ctx) == nil {
		t.Fatal("FromContext(NewContext(...)) = nil")
	}
	err := Emit(ctx, ev(""))
	if !errors.Is(err, ErrNoTransaction) {
		t.Fatalf("Emit with idle scope = %v, want ErrNoTransaction", err)
	}
	notInvalidEvent(t, err)
}

func TestEmitAfterTakeAndDiscard(t *testing.T) {
	t.Parallel()
	ctx := NewContext(context.Background())
	s := FromContext(ctx)

	b := s.Begin(Limits{})
	mustEmit(t, ctx, ev("m-1"))
	mustEmit(t, ctx, ev(""))
	got := b.Take()
	if len(got) != 2 || got[0].ID != "m-1" {
		t.Fatalf("Take = %d events (%v), want 2 starting with m-1", len(got), got)
	}
	if err := Emit(ctx, ev("")); !errors.Is(err, ErrNoTransaction) {
		t.Fatalf("Emit after Take = %v, want ErrNoTransaction", err)
	}
	if b.Len() != 0 {
		t.Errorf("Len after Take = %d", b.Len())
	}
	if again := b.Take(); len(again) != 0 {
		t.Errorf("second Take = %v, want none", again)
	}

	b = s.Begin(Limits{})
	mustEmit(t, ctx, ev(""))
	b.Discard()
	if err := Emit(ctx, ev("")); !errors.Is(err, ErrNoTransaction) {
		t.Fatalf("Emit after Discard = %v, want ErrNoTransaction", err)
	}
	if b.Len() != 0 {
		t.Errorf("Len after Discard = %d", b.Len())
	}
	b.Discard() // idempotent
}

func TestEmitConcurrentTransactions(t *testing.T) {
	t.Parallel()
	ctx := NewContext(context.Background())
	s := FromContext(ctx)
	b1 := s.Begin(Limits{})
	mustEmit(t, ctx, ev("before-second")) // only b1 open: goes to b1
	b2 := s.Begin(Limits{})

	err := Emit(ctx, ev(""))
	if !errors.Is(err, ErrConcurrentTransactions) {
		t.Fatalf("Emit with two open = %v, want ErrConcurrentTransactions", err)
	}
	if errors.Is(err, ErrNoTransaction) {
		t.Errorf("%v also matches ErrNoTransaction", err)
	}
	notInvalidEvent(t, err)
	if b1.Len() != 1 || b2.Len() != 0 {
		t.Fatalf("Len = %d, %d; want 1, 0", b1.Len(), b2.Len())
	}

	b3 := s.Begin(Limits{})
	if err := Emit(ctx, ev("")); !errors.Is(err, ErrConcurrentTransactions) {
		t.Fatalf("Emit with three open = %v", err)
	}
	b3.Discard()

	// Finishing one makes the other the scope's transaction again.
	b1.Discard()
	mustEmit(t, ctx, ev("into-b2"))
	if b2.Len() != 1 || b1.Len() != 0 {
		t.Fatalf("Len = %d (b1), %d (b2); want 0, 1", b1.Len(), b2.Len())
	}
	got := b2.Take()
	if len(got) != 1 || got[0].ID != "into-b2" {
		t.Fatalf("b2.Take = %v", got)
	}

	// Same with Take (commit) on the other order.
	b4 := s.Begin(Limits{})
	b5 := s.Begin(Limits{})
	if err := Emit(ctx, ev("")); !errors.Is(err, ErrConcurrentTransactions) {
		t.Fatalf("Emit = %v", err)
	}
	if evs := b5.Take(); len(evs) != 0 {
		t.Fatalf("b5 got %v", evs)
	}
	mustEmit(t, ctx, ev("into-b4"))
	if got := b4.Take(); len(got) != 1 || got[0].ID != "into-b4" {
		t.Fatalf("b4.Take = %v", got)
	}
}

func TestEmitSequentialTransactions(t *testing.T) {
	t.Parallel()
	ctx := NewContext(context.Background())
	s := FromContext(ctx)
	// Derived contexts share the scope.
	type k struct{}
	derived, cancel := context.WithCancel(context.WithValue(ctx, k{}, "v"))
	defer cancel()
	if FromContext(derived) != s {
		t.Fatal("derived context lost the scope")
	}

	var all []string
	for tx := 0; tx < 5; tx++ {
		b := s.Begin(Limits{})
		for i := 0; i <= tx; i++ {
			c := ctx
			if i%2 == 1 {
				c = derived
			}
			mustEmit(t, c, ev(fmt.Sprintf("tx%d-%d", tx, i)))
		}
		// The same ID as in an earlier transaction is not Emit's business
		// (the unique index rejects it at COMMIT).
		if tx > 0 {
			mustEmit(t, ctx, ev("tx0-0"))
		}
		got := b.Take()
		want := tx + 1
		if tx > 0 {
			want++
		}
		if len(got) != want {
			t.Fatalf("tx %d: Take = %d events, want %d", tx, len(got), want)
		}
		for i := 0; i <= tx; i++ {
			if id := fmt.Sprintf("tx%d-%d", tx, i); got[i].ID != id {
				t.Errorf("tx %d: event %d has ID %q, want %q", tx, i, got[i].ID, id)
			}
		}
		for _, e := range got {
			all = append(all, e.ID)
		}
		if err := Emit(ctx, ev("")); !errors.Is(err, ErrNoTransaction) {
			t.Fatalf("between transactions: %v", err)
		}
	}
	if len(all) != 1+2+3+4+5+4 {
		t.Errorf("total %d events", len(all))
	}

	// A nested NewContext has its own scope.
	inner := NewContext(ctx)
	if FromContext(inner) == s {
		t.Fatal("nested NewContext reused the outer scope")
	}
	b := s.Begin(Limits{})
	if err := Emit(inner, ev("")); !errors.Is(err, ErrNoTransaction) {
		t.Errorf("Emit in inner scope with only outer tx open = %v", err)
	}
	b.Discard()
}

func TestEmitDuplicateID(t *testing.T) {
	t.Parallel()
	checkDup := func(t *testing.T, err error, b *Batch, wantLen int) {
		t.Helper()
		checkRejected(t, err, "ID", ErrDuplicateID)
		if b.Len() != wantLen {
			t.Errorf("Len = %d after duplicate, want %d", b.Len(), wantLen)
		}
	}

	t.Run("supplied twice", func(t *testing.T) {
		t.Parallel()
		ctx := NewContext(context.Background())
		b := FromContext(ctx).Begin(Limits{})
		mustEmit(t, ctx, ev("m-1"))
		checkDup(t, Emit(ctx, ev("m-1")), b, 1)
		mustEmit(t, ctx, ev("m-2"))
		checkDup(t, Emit(ctx, ev("m-2")), b, 2)
		checkDup(t, Emit(ctx, ev("m-1")), b, 2)
		mustEmit(t, ctx, ev("M-1")) // IDs are case-sensitive
	})

	t.Run("supplied equals earlier generated", func(t *testing.T) {
		t.Parallel()
		ctx := NewContext(context.Background())
		b := FromContext(ctx).Begin(Limits{})
		mustEmit(t, ctx, ev(""))
		mustEmit(t, ctx, ev(""))
		mustEmit(t, ctx, ev(""))
		gen := bufferedIDs(b)
		checkDup(t, Emit(ctx, ev(gen[1])), b, 3)
		checkDup(t, Emit(ctx, ev(gen[0])), b, 3)
		mustEmit(t, ctx, ev("m-x"))
		checkDup(t, Emit(ctx, ev(gen[2])), b, 4)
	})

	t.Run("first event supplied", func(t *testing.T) {
		t.Parallel()
		ctx := NewContext(context.Background())
		b := FromContext(ctx).Begin(Limits{})
		mustEmit(t, ctx, ev("first"))
		mustEmit(t, ctx, ev("")) // generated after the ID set exists
		checkDup(t, Emit(ctx, ev("first")), b, 2)
		gen := bufferedIDs(b)[1]
		checkDup(t, Emit(ctx, ev(gen)), b, 2)
		mustEmit(t, ctx, ev("second"))
		checkDup(t, Emit(ctx, ev("second")), b, 3)
	})

	t.Run("rejected event does not reserve its ID", func(t *testing.T) {
		t.Parallel()
		ctx := NewContext(context.Background())
		b := FromContext(ctx).Begin(Limits{MaxEvents: 1})
		bad := ev("m-1")
		bad.Payload = []byte("{")
		if err := Emit(ctx, bad); !errors.Is(err, ErrPayloadNotJSON) {
			t.Fatalf("Emit(bad) = %v", err)
		}
		mustEmit(t, ctx, ev("m-1"))
		if err := Emit(ctx, ev("m-2")); !errors.Is(err, ErrTooManyEvents) {
			t.Fatalf("Emit over MaxEvents = %v", err)
		}
		if b.Len() != 1 {
			t.Fatalf("Len = %d", b.Len())
		}
	})

	t.Run("new transaction starts a fresh ID set", func(t *testing.T) {
		t.Parallel()
		ctx := NewContext(context.Background())
		s := FromContext(ctx)
		b := s.Begin(Limits{})
		mustEmit(t, ctx, ev("m-1"))
		b.Discard()
		b = s.Begin(Limits{})
		mustEmit(t, ctx, ev("m-1"))
		if b.Len() != 1 {
			t.Fatalf("Len = %d", b.Len())
		}
	})
}

func TestEmitMaxEvents(t *testing.T) {
	t.Parallel()
	ctx := NewContext(context.Background())
	b := FromContext(ctx).Begin(Limits{MaxEvents: 3})
	for i := 0; i < 3; i++ {
		mustEmit(t, ctx, ev(""))
	}
	before := batchBytes(b)
	err := Emit(ctx, ev(""))
	if !errors.Is(err, ErrTooManyEvents) {
		t.Fatalf("4th Emit = %v, want ErrTooManyEvents", err)
	}
	notInvalidEvent(t, err)
	if b.Len() != 3 || batchBytes(b) != before {
		t.Errorf("Len = %d, bytes = %d after rejection; want 3, %d", b.Len(), batchBytes(b), before)
	}
	if got := b.Take(); len(got) != 3 {
		t.Errorf("Take = %d events", len(got))
	}
}

func TestEmitMaxBytes(t *testing.T) {
	t.Parallel()
	one := ev("")
	if _, err := prepare(&one, Limits{}.WithDefaults()); err != nil {
		t.Fatal(err)
	}
	size := RecordSize(&one) // every ev("") has this size (IDs are 36 bytes)

	ctx := NewContext(context.Background())
	b := FromContext(ctx).Begin(Limits{MaxBytes: 3 * size, MaxRecordBytes: size})
	for i := 0; i < 3; i++ {
		mustEmit(t, ctx, ev("")) // exactly fills MaxBytes
	}
	if got := batchBytes(b); got != 3*size {
		t.Fatalf("bytes = %d, want %d", got, 3*size)
	}
	err := Emit(ctx, ev(""))
	if !errors.Is(err, ErrTransactionTooLarge) {
		t.Fatalf("Emit over MaxBytes = %v, want ErrTransactionTooLarge", err)
	}
	notInvalidEvent(t, err)
	if b.Len() != 3 || batchBytes(b) != 3*size {
		t.Errorf("Len = %d, bytes = %d after rejection", b.Len(), batchBytes(b))
	}

	// One byte short of a third event.
	ctx = NewContext(context.Background())
	b = FromContext(ctx).Begin(Limits{MaxBytes: 3*size - 1})
	mustEmit(t, ctx, ev(""))
	mustEmit(t, ctx, ev(""))
	if err := Emit(ctx, ev("")); !errors.Is(err, ErrTransactionTooLarge) {
		t.Fatalf("third Emit = %v, want ErrTransactionTooLarge", err)
	}
	// A smaller event still fits.
	small := ev("")
	small.Payload = []byte(`1`) // 6 bytes smaller
	mustEmit(t, ctx, small)
	if b.Len() != 3 {
		t.Errorf("Len = %d, want 3", b.Len())
	}
}

// TestEmitRejectionLeavesBatchUnchanged runs every kind of Emit error against
// a batch with events in it and checks nothing changed and the batch stays
// usable.
func TestEmitRejectionLeavesBatchUnchanged(t *testing.T) {
	t.Parallel()
	bad := func(mod func(*Event)) Event { e := ev(""); mod(&e); return e }
	rejects := []struct {
		name string
		ev   Event
		want error
	}{
		{"missing type", bad(func(e *Event) { e.Type = "" }), ErrMissingField},
		{"bad payload", bad(func(e *Event) { e.Payload = []byte(`{"a":`) }), ErrPayloadNotJSON},
		{"reserved header", bad(func(e *Event) { e.Headers = map[string]string{"Outbox-X": "1"} }), ErrReservedHeader},
		{"bad header value", bad(func(e *Event) { e.Headers = map[string]string{"x": "\xff"} }), ErrInvalidHeader},
		{"bad topic", bad(func(e *Event) { e.Topic = ".." }), ErrInvalidField},
		{"too large", bad(func(e *Event) { e.ContentType = "b"; e.Payload = make([]byte, 5000) }), ErrRecordTooLarge},
		{"duplicate ID", ev("dup"), ErrDuplicateID},
		{"over MaxBytes", bad(func(e *Event) { e.ContentType = "b"; e.Payload = make([]byte, 3500) }), ErrTransactionTooLarge},
	}

	ctx := NewContext(context.Background())
	b := FromContext(ctx).Begin(Limits{MaxBytes: 4000, MaxRecordBytes: 4000, MaxEvents: 10})
	mustEmit(t, ctx, ev("dup"))
	mustEmit(t, ctx, ev(""))
	wantIDs := bufferedIDs(b)
	wantBytes := batchBytes(b)
	for _, r := range rejects {
		err := Emit(ctx, r.ev)
		if !errors.Is(err, r.want) {
			t.Errorf("%s: Emit = %v, want %v", r.name, err, r.want)
		}
		if got := bufferedIDs(b); fmt.Sprint(got) != fmt.Sprint(wantIDs) || batchBytes(b) != wantBytes {
			t.Errorf("%s: batch changed to %v (%d bytes), want %v (%d bytes)", r.name, got, batchBytes(b), wantIDs, wantBytes)
		}
		if b.Len() != len(wantIDs) {
			t.Errorf("%s: Len = %d", r.name, b.Len())
		}
	}
	mustEmit(t, ctx, ev("after"))
	got := b.Take()
	if len(got) != 3 || got[0].ID != "dup" || got[2].ID != "after" {
		t.Errorf("Take = %v", got)
	}
}

func TestEmitGeneratedIDsAreOrderedUUIDv7(t *testing.T) {
	t.Parallel()
	ctx := NewContext(context.Background())
	b := FromContext(ctx).Begin(Limits{})
	const n = 500
	for i := 0; i < n; i++ {
		mustEmit(t, ctx, ev(""))
	}
	got := b.Take()
	if len(got) != n {
		t.Fatalf("Take = %d events", len(got))
	}
	var prevTime int64
	for i, e := range got {
		u := checkUUIDv7(t, e.ID)
		sec, nsec := u.Time().UnixTime()
		ms := sec*1000 + nsec/1e6
		if ms < prevTime {
			t.Errorf("event %d: timestamp %d ms before previous %d ms", i, ms, prevTime)
		}
		prevTime = ms
		if i > 0 {
			prev := uuid.MustParse(got[i-1].ID)
			if e.ID <= got[i-1].ID || string(u[:]) <= string(prev[:]) {
				t.Errorf("event %d: ID %s not greater than previous %s", i, e.ID, got[i-1].ID)
			}
		}
	}
}

func TestEmitCopiesPayloadAndHeaders(t *testing.T) {
	t.Parallel()
	ctx := NewContext(context.Background())
	b := FromContext(ctx).Begin(Limits{})

	payload := []byte(`{"a":1}`)
	headers := map[string]string{"k": "v", "gone": "x"}
	e := ev("m-1")
	e.Payload = payload
	e.Headers = headers
	mustEmit(t, ctx, e)

	payload[5] = '9'
	headers["k"] = "changed"
	headers["added"] = "y"
	delete(headers, "gone")
	if e.ID != "m-1" || e.ContentType != "" {
		t.Errorf("caller's Event changed: %+v", e)
	}

	raw := ev("m-2")
	raw.ContentType = "application/octet-stream"
	rawBytes := []byte{0, 1, 2, 0xff}
	raw.Payload = rawBytes
	mustEmit(t, ctx, raw)
	rawBytes[0] = 42

	got := b.Take()
	if string(got[0].Payload) != `{"a":1}` {
		t.Errorf("buffered payload = %q after caller mutation", got[0].Payload)
	}
	if len(got[0].Headers) != 2 || got[0].Headers["k"] != "v" || got[0].Headers["gone"] != "x" {
		t.Errorf("buffered headers = %v after caller mutation", got[0].Headers)
	}
	if string(got[1].Payload) != "\x00\x01\x02\xff" {
		t.Errorf("buffered raw payload = %q after caller mutation", got[1].Payload)
	}
	if got[0].ContentType != DefaultContentType || got[1].ContentType != "application/octet-stream" {
		t.Errorf("content types = %q, %q", got[0].ContentType, got[1].ContentType)
	}
}

func TestEmitConcurrent(t *testing.T) {
	t.Parallel()
	const goroutines, perG = 16, 200
	ctx := NewContext(context.Background())
	b := FromContext(ctx).Begin(Limits{})

	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < perG; i++ {
				e := Event{
					AggregateType: "order",
					AggregateID:   "g-" + strconv.Itoa(g),
					Type:          "seq",
					Payload:       []byte(strconv.Itoa(i)),
				}
				if i%3 == 0 {
					e.ID = fmt.Sprintf("g%d-%d", g, i)
				}
				if err := Emit(ctx, e); err != nil {
					errs <- err
					return
				}
				_ = b.Len() // concurrent readers too
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("concurrent Emit: %v", err)
	}
	got := b.Take()
	if len(got) != goroutines*perG {
		t.Fatalf("Take = %d events, want %d", len(got), goroutines*perG)
	}
	ids := make(map[string]bool, len(got))
	next := make(map[string]int)
	for _, e := range got {
		if ids[e.ID] {
			t.Fatalf("duplicate ID %q", e.ID)
		}
		ids[e.ID] = true
		seq, _ := strconv.Atoi(string(e.Payload))
		if seq != next[e.AggregateID] {
			t.Fatalf("%s: event %d buffered where %d was expected (per-goroutine order lost)", e.AggregateID, seq, next[e.AggregateID])
		}
		next[e.AggregateID]++
	}
	for g := 0; g < goroutines; g++ {
		if n := next["g-"+strconv.Itoa(g)]; n != perG {
			t.Errorf("goroutine %d: %d events, want %d", g, n, perG)
		}
	}
}

// TestEmitConcurrentWithBeginAndTake races Emit against transactions
// starting and ending in the same scope: every Emit either lands in exactly
// one batch or fails with a transaction-level error.
func TestEmitConcurrentWithBeginAndTake(t *testing.T) {
	t.Parallel()
	ctx := NewContext(context.Background())
	s := FromContext(ctx)

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		accepted int
		taken    int
		round    int
	)
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			b := s.Begin(Limits{})
			var extra *Batch
			if round++; round%4 == 0 {
				extra = s.Begin(Limits{}) // two open: Emit must refuse
			}
			for j := 0; j < 100 && b.Len() < 5; j++ {
				runtime.Gosched()
			}
			n := len(b.Take())
			if extra != nil {
				n += len(extra.Take())
			}
			mu.Lock()
			taken += n
			mu.Unlock()
		}
	}()
	var emitters sync.WaitGroup
	for g := 0; g < 8; g++ {
		emitters.Add(1)
		go func() {
			defer emitters.Done()
			for i := 0; i < 300; i++ {
				err := Emit(ctx, ev(""))
				switch {
				case err == nil:
					mu.Lock()
					accepted++
					mu.Unlock()
				case errors.Is(err, ErrNoTransaction), errors.Is(err, ErrConcurrentTransactions):
				default:
					t.Errorf("Emit: %v", err)
					return
				}
			}
		}()
	}
	emitters.Wait()
	close(stop)
	wg.Wait()
	if accepted != taken {
		t.Fatalf("accepted %d events, batches took %d", accepted, taken)
	}
	t.Logf("%d events accepted and taken while transactions came and went", accepted)
}

func TestLimitsWithDefaults(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want Limits
	}{
		{Limits{}, Limits{DefaultMaxRecordBytes, DefaultMaxEvents, DefaultMaxBytes}},
		{Limits{MaxRecordBytes: 100}, Limits{100, DefaultMaxEvents, DefaultMaxBytes}},
		{Limits{MaxEvents: 7}, Limits{DefaultMaxRecordBytes, 7, DefaultMaxBytes}},
		{Limits{MaxBytes: 1 << 30}, Limits{DefaultMaxRecordBytes, DefaultMaxEvents, 1 << 30}},
		{Limits{1, 2, 3}, Limits{1, 2, 3}},
		{Limits{-1, -2, -3}, Limits{-1, -2, -3}}, // negatives are kept (Validate reports them)
	}
	for _, tt := range tests {
		if got := tt.in.WithDefaults(); got != tt.want {
			t.Errorf("%+v.WithDefaults() = %+v, want %+v", tt.in, got, tt.want)
		}
	}
	if DefaultMaxRecordBytes != 1048588 || DefaultMaxEvents != 10000 || DefaultMaxBytes != 32<<20 {
		t.Errorf("defaults changed: %d %d %d", DefaultMaxRecordBytes, DefaultMaxEvents, DefaultMaxBytes)
	}
	// Begin applies defaults.
	b := (&Scope{}).Begin(Limits{MaxEvents: 5})
	if want := (Limits{DefaultMaxRecordBytes, 5, DefaultMaxBytes}); b.limits != want {
		t.Errorf("Begin limits = %+v, want %+v", b.limits, want)
	}
}

func TestLimitsValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		l    Limits
		ok   bool
	}{
		{"zero value", Limits{}, true},
		{"explicit defaults", Limits{DefaultMaxRecordBytes, DefaultMaxEvents, DefaultMaxBytes}, true},
		{"small record, default bytes", Limits{MaxRecordBytes: 1000}, true},
		{"MaxBytes equal MaxRecordBytes", Limits{MaxRecordBytes: 5000, MaxBytes: 5000}, true},
		{"MaxBytes one below MaxRecordBytes", Limits{MaxRecordBytes: 5000, MaxBytes: 4999}, false},
		{"MaxBytes below default MaxRecordBytes", Limits{MaxBytes: 1000}, false},
		{"MaxRecordBytes above default MaxBytes", Limits{MaxRecordBytes: DefaultMaxBytes + 1}, false},
		{"big record and big bytes", Limits{MaxRecordBytes: 8 << 20, MaxBytes: 64 << 20}, true},
		{"one event", Limits{MaxEvents: 1}, true},
		{"negative MaxRecordBytes", Limits{MaxRecordBytes: -1}, false},
		{"negative MaxEvents", Limits{MaxEvents: -1}, false},
		{"negative MaxBytes", Limits{MaxBytes: -1}, false},
		{"all negative", Limits{-1, -1, -1}, false},
	}
	for _, tt := range tests {
		err := tt.l.Validate()
		if tt.ok {
			if err != nil {
				t.Errorf("%s: Validate(%+v) = %v, want nil", tt.name, tt.l, err)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidField) {
			t.Errorf("%s: Validate(%+v) = %v, want ErrInvalidField", tt.name, tt.l, err)
		}
		if errors.Is(err, ErrInvalidEvent) {
			t.Errorf("%s: limits error %v matches ErrInvalidEvent", tt.name, err)
		}
	}
}
