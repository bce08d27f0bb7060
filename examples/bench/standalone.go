package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
)

// relayEnv makes the bench binary (or its test binary, see TestMain) run
// only a standalone relay, configured by the variable's JSON value
// (relayChildConfig): part 2 with the relay in another process.
const relayEnv = "OUTBOX_BENCH_RELAY"

// relayChildConfig is what the relay child needs. It travels in the
// child's environment, never on a command line or in any output: DB may
// hold a password.
type relayChildConfig struct {
	DB      string   `json:"db"`     // the -db value ("" on SQLite)
	Schema  string   `json:"schema"` // the run's MySQL database
	File    string   `json:"file"`   // the SQLite file
	Table   string   `json:"table"`
	Brokers []string `json:"brokers"`
	Topic   string   `json:"topic"`
	// PGDriver is -pgdriver (pq or pgx), for PostgreSQL.
	PGDriver string `json:"pgdriver,omitempty"`
	// WALSlot, if set (-source wal), makes the child read the table's
	// inserts from this replication slot (relay.SourceWAL) instead of
	// LISTENing: the stream is its only wake-up.
	WALSlot string `json:"wal_slot,omitempty"`
	// CPUProfile, if set (-cpuprofile with -only standalone), makes the
	// child write a CPU profile of its whole run to this file.
	CPUProfile string `json:"cpu_profile,omitempty"`
}

// childLine is one line the relay child writes on its stdout: ready once
// it relays (and, on PostgreSQL, LISTENs), then one line per broker
// acknowledgement (message ID, time.Now().UnixNano() in Observer.Published),
// or an error before it exits.
type childLine struct {
	Ready bool   `json:"ready,omitempty"`
	ID    string `json:"id,omitempty"`
	Nanos int64  `json:"ns,omitempty"`
	Error string `json:"error,omitempty"`
}

// maybeRunChild runs the broker or the relay and exits, if this process
// was started as one of the bench's children.
func maybeRunChild() {
	maybeRunBroker()
	if cfg := os.Getenv(relayEnv); cfg != "" {
		os.Exit(relayChild(cfg))
	}
}

// lineWriter writes childLines from one goroutine, so that the relay's
// observer does not wait for the pipe (unless 64k lines are queued).
type lineWriter struct {
	ch   chan childLine
	done chan struct{}
}

func newLineWriter(w io.Writer) *lineWriter {
	lw := &lineWriter{ch: make(chan childLine, 1<<16), done: make(chan struct{})}
	go func() {
		defer close(lw.done)
		bw := bufio.NewWriter(w)
		enc := json.NewEncoder(bw)
		for l := range lw.ch {
			_ = enc.Encode(l)
			if len(lw.ch) == 0 {
				_ = bw.Flush()
			}
		}
		_ = bw.Flush()
	}()
	return lw
}

func (lw *lineWriter) send(l childLine) { lw.ch <- l }

// close flushes what was sent and stops the writer.
func (lw *lineWriter) close() {
	close(lw.ch)
	<-lw.done
}

// relayChild is the standalone relay: its own pool, relay.New with the
// Kafka publisher, relay.ListenPostgres on PostgreSQL, the adaptive poll
// (defaults) elsewhere. It runs until its stdin closes (the parent closed
// it or exited) or SIGINT/SIGTERM, then stops the relay cleanly.
func relayChild(raw string) int {
	out := newLineWriter(os.Stdout)
	defer out.close()
	fail := func(err error) int {
		out.send(childLine{Error: err.Error()})
		return 1
	}
	var cfg relayChildConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return fail(fmt.Errorf("bad %s: %w", relayEnv, err))
	}
	if cfg.CPUProfile != "" {
		stopProfile, err := startCPUProfile(cfg.CPUProfile)
		if err != nil {
			return fail(err)
		}
		defer stopProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	dialect, conn, err := childConnector(cfg.DB, cfg.Schema, cfg.File, cfg.PGDriver)
	if err != nil {
		return fail(err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	if dialect == driver.SQLite {
		db.SetMaxOpenConns(1)
	} else {
		db.SetMaxOpenConns(2)
	}
	pub, err := newPublisher(cfg.Brokers, cfg.Topic)
	if err != nil {
		return fail(err)
	}
	defer pub.Close()
	// Ready once the relay runs and leases every partition (one relay on
	// a fresh table takes them all in its first heartbeat).
	up := make(chan struct{})
	var upOnce sync.Once
	obs := &upObserver{up: func() { upOnce.Do(func() { close(up) }) }, partitions: partition.DefaultCount, wal: cfg.WALSlot != ""}
	obs.published = func(m relay.Message) { out.send(childLine{ID: m.MessageID, Nanos: time.Now().UnixNano()}) }
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// Another process than the writers: the table is described by dialect
	// and name alone; the partition count is read from the table.
	ob, err := driver.New(driver.Config{Dialect: dialect, Table: cfg.Table})
	if err != nil {
		return fail(err)
	}
	rcfg := relay.Config{Publisher: pub, Observer: obs, Logger: logger}
	if cfg.WALSlot != "" {
		rcfg.Source, rcfg.WAL = relay.SourceWAL, relay.WALConfig{DSN: cfg.DB, Slot: cfg.WALSlot}
	}
	r, err := relay.New(ob, db, rcfg)
	if err != nil {
		return fail(err)
	}
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(ctx) }()
	listening := make(chan struct{})
	var wg sync.WaitGroup
	if dialect == driver.Postgres && cfg.WALSlot == "" {
		var once sync.Once
		wake := func() {
			// ListenPostgres wakes once right after LISTEN succeeded.
			once.Do(func() { close(listening) })
			r.Notify()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = relay.ListenPostgres(ctx, ob, cfg.DB, wake, logger)
		}()
	} else {
		close(listening)
	}
	defer wg.Wait()
	defer cancel()
	select {
	case <-up:
	case err := <-runErr:
		return fail(fmt.Errorf("relay: %w", errOrStopped(err)))
	}
	select {
	case <-listening:
		out.send(childLine{Ready: true})
	case <-ctx.Done():
	}
	if err := <-runErr; err != nil {
		return fail(fmt.Errorf("relay: %w", err))
	}
	return 0
}

func errOrStopped(err error) error {
	if err == nil {
		return errors.New("stopped before it started")
	}
	return err
}

// upObserver is an observer that also calls up once the relay is up
// (Up(true)) and owns all of partitions leases.
type upObserver struct {
	observer
	up         func()
	partitions int
	mu         sync.Mutex
	running    bool
	owned      int
	// wal: up also waits for the relay's replication stream
	// (relay.SourceObserver).
	wal       bool
	streaming bool
}

// WALStreaming implements relay.SourceObserver.
func (o *upObserver) WALStreaming(streaming bool, _ error) {
	o.mu.Lock()
	o.streaming = streaming
	o.mu.Unlock()
	o.check()
}

// FromSource implements relay.SourceObserver.
func (o *upObserver) FromSource(relay.Source, int) {}

func (o *upObserver) Up(up bool) {
	o.mu.Lock()
	o.running = up
	o.mu.Unlock()
	o.check()
}

func (o *upObserver) Leases(owned int) {
	o.mu.Lock()
	o.owned = owned
	o.mu.Unlock()
	o.check()
}

func (o *upObserver) check() {
	o.mu.Lock()
	ok := o.running && o.owned >= o.partitions && (!o.wal || o.streaming)
	o.mu.Unlock()
	if ok {
		o.up()
	}
}

// childRelay is a standalone relay in a child process of the bench.
type childRelay struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	ready  chan struct{}
	exited chan struct{} // closed once the child's stdout ended
	mu     sync.Mutex
	err    string // the error line the child reported
	once   sync.Once
}

// startChildRelay starts the relay child and waits until it relays. Its
// acknowledgements go to acks; when it exits, acks fails.
func startChildRelay(ctx context.Context, cfg relayChildConfig, acks *ackLog) (*childRelay, error) {
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), relayEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the relay child: %w", err)
	}
	c := &childRelay{cmd: cmd, stdin: stdin, ready: make(chan struct{}), exited: make(chan struct{})}
	go func() {
		defer close(c.exited)
		var readyOnce sync.Once
		s := bufio.NewScanner(stdout)
		s.Buffer(make([]byte, 64<<10), 1<<20)
		for s.Scan() {
			var l childLine
			if err := json.Unmarshal(s.Bytes(), &l); err != nil {
				c.setErr(fmt.Sprintf("unreadable line from the relay child: %q", s.Text()))
				continue
			}
			switch {
			case l.Error != "":
				c.setErr(l.Error)
			case l.Ready:
				readyOnce.Do(func() { close(c.ready) })
			case l.ID != "":
				acks.add(l.ID, time.Unix(0, l.Nanos))
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		acks.fail(c.exitErr())
	}()
	t := time.NewTimer(60 * time.Second)
	defer t.Stop()
	select {
	case <-c.ready:
		return c, nil
	case <-c.exited:
		c.Close()
		return nil, c.exitErr()
	case <-t.C:
		c.Close()
		return nil, errors.New("the relay child did not start relaying within 60 s")
	case <-ctx.Done():
		c.Close()
		return nil, ctx.Err()
	}
}

func (c *childRelay) setErr(s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == "" {
		c.err = s
	}
}

func (c *childRelay) exitErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != "" {
		return fmt.Errorf("the relay child exited: %s", c.err)
	}
	return errors.New("the relay child exited")
}

// Close stops the child: it closes its stdin (the child then stops its
// relay cleanly) and waits up to 15 s, then kills it. Safe to call twice.
func (c *childRelay) Close() {
	c.once.Do(func() {
		_ = c.stdin.Close()
		t := time.NewTimer(15 * time.Second)
		defer t.Stop()
		select {
		case <-c.exited:
		case <-t.C:
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
		_ = c.cmd.Wait()
	})
}

// runStandalone measures part 2 with a standalone relay in a child process
// (startChildRelay), the writers in this one.
func runStandalone(ctx context.Context, db *database, brokers []string, rates []int, dur time.Duration, writers, run int, cpuprofile string) (*LatencyResult, error) {
	rig, err := newLatencyRig(ctx, db, kafkaEndpoint{brokers: brokers}, fmt.Sprintf("standalone_%d", run), "alone", writers, true)
	if err != nil {
		return nil, err
	}
	defer rig.close()
	env := rig.env
	acks := newAckLog()
	wal, dropSlot := db.withSource(env, relay.Config{})
	defer dropSlot() // deferred before child.Close: runs after the child stopped
	child, err := startChildRelay(ctx, relayChildConfig{DB: db.dsn, Schema: db.schema, File: db.file, Table: env.table, Brokers: brokers, Topic: rig.route.topic, PGDriver: db.pgDriver,
		WALSlot: wal.WAL.Slot, CPUProfile: cpuprofile}, acks)
	if err != nil {
		return nil, fmt.Errorf("standalone relay: %w", err)
	}
	defer child.Close()
	how := "relay.ListenPostgres (LISTEN/NOTIFY; the writers' commit hook NOTIFYs)"
	switch {
	case wal.WAL.Slot != "":
		how = "its replication stream (relay.SourceWAL, no LISTEN)"
	case db.dialect != driver.Postgres:
		how = fmt.Sprintf("the adaptive poll (MinPollInterval %v doubling to PollInterval %v when idle; defaults)", relay.DefaultMinPollInterval, relay.DefaultPollInterval)
	}
	res := &LatencyResult{Relay: "standalone relay.Relay in a child process (own pool, relay/kafka publisher), woken by " + how,
		Writers: writers, Seconds: dur.Seconds(), Run: run}
	l := &load{writers: writers, dur: dur, prefix: "alone", write: emitWriter(env, rig.insOrder), acks: acks, cons: rig.route.cons, settle: settleFor(dur)}
	return res, l.measure(ctx, db, env.table, res, rates)
}
