package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/relay"
)

// soakRate is the soak's offered load, events/s (issue 12).
const soakRate = 1000

// SoakInterval is one interval (a minute by default) of the soak: the
// events due in it, and the claims the relay finished in it.
type SoakInterval struct {
	Index      int     `json:"interval"` // 1...
	EndSeconds float64 `json:"end_seconds"`
	Events     int     `json:"events"`
	// Recv*: Commit returned -> the bench's consumer received the record,
	// over the interval's events (each waited for, so its tail counts).
	RecvP50Ms   float64 `json:"recv_p50_ms"`
	RecvP99Ms   float64 `json:"recv_p99_ms"`
	RecvP999Ms  float64 `json:"recv_p999_ms"`
	RecvMaxMs   float64 `json:"recv_max_ms"`
	CommitP50Ms float64 `json:"commit_p50_ms"`
	// Claim*: every claim the relay finished in the interval
	// (relay.Observer.Claimed, which reports claims that returned rows).
	Claims     int     `json:"claims"`
	ClaimP50Ms float64 `json:"claim_p50_ms"`
	ClaimP99Ms float64 `json:"claim_p99_ms"`
	ClaimMaxMs float64 `json:"claim_max_ms"`
	// TableState is read at the interval's end (n_dead_tup and sizes on
	// PostgreSQL, the history list length on MariaDB).
	TableState *TableState `json:"table_state"`
}

// SoakResult is the -soak mode: soakRate events/s, one event per
// transaction, open loop, the in-process relay, on a table never analyzed
// and (PostgreSQL) with autovacuum off for it.
type SoakResult struct {
	Relay           string  `json:"relay"`
	Rate            int     `json:"rate_per_sec"`
	Writers         int     `json:"writers"`
	Seconds         float64 `json:"seconds"`
	IntervalSeconds float64 `json:"interval_seconds"`
	Events          int     `json:"events"`
	// TableState is the table before the load (asserted never analyzed).
	TableState *TableState     `json:"table_state"`
	Intervals  []*SoakInterval `json:"intervals"`
	// Overall figures, every event and every claim of the soak.
	RecvP50Ms  float64 `json:"recv_p50_ms"`
	RecvP99Ms  float64 `json:"recv_p99_ms"`
	RecvP999Ms float64 `json:"recv_p999_ms"`
	RecvMaxMs  float64 `json:"recv_max_ms"`
	Claims     int     `json:"claims"`
	ClaimP50Ms float64 `json:"claim_p50_ms"`
	ClaimP99Ms float64 `json:"claim_p99_ms"`
	ClaimMaxMs float64 `json:"claim_max_ms"`
	// WorstClaimP99Ms is the highest interval claim p99;
	// ClaimP99Under1msEvery whether every interval's was under 1 ms.
	WorstClaimP99Ms       float64 `json:"worst_interval_claim_p99_ms"`
	ClaimP99Under1msEvery bool    `json:"claim_p99_under_1ms_every_interval"`
}

// claimLog records when each claim finished and how long it took.
type claimLog struct {
	mu   sync.Mutex
	at   []time.Time
	took []time.Duration
}

func (c *claimLog) claimed(_ int, took time.Duration) {
	now := time.Now()
	c.mu.Lock()
	c.at = append(c.at, now)
	c.took = append(c.took, took)
	c.mu.Unlock()
}

// take removes and returns the claims that finished before until.
func (c *claimLog) take(until time.Time) []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := sort.Search(len(c.at), func(i int) bool { return !c.at[i].Before(until) })
	out := append([]time.Duration(nil), c.took[:i]...)
	c.at, c.took = c.at[i:], c.took[i:]
	return out
}

// soakConsumer records when each soak record was first received. It
// keeps no records (kafkatest.Consumer keeps them all, too many for a
// soak).
type soakConsumer struct {
	cl   *kgo.Client
	recv []atomic.Int64 // UnixNano by event index, 0 until received
	done chan struct{}
}

func newSoakConsumer(brokers []string, topic string, n int) (*soakConsumer, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(kafkatest.DefaultFetchMaxWait))
	if err != nil {
		return nil, err
	}
	c := &soakConsumer{cl: cl, recv: make([]atomic.Int64, n), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			fs := cl.PollFetches(context.Background())
			now := time.Now().UnixNano()
			if fs.IsClientClosed() {
				return
			}
			fs.EachRecord(func(r *kgo.Record) {
				for _, h := range r.Headers {
					if h.Key != "outbox-message-id" {
						continue
					}
					if s, ok := strings.CutPrefix(string(h.Value), "soak-"); ok {
						if k, err := strconv.Atoi(s); err == nil && k >= 0 && k < n {
							c.recv[k].CompareAndSwap(0, now)
						}
					}
				}
			})
		}
	}()
	return c, nil
}

func (c *soakConsumer) Close() {
	c.cl.Close()
	<-c.done
}

// runSoak offers rate events/s for dur with writers writers and the
// in-process relay, on a fresh table, and reports every interval (line
// gets each interval's line as it ends).
func runSoak(ctx context.Context, db *database, brokers []string, rate int, dur, every time.Duration, writers int, line func(string)) (*SoakResult, error) {
	env, err := db.newOutboxNotify(ctx, "ob_soak", writers, !db.noNotify)
	if err != nil {
		return nil, err
	}
	defer env.close()
	insOrder, err := latencyOrders(ctx, db, env, "soak")
	if err != nil {
		return nil, err
	}
	topic, err := topicFor(ctx, brokers, "soak-"+randomHex(3))
	if err != nil {
		return nil, err
	}
	n := max(int(float64(rate)*dur.Seconds()), 1)
	cons, err := newSoakConsumer(brokers, topic, n)
	if err != nil {
		return nil, err
	}
	defer cons.Close()
	pub, err := newPublisher(brokers, topic)
	if err != nil {
		return nil, err
	}
	defer pub.Close()
	res := &SoakResult{Relay: "in-process relay.Relay, woken by driver.Outbox.Wakeup() after each commit" + notifyNote(db),
		Rate: rate, Writers: writers, Seconds: dur.Seconds(), IntervalSeconds: every.Seconds(), Events: n, ClaimP99Under1msEvery: true}
	if res.TableState, err = db.tableState(ctx, env.table, variantNeverAnalyzed); err != nil {
		return nil, err
	}
	line("soak: table before: " + res.TableState.String())
	claims := &claimLog{}
	acks := newAckLog() // only its failure signal: the relay stopped
	obs, up := leasedObserver(observer{claimed: claims.claimed})
	r, err := relay.New(env.ob, env.relay, relay.Config{Publisher: pub, Observer: obs, Logger: quietLogger})
	if err != nil {
		return nil, err
	}
	defer runInBackground(ctx, acks, "in-process relay", r.Run)()
	if err := waitUp(ctx, up, acks); err != nil {
		return nil, err
	}

	write := emitWriter(env, insOrder)
	commits := make([]atomic.Int64, n) // UnixNano when Commit returned
	took := make([]atomic.Int64, n)    // commit duration, ns
	jobs := make(chan int, n)
	errc := make(chan error, 1)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range jobs {
				t := time.Now()
				if err := write(wctx, "soak-"+strconv.Itoa(k), k); err != nil {
					select {
					case errc <- fmt.Errorf("writer: %w", err):
					default:
					}
					wcancel()
					continue
				}
				c := time.Now()
				took[k].Store(int64(c.Sub(t)))
				commits[k].Store(c.UnixNano())
			}
		}()
	}
	defer func() { wcancel(); wg.Wait() }()
	start := time.Now()
	go func() {
		defer close(jobs)
		pace := time.NewTimer(0)
		<-pace.C
		for k := 0; k < n; k++ {
			due := start.Add(time.Duration(float64(k) / float64(rate) * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				// Pacing the open-loop load, not waiting for a condition.
				pace.Reset(d)
				select {
				case <-pace.C:
				case <-wctx.Done():
					return
				}
			}
			jobs <- k
		}
	}()

	var allRecv, allClaims []time.Duration
	intervals := int((dur + every - 1) / every)
	lo := 0
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for i := 1; i <= intervals; i++ {
		end := min(time.Duration(i)*every, dur)
		hi := n
		if i < intervals {
			hi = min(int(float64(rate)*end.Seconds()), n)
		}
		// Every event due in the interval must be committed and received;
		// the wait is bounded.
		deadline := start.Add(end).Add(settleFor(every))
		for k := lo; k < hi; {
			if commits[k].Load() != 0 && cons.recv[k].Load() != 0 {
				k++
				continue
			}
			select {
			case <-tick.C:
			case err := <-errc:
				return nil, err
			case <-acks.dead:
				return nil, acks.failure()
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("interval %d: event %d not received %s after the interval ended", i, k, settleFor(every))
			}
		}
		if d := time.Until(start.Add(end)); d > 0 {
			time.Sleep(d) // the interval's claims: those that finished before its end
		}
		iv := &SoakInterval{Index: i, EndSeconds: end.Seconds(), Events: hi - lo}
		recv := make([]time.Duration, 0, hi-lo)
		commitTook := make([]time.Duration, 0, hi-lo)
		for k := lo; k < hi; k++ {
			recv = append(recv, time.Duration(cons.recv[k].Load()-commits[k].Load()))
			commitTook = append(commitTook, time.Duration(took[k].Load()))
		}
		cl := claims.take(start.Add(end))
		iv.RecvP50Ms, iv.RecvP99Ms, iv.RecvP999Ms, iv.RecvMaxMs = ms(quantile(recv, 0.5)), ms(quantile(recv, 0.99)), ms(quantile(recv, 0.999)), ms(quantile(recv, 1))
		iv.CommitP50Ms = ms(quantile(commitTook, 0.5))
		iv.Claims = len(cl)
		iv.ClaimP50Ms, iv.ClaimP99Ms, iv.ClaimMaxMs = ms3(quantile(cl, 0.5)), ms3(quantile(cl, 0.99)), ms3(quantile(cl, 1))
		if iv.TableState, err = db.tableState(ctx, env.table, ""); err != nil {
			return nil, err
		}
		res.Intervals = append(res.Intervals, iv)
		allRecv, allClaims = append(allRecv, recv...), append(allClaims, cl...)
		res.WorstClaimP99Ms = max(res.WorstClaimP99Ms, iv.ClaimP99Ms)
		if iv.Claims == 0 || iv.ClaimP99Ms >= 1 {
			res.ClaimP99Under1msEvery = false
		}
		line(iv.String(intervals))
		lo = hi
	}
	res.RecvP50Ms, res.RecvP99Ms, res.RecvP999Ms, res.RecvMaxMs = ms(quantile(allRecv, 0.5)), ms(quantile(allRecv, 0.99)), ms(quantile(allRecv, 0.999)), ms(quantile(allRecv, 1))
	res.Claims = len(allClaims)
	res.ClaimP50Ms, res.ClaimP99Ms, res.ClaimMaxMs = ms3(quantile(allClaims, 0.5)), ms3(quantile(allClaims, 0.99)), ms3(quantile(allClaims, 1))
	return res, nil
}

// String is the interval's line of the soak's output.
func (iv *SoakInterval) String(of int) string {
	return fmt.Sprintf("soak %d/%d (%.0f s): %d events, recv p50 %.2f p99 %.2f p99.9 %.2f max %.2f ms, commit p50 %.2f ms; %d claims p50 %.3f p99 %.3f max %.3f ms; %s",
		iv.Index, of, iv.EndSeconds, iv.Events, iv.RecvP50Ms, iv.RecvP99Ms, iv.RecvP999Ms, iv.RecvMaxMs, iv.CommitP50Ms,
		iv.Claims, iv.ClaimP50Ms, iv.ClaimP99Ms, iv.ClaimMaxMs, iv.TableState)
}

func printSoakSummary(out io.Writer, s *SoakResult) {
	fmt.Fprintf(out, "soak: %d events at %d/s, %d writers, %s\n", s.Events, s.Rate, s.Writers, s.Relay)
	fmt.Fprintf(out, "soak: all events: recv p50 %.2f p99 %.2f p99.9 %.2f max %.2f ms; all %d claims: p50 %.3f p99 %.3f max %.3f ms\n",
		s.RecvP50Ms, s.RecvP99Ms, s.RecvP999Ms, s.RecvMaxMs, s.Claims, s.ClaimP50Ms, s.ClaimP99Ms, s.ClaimMaxMs)
	fmt.Fprintf(out, "soak: claim p99 < 1 ms in every interval: %v (worst interval %.3f ms)\n", s.ClaimP99Under1msEvery, s.WorstClaimP99Ms)
}
