package relay_test

import (
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay"
)

// claimSizes records the size of every non-empty claim.
type claimSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (o *claimSizes) Published(relay.Message, time.Duration)        {}
func (o *claimSizes) Failed(relay.Message, relay.ErrorClass, error) {}
func (o *claimSizes) Retried(relay.Message, int, time.Duration)     {}
func (o *claimSizes) DeadLettered(relay.Message, error)             {}
func (o *claimSizes) Leases(int)                                    {}
func (o *claimSizes) Up(bool)                                       {}

func (o *claimSizes) Claimed(n int, _ time.Duration) {
	o.mu.Lock()
	o.sizes = append(o.sizes, n)
	o.mu.Unlock()
}

func (o *claimSizes) get() []int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.sizes)
}

func (o *claimSizes) sum() int {
	n := 0
	for _, s := range o.get() {
		n += s
	}
	return n
}

// TestBatchGrowsUnderBacklog: under a backlog the claim size doubles per
// full batch up to MaxBatchSize, and MaxBatchBytes at the batch's average
// message size; a short or empty claim sets it back to BatchSize.
func TestBatchGrowsUnderBacklog(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		payload  int
		maxBytes int
		first    int // events in the first backlog
		want     []int
	}{
		// 100, 200, 400, 400, 400 = 1,500; the empty claim after it
		// resets; then 150 more: 100 (full, grows), 50.
		{"size", 10, 0, 1500, []int{100, 200, 400, 400, 400, 100, 50}},
		// 1,000-byte payloads and 150,000 bytes: at most 150 per batch.
		{"bytes", 1000, 150000, 700, []int{100, 150, 150, 150, 150, 100, 50}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, tg := range []testdb.Target{testdb.All[0], testdb.All[3]} {
				t.Run(tg.Name, func(t *testing.T) {
					t.Parallel()
					obs := &claimSizes{}
					b := setup(t, tg, func(c *relay.Config) {
						c.Wakeup = nil // the test wakes it, once the backlog is committed
						c.PollInterval = time.Hour
						c.MinPollInterval = time.Hour
						c.BatchSize, c.MaxBatchSize, c.MaxBatchBytes = 100, 400, tc.maxBytes
						c.Observer = obs
						// A claim whose lease trust lapsed before its publish
						// is dropped and claimed again, which adds a size to
						// the list: under load (SQLite's one connection
						// shared with the 1,500-row commit, -race, a second
						// go test) heartbeats were seen late by more than the
						// default window. A minute's lease keeps trust.
						c.LeaseTTL = time.Minute
					})
					t.Cleanup(func() {
						if t.Failed() {
							t.Logf("claim sizes %v", obs.get())
						}
					})
					payload := []byte(`"` + strings.Repeat("x", tc.payload-2) + `"`)
					backlog := func(n int) {
						evs := make([]outbox.Event, n)
						for i := range evs {
							evs[i] = event("A", i)
							evs[i].ID = ""
							evs[i].Payload = payload
						}
						b.emit(t, evs...)
						b.r.Notify()
					}
					backlog(tc.first)
					if _, err := b.pub.WaitForCount(b.ctx, tc.first); err != nil {
						t.Fatalf("first backlog: %v", err)
					}
					eventually(t, b.ctx, "first backlog's claims reported", func() bool { return obs.sum() >= tc.first })
					backlog(150)
					if _, err := b.pub.WaitForCount(b.ctx, tc.first+150); err != nil {
						t.Fatalf("second backlog: %v", err)
					}
					eventually(t, b.ctx, "second backlog's claims reported", func() bool { return obs.sum() >= tc.first+150 })
					// The claim after the first backlog either found the
					// table empty (then the second starts again from
					// BatchSize: 100, 50) or, when it ran after the second
					// commit (SQLite shares one connection), all 150 in
					// one short claim.
					got := obs.get()
					alt := append(slices.Clone(tc.want[:len(tc.want)-2]), 150)
					if !slices.Equal(got, tc.want) && !slices.Equal(got, alt) {
						t.Fatalf("claim sizes %v, want %v or %v", got, tc.want, alt)
					}
				})
			}
		})
	}
}

func TestNextBatch(t *testing.T) {
	t.Parallel()
	cfg := relay.Config{BatchSize: 100, MaxBatchSize: 400, MaxBatchBytes: 100000}
	for _, tc := range []struct {
		limit, n, bytes, want int
	}{
		{100, 100, 1000, 200},    // full: doubles
		{200, 200, 2000, 400},    // full: doubles to the cap
		{400, 400, 4000, 400},    // full at the cap: stays
		{400, 399, 3990, 100},    // short: back to BatchSize
		{400, 0, 0, 100},         // empty: back to BatchSize
		{100, 100, 100000, 100},  // 1,000 bytes each: 100 fit, not 200
		{100, 100, 50000, 200},   // 500 bytes each: 200 fit
		{200, 200, 150000, 133},  // 750 bytes each: 133 fit
		{100, 100, 1000000, 100}, // 10,000 bytes each: never below BatchSize
		{100, 100, 0, 200},       // empty payloads: count cap only
	} {
		if got := relay.NextBatch(cfg, tc.limit, tc.n, tc.bytes); got != tc.want {
			t.Errorf("nextBatch(limit %d, n %d, bytes %d) = %d, want %d", tc.limit, tc.n, tc.bytes, got, tc.want)
		}
	}
}
