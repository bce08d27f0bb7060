package outboxtest_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/outboxtest"
)

type rec struct {
	id string // message ID; "" is none
	n  int
}

func recID(r rec) (string, bool) { return r.id, r.id != "" }

func TestRecorderZeroValue(t *testing.T) {
	t.Parallel()
	var r outboxtest.Recorder[int]
	if got := r.Records(); got != nil || r.Len() != 0 {
		t.Fatalf("empty Records = %v, Len = %d", got, r.Len())
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	if got, err := r.WaitForCount(ctx, 0); err != nil || got != nil {
		t.Fatalf("WaitForCount(0) = %v, %v; want at once", got, err)
	}
	r.Add()
	r.Add(1, 2)
	r.Add(3)
	got := r.Records()
	if want := []int{1, 2, 3}; !reflect.DeepEqual(got, want) || r.Len() != 3 {
		t.Fatalf("Records = %v, Len = %d; want %v", got, r.Len(), want)
	}
	got[0] = 99
	if r.Records()[0] != 1 {
		t.Fatal("Records did not return a copy")
	}
}

// TestRecorderWaitDeadline: a condition never met ends with ctx's error,
// named after the Recorder, and the records so far.
func TestRecorderWaitDeadline(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		r      *outboxtest.Recorder[rec]
		prefix string
	}{{&outboxtest.Recorder[rec]{}, "outboxtest: "}, {outboxtest.NewRecorder[rec](""), "outboxtest: "}, {outboxtest.NewRecorder[rec]("mykit"), "mykit: "}} {
		tc.r.Add(rec{id: "a"}, rec{})
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
		got, err := tc.r.WaitForCount(ctx, 3)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || len(got) != 2 {
			t.Fatalf("WaitForCount(3) = %d records, %v; want 2 and the deadline", len(got), err)
		}
		if want := tc.prefix + "condition not met (2 records so far): context deadline exceeded"; err.Error() != want {
			t.Errorf("error %q, want %q", err, want)
		}
		ctx, cancel = context.WithCancel(t.Context())
		cancel()
		got, err = tc.r.WaitForMessageIDs(ctx, recID, "a", "b", "c", "b")
		if !errors.Is(err, context.Canceled) || len(got) != 2 {
			t.Fatalf("WaitForMessageIDs = %d records, %v; want 2 and context.Canceled", len(got), err)
		}
		if want := tc.prefix + "2 of 3 message IDs not received: " + tc.prefix + "condition not met"; !strings.HasPrefix(err.Error(), want) {
			t.Errorf("error %q, want it to start with %q", err, want)
		}
	}
}

// TestRecorderConcurrent: writers adding while waiters wait (run with
// -race); every waiter sees its condition met, each record exactly once,
// in the order its writer added them.
func TestRecorderConcurrent(t *testing.T) {
	t.Parallel()
	const writers, per = 4, 500
	r := outboxtest.NewRecorder[rec]("test")
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()

	var ids []string
	for w := range writers {
		for i := range per {
			ids = append(ids, fmt.Sprintf("w%d-%d", w, i))
		}
	}
	type result struct {
		recs []rec
		err  error
	}
	results := make(chan result, 3)
	go func() {
		recs, err := r.WaitForCount(ctx, writers*per)
		results <- result{recs, err}
	}()
	go func() {
		recs, err := r.WaitForMessageIDs(ctx, recID, ids...)
		results <- result{recs, err}
	}()
	go func() {
		// A condition that keeps state between calls: each call's slice
		// extends the previous one's.
		var prev []rec
		recs, err := r.Wait(ctx, func(recs []rec) bool {
			if len(recs) < len(prev) || !slices.Equal(recs[:len(prev)], prev) {
				panic("the view did not extend the previous one")
			}
			prev = recs
			return len(recs) >= writers*per
		})
		results <- result{recs, err}
	}()

	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := 0; i < per; i += 2 {
				r.Add(rec{id: fmt.Sprintf("w%d-%d", w, i), n: i}, rec{id: fmt.Sprintf("w%d-%d", w, i+1), n: i + 1})
				_ = r.Records() // readers while writing, for -race
			}
		})
	}
	wg.Wait()
	for range 3 {
		res := <-results
		if res.err != nil {
			t.Fatal(res.err)
		}
		if len(res.recs) != writers*per {
			t.Fatalf("waiter returned %d records, want %d", len(res.recs), writers*per)
		}
	}
	last := map[byte]int{}
	seen := map[string]bool{}
	for _, x := range r.Records() {
		w := x.id[1]
		if n, ok := last[w]; ok && x.n != n+1 {
			t.Fatalf("writer %c: %d after %d", w, x.n, n)
		}
		last[w] = x.n
		if seen[x.id] {
			t.Fatalf("%s twice", x.id)
		}
		seen[x.id] = true
	}
}

// TestRecorderWaitScansOnce: WaitForMessageIDs looks at each record once,
// however many changes it waits through, and returns all records so far.
func TestRecorderWaitScansOnce(t *testing.T) {
	t.Parallel()
	r := outboxtest.NewRecorder[rec]("test")
	var mu sync.Mutex
	calls := map[int]int{}
	id := func(x rec) (string, bool) {
		mu.Lock()
		calls[x.n]++
		mu.Unlock()
		return recID(x)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	done := make(chan []rec, 1)
	go func() {
		recs, err := r.WaitForMessageIDs(ctx, id, "c", "a")
		if err != nil {
			t.Error(err)
		}
		done <- recs
	}()
	for i, x := range []string{"a", "", "x", "a", "c"} {
		r.Add(rec{id: x, n: i})
	}
	recs := <-done
	if len(recs) != 5 {
		t.Fatalf("returned %d records, want all 5", len(recs))
	}
	mu.Lock()
	defer mu.Unlock()
	for n, c := range calls {
		if c != 1 {
			t.Errorf("record %d looked at %d times", n, c)
		}
	}
	if got, err := r.WaitForMessageIDs(ctx, recID); err != nil || len(got) != 5 {
		t.Errorf("WaitForMessageIDs() = %d records, %v; want all at once", len(got), err)
	}
}

// ExampleRecorder: a consumer's goroutine adds what it receives; the test
// waits for the message IDs it expects.
func ExampleRecorder() {
	type delivery struct{ messageID, body string }
	r := outboxtest.NewRecorder[delivery]("mykit")
	go func() {
		r.Add(delivery{"m-1", "paid"})
		r.Add(delivery{"m-2", "shipped"}, delivery{"m-1", "paid"})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := r.WaitForMessageIDs(ctx, func(d delivery) (string, bool) { return d.messageID, true }, "m-1", "m-2")
	fmt.Println(err)
	recs, _ := r.WaitForCount(ctx, 3)
	fmt.Println(len(recs), recs[1].body)
	// Output:
	// <nil>
	// 3 shipped
}
