// Command notifybench measures what the PostgreSQL wake-up NOTIFY costs the
// writers (issue 12, item 3): W writers (default 64) each commit, in a
// loop, one transaction of one business row and one outbox.Emit through
// the wrapped driver, for a fixed time, once with driver.Config's NOTIFY on
// (the default) and once with DisableNotify, alternating the order between
// runs. It prints commits/s, commit latency and the NOTIFYs a LISTENing
// connection received for each mode, every run, and the medians and their
// ratio. synchronous_commit must be on (it checks).
//
// With -relay it also runs a relay in the role of another process (its
// own Outbox value, Wakeup not the writers', PollInterval and
// MinPollInterval 1 h, woken only through relay.ListenPostgres) and
// reports commit-to-publish latency: from Commit returning in the writer
// to the relay's Publish call.
//
//	go run ./internal/testkit/notifybench -runs 5 -duration 10s
//	go run ./internal/testkit/notifybench -runs 3 -relay -rate 1000
//
// It creates a private schema on the server (-dsn, default
// $OUTBOX_TEST_POSTGRES or postgres://postgres@127.0.0.1:5432/test) and
// drops it at the end. It is a measurement tool, not part of the library.
package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	sqldriver "database/sql/driver"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/lib/pq"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/relay"
)

type options struct {
	dsn      string
	drv      string
	writers  int
	duration time.Duration
	warmup   time.Duration
	runs     int
	rate     int
	relay    bool
}

type result struct {
	mode      string
	commits   int64
	perSec    float64
	p50, p99  time.Duration
	notifies  int64
	claimP50  time.Duration
	claimP99  time.Duration
	claimMax  time.Duration
	published int
}

func main() {
	var o options
	def := os.Getenv("OUTBOX_TEST_POSTGRES")
	if def == "" {
		def = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	flag.StringVar(&o.dsn, "dsn", def, "PostgreSQL DSN")
	flag.StringVar(&o.drv, "driver", "pgx", "wrapped driver: pgx or pq")
	flag.IntVar(&o.writers, "writers", 64, "concurrent writers (one connection each)")
	flag.DurationVar(&o.duration, "duration", 10*time.Second, "measured time per mode and run")
	flag.DurationVar(&o.warmup, "warmup", 2*time.Second, "unmeasured time before each measurement")
	flag.IntVar(&o.runs, "runs", 5, "runs; each measures both modes")
	flag.IntVar(&o.rate, "rate", 0, "offered commits/s over all writers (0: as fast as they go)")
	flag.BoolVar(&o.relay, "relay", false, "also run a relay woken only by ListenPostgres and report commit-to-publish latency")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "notifybench:", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ctx := context.Background()
	admin, err := sql.Open("pgx", o.dsn)
	if err != nil {
		return err
	}
	defer admin.Close()
	var sc, version string
	if err := admin.QueryRowContext(ctx, "SELECT current_setting('synchronous_commit'), current_setting('server_version')").Scan(&sc, &version); err != nil {
		return err
	}
	if sc != "on" {
		return fmt.Errorf("synchronous_commit is %q, want on", sc)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	schema := "nb_" + hex.EncodeToString(b)
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		return err
	}
	defer admin.ExecContext(context.Background(), "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck
	// A table of its own (its NOTIFY channel is "<schema>.<name>_wakeup").
	base := "nb_" + hex.EncodeToString(b)
	table := schema + "." + base
	if _, err := admin.ExecContext(ctx, "CREATE TABLE "+schema+".orders (id bigserial PRIMARY KEY, writer int NOT NULL, n bigint NOT NULL)"); err != nil {
		return err
	}
	if err := driver.Migrate(ctx, admin, driver.Config{Dialect: driver.Postgres, Table: table}); err != nil {
		return err
	}
	d, err := dialect.New(dialect.Postgres, table)
	if err != nil {
		return err
	}
	channel := d.Channel()
	fmt.Printf("PostgreSQL %s, synchronous_commit=%s, driver %s, %d writers, %v per mode (after %v warm-up), rate %s, relay %v\n",
		version, sc, o.drv, o.writers, o.duration, o.warmup, rateString(o.rate), o.relay)

	var all = map[string][]result{}
	for i := 0; i < o.runs; i++ {
		modes := []bool{true, false}
		if i%2 == 1 {
			modes = []bool{false, true}
		}
		for _, notify := range modes {
			// The server is shared: a measurement that could not connect
			// (too many clients) is repeated, up to six times, 20 s apart.
			var r result
			for try := 1; ; try++ {
				r, err = measure(ctx, o, admin, schema, table, channel, notify)
				if err == nil {
					break
				}
				if try == 6 {
					return err
				}
				fmt.Printf("# run %d: %v; measuring again\n", i+1, err)
				time.Sleep(20 * time.Second)
			}
			all[r.mode] = append(all[r.mode], r)
			fmt.Printf("run %d %-9s %7.0f commits/s  commit p50 %6.2f ms p99 %6.2f ms  NOTIFYs received %6d", i+1, r.mode, r.perSec, ms(r.p50), ms(r.p99), r.notifies)
			if o.relay {
				fmt.Printf("  commit->publish p50 %6.2f ms p99 %6.2f ms max %6.2f ms (%d published)", ms(r.claimP50), ms(r.claimP99), ms(r.claimMax), r.published)
			}
			fmt.Println()
		}
	}
	med := func(mode string) (float64, []string) {
		var v []float64
		var s []string
		for _, r := range all[mode] {
			v = append(v, r.perSec)
			s = append(s, fmt.Sprintf("%.0f", r.perSec))
		}
		sort.Float64s(v)
		if len(v)%2 == 1 {
			return v[len(v)/2], s
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2, s
	}
	n, ns := med("notify")
	x, xs := med("nonotify")
	fmt.Printf("median commits/s: notify %.0f (%s), nonotify %.0f (%s); notify/nonotify = %.3f (%+.1f %%)\n",
		n, strings.Join(ns, ", "), x, strings.Join(xs, ", "), n/x, (n/x-1)*100)
	// The ratio within each run (its two modes ran back to back) is less
	// exposed to load that drifts over minutes than the ratio of medians.
	var ratios []float64
	var rs []string
	for i := range all["notify"] {
		r := all["notify"][i].perSec / all["nonotify"][i].perSec
		ratios = append(ratios, r)
		rs = append(rs, fmt.Sprintf("%.3f", r))
	}
	sort.Float64s(ratios)
	mr := ratios[len(ratios)/2]
	if len(ratios)%2 == 0 {
		mr = (ratios[len(ratios)/2-1] + ratios[len(ratios)/2]) / 2
	}
	fmt.Printf("per-run notify/nonotify: %s; median %.3f (%+.1f %%)\n", strings.Join(rs, ", "), mr, (mr-1)*100)
	return nil
}

func rateString(r int) string {
	if r == 0 {
		return "unlimited"
	}
	return fmt.Sprintf("%d/s", r)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func connector(o options) (sqldriver.Connector, error) {
	switch o.drv {
	case "pq":
		return pq.NewConnector(o.dsn)
	case "pgx":
		pc, err := pgx.ParseConfig(o.dsn)
		if err != nil {
			return nil, err
		}
		return stdlib.GetConnector(*pc), nil
	}
	return nil, fmt.Errorf("unknown -driver %q", o.drv)
}

// measure runs one mode: fresh tables, a fresh pool, warm-up, measurement.
func measure(ctx context.Context, o options, admin *sql.DB, schema, table, channel string, notify bool) (result, error) {
	res := result{mode: "notify"}
	if !notify {
		res.mode = "nonotify"
	}
	if _, err := admin.ExecContext(ctx, "TRUNCATE "+schema+".orders, "+table); err != nil {
		return res, err
	}
	if _, err := admin.ExecContext(ctx, "VACUUM ANALYZE "+table); err != nil {
		return res, err
	}
	ob, err := driver.New(driver.Config{Dialect: driver.Postgres, Table: table, DisableNotify: !notify})
	if err != nil {
		return res, err
	}
	c, err := connector(o)
	if err != nil {
		return res, err
	}
	db := sql.OpenDB(ob.WrapConnector(c))
	defer db.Close()
	db.SetMaxOpenConns(o.writers)
	db.SetMaxIdleConns(o.writers)

	runCtx, stop := context.WithCancel(ctx)
	defer stop()

	// A LISTENing connection counts the NOTIFYs that reach other processes.
	var notifies atomic.Int64
	listening := make(chan error, 1)
	var bg sync.WaitGroup
	bg.Add(1)
	go func() {
		defer bg.Done()
		lc, err := pgconn.Connect(runCtx, o.dsn)
		if err != nil {
			listening <- err
			return
		}
		defer lc.Close(context.Background())
		if _, err := lc.Exec(runCtx, dialect.ListenStatement(channel)).ReadAll(); err != nil {
			listening <- err
			return
		}
		listening <- nil
		for lc.WaitForNotification(runCtx) == nil {
			notifies.Add(1)
		}
	}()
	if err := <-listening; err != nil {
		return res, err
	}

	// The relay in another process's role.
	var pub *stampPublisher
	var committed sync.Map // message ID -> time.Time Commit returned
	if o.relay {
		rob, err := driver.New(driver.Config{Dialect: driver.Postgres, Table: table})
		if err != nil {
			return res, err
		}
		rdb, err := sql.Open("pgx", o.dsn)
		if err != nil {
			return res, err
		}
		defer rdb.Close()
		rdb.SetMaxOpenConns(4)
		pub = &stampPublisher{at: map[string]time.Time{}}
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		r, err := relay.New(rob, rdb, relay.Config{Publisher: pub, Wakeup: make(chan struct{}), PollInterval: time.Hour, MinPollInterval: time.Hour, Logger: quiet})
		if err != nil {
			return res, err
		}
		bg.Add(2)
		go func() { defer bg.Done(); _ = r.Run(runCtx) }()
		go func() { defer bg.Done(); _ = relay.ListenPostgres(runCtx, rob, o.dsn, r.Notify, quiet) }()
		deadline := time.Now().Add(30 * time.Second)
		for r.Ready() != nil {
			if time.Now().After(deadline) {
				return res, fmt.Errorf("relay not ready: %v", r.Ready())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	var (
		measuring atomic.Bool
		count     atomic.Int64
		latMu     sync.Mutex
		lats      []time.Duration
		firstErr  atomic.Value
		wg        sync.WaitGroup
	)
	var tick <-chan time.Time
	if o.rate > 0 {
		t := time.NewTicker(time.Second / time.Duration(o.rate))
		defer t.Stop()
		tick = t.C
	}
	for w := 0; w < o.writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			var mine []time.Duration
			for n := int64(0); runCtx.Err() == nil; n++ {
				if tick != nil {
					select {
					case <-tick:
					case <-runCtx.Done():
						continue
					}
				}
				id := fmt.Sprintf("%d-%d", w, n)
				start := time.Now()
				err := writeOne(runCtx, db, schema, w, n, id)
				end := time.Now()
				if err != nil {
					if runCtx.Err() == nil {
						firstErr.CompareAndSwap(nil, err)
						stop()
					}
					break
				}
				if pub != nil {
					committed.Store(id, end)
				}
				if measuring.Load() {
					count.Add(1)
					mine = append(mine, end.Sub(start))
				}
			}
			latMu.Lock()
			lats = append(lats, mine...)
			latMu.Unlock()
		}(w)
	}
	time.Sleep(o.warmup) // load shape, not synchronisation
	n0 := notifies.Load()
	measuring.Store(true)
	began := time.Now()
	time.Sleep(o.duration)
	measuring.Store(false)
	elapsed := time.Since(began)
	res.notifies = notifies.Load() - n0
	total := count.Load()
	if pub != nil {
		// Let the relay catch up with the last commits before stopping.
		var want int
		committed.Range(func(any, any) bool { want++; return true })
		deadline := time.Now().Add(30 * time.Second)
		for pub.count() < want && time.Now().Before(deadline) && firstErr.Load() == nil {
			time.Sleep(5 * time.Millisecond)
		}
	}
	stop()
	wg.Wait()
	bg.Wait()
	if err, ok := firstErr.Load().(error); ok {
		return res, err
	}
	res.commits = total
	res.perSec = float64(total) / elapsed.Seconds()
	sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
	if len(lats) > 0 {
		res.p50, res.p99 = lats[len(lats)/2], lats[len(lats)*99/100]
	}
	if pub != nil {
		var cl []time.Duration
		pub.mu.Lock()
		for id, at := range pub.at {
			if c, ok := committed.Load(id); ok {
				cl = append(cl, at.Sub(c.(time.Time)))
			}
		}
		pub.mu.Unlock()
		sort.Slice(cl, func(i, j int) bool { return cl[i] < cl[j] })
		res.published = len(cl)
		if len(cl) > 0 {
			res.claimP50, res.claimP99, res.claimMax = cl[len(cl)/2], cl[len(cl)*99/100], cl[len(cl)-1]
		}
	}
	return res, nil
}

func writeOne(ctx context.Context, db *sql.DB, schema string, w int, n int64, id string) error {
	ctx = outbox.NewContext(ctx)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.ExecContext(ctx, "INSERT INTO "+schema+".orders (writer, n) VALUES ($1, $2)", w, n); err != nil {
		return err
	}
	if err := outbox.Emit(ctx, outbox.Event{ID: id, AggregateType: "order", AggregateID: fmt.Sprint(w), Type: "order.paid", Payload: []byte(`{}`)}); err != nil {
		return err
	}
	return tx.Commit()
}

// stampPublisher records when each message was first published.
type stampPublisher struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (p *stampPublisher) Publish(_ context.Context, msgs []relay.Message) error {
	now := time.Now()
	p.mu.Lock()
	for _, m := range msgs {
		if _, ok := p.at[m.MessageID]; !ok {
			p.at[m.MessageID] = now
		}
	}
	p.mu.Unlock()
	return nil
}

func (p *stampPublisher) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.at)
}
