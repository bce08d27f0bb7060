package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
)

// LatencyPoint is one offered load.
type LatencyPoint struct {
	// OfferedPerSec is the open-loop load; 0 for a closed loop (part
	// "burst"), whose writers are counted by Writers.
	OfferedPerSec  int     `json:"offered_per_sec"`
	Writers        int     `json:"writers,omitempty"`
	AchievedPerSec float64 `json:"achieved_per_sec"`
	Events         int     `json:"events"`
	// Ack: Commit returned -> the broker acknowledged (relay.Observer.Published;
	// for the seed relay: its synchronous SendMessage returned).
	AckP50Ms  float64 `json:"ack_p50_ms"`
	AckP99Ms  float64 `json:"ack_p99_ms"`
	AckP999Ms float64 `json:"ack_p999_ms"`
	AckMaxMs  float64 `json:"ack_max_ms"`
	// Recv: Commit returned -> a consumer in the bench process received
	// the record (kafkatest.Record.Received), for every event offered,
	// the ones committed last (the tail after the writers stopped) too.
	// These are the latency.
	RecvP50Ms  float64 `json:"recv_p50_ms"`
	RecvP99Ms  float64 `json:"recv_p99_ms"`
	RecvP999Ms float64 `json:"recv_p999_ms"`
	RecvMaxMs  float64 `json:"recv_max_ms"`
	// CommitP50Ms is the writers' commit time at this load.
	CommitP50Ms float64 `json:"commit_p50_ms"`
	// SeedRatio*: the seed relay's latency at the same offered load divided
	// by this one's (how many times lower this is); absent where the seed
	// was not run at this load, and on the seed's own points.
	SeedRatioAckP50  float64 `json:"seed_ratio_ack_p50,omitempty"`
	SeedRatioAckP99  float64 `json:"seed_ratio_ack_p99,omitempty"`
	SeedRatioRecvP50 float64 `json:"seed_ratio_recv_p50,omitempty"`
	SeedRatioRecvP99 float64 `json:"seed_ratio_recv_p99,omitempty"`
	// Claim* and Publish* (in-process relay only) split the relay's side
	// of the latency: the claim query (relay.Observer.Claimed) and the
	// Publish call to the broker (until every record of the batch was
	// acknowledged), per cycle, at this load; PublishBatchAvg is the mean
	// messages per Publish.
	// Claims counts the claims of the point (relay.Observer.Claimed reports
	// claims that returned rows, not empty ones).
	Claims          int     `json:"claims,omitempty"`
	ClaimP50Ms      float64 `json:"claim_p50_ms,omitempty"`
	ClaimP99Ms      float64 `json:"claim_p99_ms,omitempty"`
	ClaimMaxMs      float64 `json:"claim_max_ms,omitempty"`
	PublishP50Ms    float64 `json:"publish_p50_ms,omitempty"`
	PublishP99Ms    float64 `json:"publish_p99_ms,omitempty"`
	PublishBatchAvg float64 `json:"publish_batch_avg,omitempty"`
}

// phaseLog records the in-process relay's claim and Publish durations.
type phaseLog struct {
	mu      sync.Mutex
	claims  []time.Duration
	pubs    []time.Duration
	pubMsgs int
}

func (p *phaseLog) claimed(_ int, took time.Duration) {
	p.mu.Lock()
	p.claims = append(p.claims, took)
	p.mu.Unlock()
}

// fill moves what was recorded since the last call into pt.
func (p *phaseLog) fill(pt *LatencyPoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.claims) > 0 {
		pt.Claims = len(p.claims)
		pt.ClaimP50Ms, pt.ClaimP99Ms, pt.ClaimMaxMs = ms3(quantile(p.claims, 0.5)), ms3(quantile(p.claims, 0.99)), ms3(quantile(p.claims, 1))
	}
	if len(p.pubs) > 0 {
		pt.PublishP50Ms, pt.PublishP99Ms = ms(quantile(p.pubs, 0.5)), ms(quantile(p.pubs, 0.99))
		pt.PublishBatchAvg = round2(float64(p.pubMsgs) / float64(len(p.pubs)))
	}
	p.claims, p.pubs, p.pubMsgs = nil, nil, 0
}

// timedPublisher times each Publish into a phaseLog.
type timedPublisher struct {
	relay.Publisher
	log *phaseLog
}

// Unwrap implements relay.PublisherWrapper, so that the relay sees the
// exactly-once publisher's Reconciler through the timing.
func (t timedPublisher) Unwrap() relay.Publisher { return t.Publisher }

func (t timedPublisher) Publish(ctx context.Context, msgs []relay.Message) error {
	began := time.Now()
	err := t.Publisher.Publish(ctx, msgs)
	took := time.Since(began)
	t.log.mu.Lock()
	t.log.pubs = append(t.log.pubs, took)
	t.log.pubMsgs += len(msgs)
	t.log.mu.Unlock()
	return err
}

// LatencyResult is part 2 for one kind of relay: in-process (latency),
// standalone (latency_standalone) or the seed's (latency_seed); one run
// on a table of its own, or (Runs > 0) the medians of every run, point by
// point and figure by figure.
type LatencyResult struct {
	// Relay says which relay delivered and how it was woken.
	Relay string `json:"relay"`
	// Run is this run's number (1...), 0 in a median; Runs the number of
	// runs a median is of.
	Run     int            `json:"run,omitempty"`
	Runs    int            `json:"runs,omitempty"`
	Writers int            `json:"writers"`
	Seconds float64        `json:"seconds_per_load"`
	Points  []LatencyPoint `json:"points"`
	// Skipped names offered loads not run, and why.
	Skipped string `json:"skipped,omitempty"`
	// TableState is the outbox table before the first load (asserted
	// never analyzed); TableStateAfter after the last. Absent in a median.
	TableState      *TableState `json:"table_state,omitempty"`
	TableStateAfter *TableState `json:"table_state_after,omitempty"`
}

func ms(d time.Duration) float64 { return round2(float64(d) / float64(time.Millisecond)) }

// ms3 is d in milliseconds to the microsecond (claims take well under one).
func ms3(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// latencyRates are part 2's offered loads; seedRates the seed relay's.
var (
	latencyRates = []int{100, 1000, 5000}
	seedRates    = []int{100, 1000}
)

// ackLog records when the broker acknowledged each message ID (the first
// acknowledgement of an ID counts). One goroutine waits on it at a time.
type ackLog struct {
	mu   sync.Mutex
	at   map[string]time.Time
	err  error         // set by fail: no more acknowledgements will come
	wake chan struct{} // capacity 1: something changed
	dead chan struct{} // closed by fail
	once sync.Once
}

func newAckLog() *ackLog {
	return &ackLog{at: map[string]time.Time{}, wake: make(chan struct{}, 1), dead: make(chan struct{})}
}

func (a *ackLog) signal() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

func (a *ackLog) add(id string, t time.Time) {
	a.mu.Lock()
	if _, ok := a.at[id]; !ok {
		a.at[id] = t
	}
	a.mu.Unlock()
	a.signal()
}

// fail records that no more acknowledgements will come, and why.
func (a *ackLog) fail(err error) {
	a.once.Do(func() {
		a.mu.Lock()
		a.err = err
		a.mu.Unlock()
		close(a.dead)
	})
	a.signal()
}

func (a *ackLog) failure() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.err
}

func (a *ackLog) get(id string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.at[id]
	return t, ok
}

// wait blocks until every one of ids was acknowledged, ctx ends or fail
// was called.
func (a *ackLog) wait(ctx context.Context, ids []string) error {
	missing := ids
	for {
		a.mu.Lock()
		var rest []string
		for _, id := range missing {
			if _, ok := a.at[id]; !ok {
				rest = append(rest, id)
			}
		}
		err := a.err
		a.mu.Unlock()
		missing = rest
		if len(missing) == 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%d of %d acknowledgements missing: %w", len(missing), len(ids), err)
		}
		select {
		case <-a.wake:
		case <-ctx.Done():
			return fmt.Errorf("%d of %d acknowledgements missing: %w", len(missing), len(ids), ctx.Err())
		}
	}
}

// load is an open-loop load: event k of a rate is due at start + k/rate,
// taken by one of writers goroutines, each committing one transaction
// with one event per event (write). At rate 0 it is a closed loop of
// events events: every writer takes the next one as soon as it has
// committed the last.
type load struct {
	writers int
	dur     time.Duration
	events  int    // the closed loop's events (rate 0)
	prefix  string // message IDs are prefix-rate-k
	// write runs and commits one business transaction with event id.
	write func(ctx context.Context, id string, k int) error
	acks  *ackLog
	cons  receiver
	// settle bounds the wait, after the last commit, for every record to
	// be acknowledged and consumed.
	settle time.Duration
	// phases, if set, splits the relay's side per point (in-process).
	phases *phaseLog
}

// offer runs one rate (0: the closed loop) and measures it.
func (l *load) offer(ctx context.Context, rate int) (LatencyPoint, error) {
	n := max(int(float64(rate)*l.dur.Seconds()), 1)
	if rate <= 0 {
		n = max(l.events, 1)
	}
	commits := make([]time.Time, n)
	commitTook := make([]time.Duration, n)
	ids := make([]string, n)
	index := make(map[string]int, n)
	for k := range ids {
		ids[k] = fmt.Sprintf("%s-%d-%d", l.prefix, rate, k)
		index[ids[k]] = k
	}
	jobs := make(chan int, n)
	errc := make(chan error, l.writers)
	var wg sync.WaitGroup
	for w := 0; w < l.writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range jobs {
				t := time.Now()
				if err := l.write(ctx, ids[k], k); err != nil {
					select {
					case errc <- err:
					default:
					}
					continue
				}
				commits[k] = time.Now()
				commitTook[k] = commits[k].Sub(t)
			}
		}()
	}
	start := time.Now()
	pace := time.NewTimer(0)
	<-pace.C
offering:
	for k := 0; k < n; k++ {
		if rate <= 0 {
			select {
			case jobs <- k: // buffered for all n: the writers never wait for it
			case <-ctx.Done():
				break offering
			}
			continue
		}
		due := start.Add(time.Duration(float64(k) / float64(rate) * float64(time.Second)))
		if d := time.Until(due); d > 0 {
			// Pacing the open-loop load, not waiting for a condition.
			pace.Reset(d)
			select {
			case <-pace.C:
			case <-ctx.Done():
				break offering
			}
		}
		jobs <- k
	}
	close(jobs)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return LatencyPoint{}, err
	}
	select {
	case err := <-errc:
		return LatencyPoint{}, fmt.Errorf("writer at %d/s: %w", rate, err)
	default:
	}
	last := start
	for _, c := range commits {
		if c.After(last) {
			last = c
		}
	}

	wctx, wcancel := context.WithTimeout(ctx, l.settle)
	defer wcancel()
	go func() {
		select {
		case <-l.acks.dead: // e.g. the relay child exited: stop waiting at once
			wcancel()
		case <-wctx.Done():
		}
	}()
	recv := make([]time.Time, n)
	got := 0
	err := l.cons.waitSeen(wctx, func(id string, at time.Time) bool {
		if k, ok := index[id]; ok && recv[k].IsZero() {
			recv[k] = at
			got++
		}
		return got == n
	})
	if err == nil {
		err = l.acks.wait(wctx, ids)
	}
	if err != nil {
		if ferr := l.acks.failure(); ferr != nil {
			err = ferr
		}
		return LatencyPoint{}, fmt.Errorf("at %d/s, %d of %d records consumed: %w", rate, got, n, err)
	}
	ack := make([]time.Duration, n)
	rcv := make([]time.Duration, n)
	for k, id := range ids {
		a, _ := l.acks.get(id)
		ack[k] = a.Sub(commits[k])
		rcv[k] = recv[k].Sub(commits[k])
	}
	return LatencyPoint{
		OfferedPerSec: rate, Events: n,
		AchievedPerSec: round2(float64(n) / last.Sub(start).Seconds()),
		AckP50Ms:       ms(quantile(ack, 0.5)), AckP99Ms: ms(quantile(ack, 0.99)), AckP999Ms: ms(quantile(ack, 0.999)), AckMaxMs: ms(quantile(ack, 1)),
		RecvP50Ms: ms(quantile(rcv, 0.5)), RecvP99Ms: ms(quantile(rcv, 0.99)), RecvP999Ms: ms(quantile(rcv, 0.999)), RecvMaxMs: ms(quantile(rcv, 1)),
		CommitP50Ms: ms(quantile(commitTook, 0.5)),
	}, nil
}

// measure asserts that table was never analyzed, offers every rate in
// turn (run), and reads table's state again after the last.
func (l *load) measure(ctx context.Context, db *database, table string, res *LatencyResult, rates []int) error {
	var err error
	if res.TableState, err = db.tableState(ctx, table, variantNeverAnalyzed); err != nil {
		return err
	}
	if err := l.run(ctx, res, rates); err != nil {
		return err
	}
	res.TableStateAfter, err = db.tableState(ctx, table, "")
	return err
}

// run offers every rate in turn.
func (l *load) run(ctx context.Context, res *LatencyResult, rates []int) error {
	for _, rate := range rates {
		if l.phases != nil {
			l.phases.fill(&LatencyPoint{}) // drop what came before this load
		}
		p, err := l.offer(ctx, rate)
		if err != nil {
			return err
		}
		if l.phases != nil {
			l.phases.fill(&p)
		}
		res.Points = append(res.Points, p)
	}
	return nil
}

// latencyOrders creates the orders table orders_<name> and returns its
// INSERT (id, amount).
func latencyOrders(ctx context.Context, db *database, env *outboxEnv, name string) (string, error) {
	orders := db.table("orders_" + name)
	if _, err := env.plainApp.ExecContext(ctx, "CREATE TABLE "+orders+
		" (id VARCHAR(64) PRIMARY KEY, status VARCHAR(16) NOT NULL, amount_cents BIGINT NOT NULL)"); err != nil {
		return "", err
	}
	if err := db.conditionTables(ctx); err != nil {
		return "", err
	}
	return "INSERT INTO " + orders + " (id, status, amount_cents) VALUES (" + db.ph(1) + ", 'paid', " + db.ph(2) + ")", nil
}

// emitWriter returns a load's write: in a transaction on env.app (through
// the outbox wrapper), one order INSERT and Emit of one event.
func emitWriter(env *outboxEnv, insOrder string) func(ctx context.Context, id string, k int) error {
	return func(ctx context.Context, id string, k int) error {
		tctx := outbox.NewContext(ctx)
		tx, err := env.app.BeginTx(tctx, nil)
		if err != nil {
			return err
		}
		if _, err = tx.ExecContext(tctx, insOrder, id, int64(k)); err == nil {
			if err = outbox.Emit(tctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: id, Type: "order.paid", Payload: payload}); err == nil {
				return tx.Commit()
			}
		}
		_ = tx.Rollback()
		return err
	}
}

// latencyRig is what every part-2 run sets up for itself: an outbox table
// (and pools) of its own, an orders table, and a route of ep's (a topic,
// a stream, a queue) with its publisher and a consumer on it.
type latencyRig struct {
	env      *outboxEnv
	insOrder string // INSERT into the orders table: (id, amount)
	route    *route
}

// newLatencyRig sets up ob_<name>, orders_<name> and a route named after
// routePrefix; close undoes it.
func newLatencyRig(ctx context.Context, db *database, ep endpoint, name, routePrefix string, writers int, notify bool) (*latencyRig, error) {
	env, err := db.newOutboxNotify(ctx, "ob_"+name, writers, notify)
	if err != nil {
		return nil, err
	}
	rig := &latencyRig{env: env}
	if rig.insOrder, err = latencyOrders(ctx, db, env, name); err == nil {
		rig.route, err = ep.open(ctx, routePrefix, true)
	}
	if err != nil {
		env.close()
		return nil, err
	}
	return rig, nil
}

func (r *latencyRig) close() {
	r.route.close()
	r.env.close()
}

// runInBackground runs run until the returned stop is called; if run
// returns before that, acks fails with what stopped, so waiters give up
// at once.
func runInBackground(ctx context.Context, acks *ackLog, what string, run func(context.Context) error) (stop func()) {
	rctx, cancel := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() {
		err := run(rctx)
		if err == nil {
			err = fmt.Errorf("the relay stopped")
		}
		acks.fail(fmt.Errorf("%s: %w", what, err))
		runErr <- err
	}()
	return func() { cancel(); <-runErr }
}

// notifyNote says, on PostgreSQL with -nonotify, that the writers did not
// NOTIFY.
func notifyNote(db *database) string {
	if db.dialect == driver.Postgres && db.noNotify {
		return "; writers without NOTIFY (-nonotify: driver.Config.DisableNotify)"
	}
	return ""
}

// leasedObserver returns an observer calling o's funcs, and a channel
// closed once the relay runs and owns every partition (one relay on a
// fresh table takes them all in its first heartbeat).
func leasedObserver(o observer) (relay.Observer, <-chan struct{}) {
	up := make(chan struct{})
	var once sync.Once
	return &upObserver{observer: o, up: func() { once.Do(func() { close(up) }) }, partitions: partition.DefaultCount}, up
}

// waitUp waits until up is closed: the load starts once the relay owns
// every partition, so that no event waits for the relay's first leases.
func waitUp(ctx context.Context, up <-chan struct{}, acks *ackLog) error {
	t := time.NewTimer(60 * time.Second)
	defer t.Stop()
	select {
	case <-up:
		return nil
	case <-acks.dead:
		return acks.failure()
	case <-t.C:
		return fmt.Errorf("the relay did not own every partition within 60 s")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// settleFor bounds the wait for the last records of a load of dur.
func settleFor(dur time.Duration) time.Duration { return 60*time.Second + 2*dur }

// runLatency measures part 2 with the in-process relay, woken by the
// driver's post-commit signal (driver.Outbox.Wakeup), publishing with
// ep's publisher and measured by ep's consumer; tag ("" or e.g. "_nats")
// names the tables apart from other brokers'.
func runLatency(ctx context.Context, db *database, ep endpoint, rates []int, dur time.Duration, writers, run int, tag string) (*LatencyResult, error) {
	rig, err := newLatencyRig(ctx, db, ep, fmt.Sprintf("latency%s_%d", tag, run), "lat", writers, !db.noNotify)
	if err != nil {
		return nil, err
	}
	defer rig.close()
	env, pub := rig.env, rig.route.pub
	acks := newAckLog()
	phases := &phaseLog{}
	obs, up := leasedObserver(observer{published: func(m relay.Message) { acks.add(m.MessageID, time.Now()) }, claimed: phases.claimed})
	obs.(*upObserver).wal = db.source == "wal"
	cfg, dropSlot := db.withSource(env, relay.Config{Publisher: timedPublisher{pub, phases},
		Observer: obs, Logger: quietLogger})
	defer dropSlot()
	r, err := relay.New(env.ob, env.relay, cfg)
	if err != nil {
		return nil, err
	}
	defer runInBackground(ctx, acks, "in-process relay", r.Run)()
	if err := waitUp(ctx, up, acks); err != nil {
		return nil, err
	}

	res := &LatencyResult{Relay: "in-process relay.Relay, woken by driver.Outbox.Wakeup() after each commit" + notifyNote(db),
		Writers: writers, Seconds: dur.Seconds(), Run: run}
	l := &load{writers: writers, dur: dur, prefix: "lat", write: emitWriter(env, rig.insOrder), acks: acks, cons: rig.route.cons, settle: settleFor(dur), phases: phases}
	return res, l.measure(ctx, db, env.table, res, rates)
}

// runSeedLatency measures part 2 with the seed's relay (part 5) under the
// same open-loop load; the writers write the seed's way: one hand-written
// outbox INSERT in the transaction, on a pool without the outbox wrapper.
func runSeedLatency(ctx context.Context, db *database, brokers []string, rates []int, dur time.Duration, writers, run int, skipped string) (*LatencyResult, error) {
	rig, err := newLatencyRig(ctx, db, kafkaEndpoint{brokers: brokers}, fmt.Sprintf("seedlat_%d", run), "seedlat", writers, true)
	if err != nil {
		return nil, err
	}
	defer rig.close()
	env, insOrder := rig.env, rig.insOrder
	insOutbox := handwrittenInsert(db, env.table)
	// On SQLite the seed relay shares the writers' one connection, as the
	// in-process relay shares the application's pool.
	rdb := env.relay
	if db.dialect == driver.SQLite {
		rdb = env.plainApp
	}
	if err := seedIndex(ctx, db, env.table); err != nil {
		return nil, err
	}
	s, err := newSeedRelay(rdb, db.dialect, db.ph, env.table, brokers, rig.route.topic)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	acks := newAckLog()
	s.sent = acks.add
	defer runInBackground(ctx, acks, "seed relay", func(ctx context.Context) error {
		_, err := s.run(ctx, func(int) bool { return false })
		return err
	})()

	write := func(ctx context.Context, id string, k int) error {
		tx, err := env.plainApp.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err = tx.ExecContext(ctx, insOrder, id, int64(k)); err == nil {
			if err = handwrittenEvent(ctx, tx, insOutbox, id, id); err == nil {
				return tx.Commit()
			}
		}
		_ = tx.Rollback()
		return err
	}
	res := &LatencyResult{Relay: "seed relay in the bench process (part 5: poll, 1 s sleep after a batch of fewer than 100, per event one synchronous send then one UPDATE); writers: hand-written outbox INSERT without the outbox wrapper",
		Writers: writers, Seconds: dur.Seconds(), Skipped: skipped, Run: run}
	l := &load{writers: writers, dur: dur, prefix: "seed", write: write, acks: acks, cons: rig.route.cons, settle: settleFor(dur)}
	return res, l.measure(ctx, db, env.table, res, rates)
}

// seedRatios fills each point's SeedRatio* from the seed's point at the
// same offered load.
func seedRatios(r, seed *LatencyResult) {
	if r == nil || seed == nil {
		return
	}
	for i := range r.Points {
		p := &r.Points[i]
		for _, s := range seed.Points {
			if s.OfferedPerSec == p.OfferedPerSec {
				p.SeedRatioAckP50, p.SeedRatioAckP99 = ratio(s.AckP50Ms, p.AckP50Ms), ratio(s.AckP99Ms, p.AckP99Ms)
				p.SeedRatioRecvP50, p.SeedRatioRecvP99 = ratio(s.RecvP50Ms, p.RecvP50Ms), ratio(s.RecvP99Ms, p.RecvP99Ms)
			}
		}
	}
}
