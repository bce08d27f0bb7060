package relay

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// Source is where a relay learns of committed events.
type Source int

const (
	// SourceTable claims pending rows from the outbox table (its pending
	// set) after each wake-up and every PollInterval: the default, and the
	// only source on MySQL/MariaDB and SQLite.
	SourceTable Source = iota
	// SourceWAL (PostgreSQL) reads the outbox table's committed inserts
	// from a logical replication slot and publishes them without a claim
	// query; the table stays the source of truth and the relay claims
	// from it whenever the stream cannot vouch for a row (see WALConfig
	// and docs/wal.md).
	SourceWAL
)

// String returns "table" or "wal".
func (s Source) String() string {
	switch s {
	case SourceTable:
		return "table"
	case SourceWAL:
		return "wal"
	}
	return "Source(" + strconv.Itoa(int(s)) + ")"
}

// ParseSource returns the Source named s ("table" or "wal"), or an error
// wrapping ErrInvalidConfig.
func ParseSource(s string) (Source, error) {
	switch s {
	case "table", "":
		return SourceTable, nil
	case "wal":
		return SourceWAL, nil
	}
	return 0, fmt.Errorf("%w: source %q is not table or wal", ErrInvalidConfig, s)
}

// WALConfig configures Config.Source = SourceWAL (PostgreSQL 14 or later,
// wal_level = logical).
//
// The relay reads the table's inserts from a logical replication slot
// (the pgoutput plugin, through a publication of the table, inserts
// only), in commit order, and publishes them as the claim would have
// (same batches, same marks, same lease fence, same retries and dead
// letters). It is the fast path only: the table stays the source of
// truth, so nothing a stream misses is lost. A row the stream delivers is
// published from it only if the database confirms, in one statement per
// batch, that it is still pending, in a relay partition this relay holds,
// and that no earlier event of its aggregate has failed and not been sent
// (held_idx); otherwise, and after anything the stream cannot vouch for
// (the relay's start, a reconnection, a dropped row, partitions taken
// over, a dead letter retried, a failed cycle, and every PollInterval),
// the relay claims from the table until a claim comes back short, then
// returns to the stream. The slot's confirmed position advances as the
// loop takes rows, never held back by a retry or a held aggregate (those
// rows are in the table), so WAL retention stays bounded.
type WALConfig struct {
	// DSN reaches the outbox table's PostgreSQL database for the
	// replication connection, in any form pgx accepts (URL or libpq
	// keyword/value). Required with SourceWAL. Its role needs the
	// REPLICATION attribute (or superuser) to create and read the slot,
	// and the table's ownership to create the publication (or create it
	// beforehand: CREATE PUBLICATION <Publication> FOR TABLE <table> WITH
	// (publish = 'insert')).
	DSN string
	// Slot is the logical replication slot's name: lower-case letters,
	// digits and underscores, at most 63 bytes. Default SlotName(database,
	// table) for the DSN's database. Slots are per server, so two outbox
	// tables (or databases) on one server need two names; the default
	// includes both. The relay creates the slot if it is missing and
	// recreates it if PostgreSQL invalidated it (wal_status 'lost'); drop
	// it with DropWAL when the relay is retired, or it keeps WAL.
	Slot string
	// Publication is the publication the slot reads. Default
	// PublicationName(table). Created by the relay if missing.
	Publication string
	// Buffer is the most rows read from the stream and not yet taken by
	// the loop (one transaction may pass it). While it is full the relay
	// reads no further: the server's walsender waits, and the slot's
	// position is still reported. Default 4 x MaxBatchSize.
	Buffer int
	// StatusInterval is how often the relay reports its position to the
	// server (standby status update). Default 1 s; it must be below the
	// server's wal_sender_timeout (default 60 s).
	StatusInterval time.Duration
	// ReceiveTimeout is how long the replication connection may stay
	// silent before the relay ends the stream and reconnects: a network
	// path that drops every byte without closing the connection (a NAT or
	// a firewall that lost the flow) is otherwise noticed only when the
	// kernel gives up on the socket, about 15 minutes, while log-only
	// events wait. Once the stream has been quiet for a StatusInterval,
	// the relay's status updates ask the server for a reply, so a live
	// server is never silent that long unless it is busy decoding (a
	// large transaction of other tables: PostgreSQL's walsender then
	// sends a keepalive every wal_sender_timeout/2). Default
	// DefaultWALReceiveTimeout, as PostgreSQL's own wal_receiver_timeout
	// for its subscribers; it must exceed the server's
	// wal_sender_timeout/2. Negative: never.
	ReceiveTimeout time.Duration
	// SpillAfter (log-only mode, driver.Config.LogOnly) is how long the
	// relay's cycles must have been failing (a broker outage) before it
	// moves the events of logical decoding messages from the stream to
	// the table while it backs off, so that the slot's position keeps
	// moving and the server's WAL does not pile up for the outage's
	// length (max_slot_wal_keep_size would invalidate the slot, and the
	// events with it). Default DefaultWALSpillAfter; negative: never
	// (the events wait in the WAL).
	SpillAfter time.Duration
}

// slotCreateSlow is how long a slot's creation may wait for the
// transactions running at its start before the relay logs a warning.
const slotCreateSlow = 10 * time.Second

// DefaultWALReceiveTimeout is WALConfig.ReceiveTimeout's default: 60 s,
// PostgreSQL's wal_receiver_timeout default.
const DefaultWALReceiveTimeout = 60 * time.Second

// DefaultWALSpillAfter is WALConfig.SpillAfter's default.
const DefaultWALSpillAfter = 5 * time.Second

var slotChars = regexp.MustCompile(`[^a-z0-9_]+`)

// SlotName returns the default replication slot name for table in
// database: "outbox_" followed by both, lower-cased, with every run of
// other characters than a-z, 0-9 and _ replaced by "_"; a name that would
// be longer than 63 bytes (PostgreSQL's NAMEDATALEN - 1) is cut and ends
// in 8 hex digits of the full name's SHA-256.
func SlotName(database, table string) string {
	return pgName("outbox_" + database + "_" + table)
}

// PublicationName returns the default publication name for table:
// table's name with "." and other characters outside a-z, 0-9 and _
// replaced by "_", followed by "_outbox_pub", shortened as SlotName does.
func PublicationName(table string) string {
	return pgName(table + "_outbox_pub")
}

func pgName(s string) string {
	n := slotChars.ReplaceAllString(strings.ToLower(s), "_")
	if len(n) <= 63 {
		return n
	}
	sum := sha256.Sum256([]byte(s))
	return n[:54] + "_" + hex.EncodeToString(sum[:4])
}

// ErrWALUnavailable is wrapped by errors of the WAL source: the server's
// wal_level is not logical, the role may not replicate, the slot is held
// by another reader. The relay goes on claiming from the table meanwhile.
var ErrWALUnavailable = errors.New("outbox relay: the WAL source is unavailable")

// SourceObserver is an optional interface of an Observer (package
// metrics' RelayMetrics implements it). With Config.Source SourceWAL the
// relay calls WALStreaming(true, nil) when its replication stream opens
// and WALStreaming(false, err) when it closes or cannot open (while it
// is closed the relay claims from the table: nothing waits, but each
// event costs the claim again); and, with either source, FromSource after
// each cycle that found messages: how many came from the stream
// (SourceWAL) and how many were claimed from the table (SourceTable).
// Calls are synchronous; keep them short.
type SourceObserver interface {
	WALStreaming(streaming bool, err error)
	FromSource(source Source, n int)
}

// WALLag is the WAL source's position, as the relay reading the slot
// samples it every Config.HealthInterval (WALLagObserver).
type WALLag struct {
	// ConfirmedLSN is the slot's confirmed_flush_lsn (pg_replication_slots)
	// as a number: the position below which the relay took every row.
	ConfirmedLSN uint64
	// UnconfirmedBytes is pg_current_wal_lsn() - confirmed_flush_lsn: the
	// WAL written since that position, in bytes. It stays below a few
	// pages while the relay keeps up (an idle stream confirms up to the
	// walsender's position), and grows while the walsender decodes
	// behind the server or the loop falls behind the stream.
	UnconfirmedBytes int64
	// RetainedBytes is pg_current_wal_lsn() - restart_lsn: the WAL the slot
	// keeps the server from removing, in bytes (max_slot_wal_keep_size
	// bounds it; docs/wal.md).
	RetainedBytes int64
	// DecodeDelay is how long after its commit the relay received the
	// last transaction of the outbox table the walsender decoded (both
	// times by the server's clock), and 0 once the walsender reported it
	// had caught up (a keepalive without a reply request while nothing of
	// the table was in flight).
	DecodeDelay time.Duration
}

// WALLagObserver is an optional interface of an Observer (package
// metrics' RelayMetrics implements it): with Config.Source SourceWAL, the
// relay reading the slot calls WALLag every Config.HealthInterval while
// its stream is open. Calls come from one goroutine; keep them short.
type WALLagObserver interface {
	WALLag(WALLag)
}

// walRow is a row read from the stream, with the end of its transaction.
type walRow struct {
	msg Message
	end pglogrepl.LSN // the end of the row's transaction's commit record
	xid uint32        // the row's transaction
	// log marks an event of a logical decoding message (driver.Config.
	// LogOnly): it is in no table, so the slot's position must not pass
	// it before it is published or written to the table (walReader.hold).
	log bool
	// age is the row's age when it was read (the server's clock when it
	// sent the row, minus created_at), at the host's monotonic clock: the
	// loop adds the time since.
	age time.Duration
	at  time.Time
}

// walReader reads the outbox table's inserts from a replication slot into
// a bounded buffer that the relay's loop takes from. Safe for concurrent
// use: the stream goroutine fills, the loop takes.
type walReader struct {
	cfg    WALConfig
	table  string // the outbox table as configured (for logs)
	quoted string // the outbox table, quoted for SQL
	// relid is the outbox table's OID, read by each stream before it
	// starts (ensureSlot; only the stream's goroutine uses it): inserts of
	// other tables of the publication (one an operator named, FOR ALL
	// TABLES) are not the relay's.
	relid     uint32
	instance  string
	log       *slog.Logger
	observer  SourceObserver // nil if the Observer is not one
	buffer    int
	statusInt time.Duration
	// undecoded logs the rows of the stream the relay could not decode
	// (left to the table: skipGap).
	undecoded *repeatLog
	// skipped is set with the gap when the stream left rows to the table
	// (skipGap): the claim that covers it first waits until the commits
	// decoded are visible (waitCommitsVisible), or it could miss them.
	skipped bool
	// createSlow is how long a slot's creation may wait before it is
	// logged (slotCreateSlow; tests shorten it).
	createSlow time.Duration
	// receiveTimeout is WALConfig.ReceiveTimeout (<= 0: none).
	receiveTimeout time.Duration

	// advancedAt is when advanceUnused last ran (the stream's goroutine).
	advancedAt time.Time
	// foreign logs a slot held by a reader that is not an outbox relay.
	foreign *repeatLog
	// fence terminates the slot's reader if it is a relay whose
	// membership expired (a frozen or partitioned holder), and returns its
	// application_name ("" if it terminated none), and, if the reader is
	// not an outbox relay, a description of it (pid, application_name).
	fence func(ctx context.Context, slot string) (fenced, foreign string, err error)
	// standbyWait is how long a relay waits between attempts on a slot
	// another relay reads (LeaseHeartbeat).
	standbyWait time.Duration
	// opened is called when a stream opens (run's repeat log: the
	// failures before it are over).
	opened func()
	// outage, if set (log-only mode), hears of the stream's outages: the
	// first failure of a run of them, and nil once a stream has stayed
	// open for streamHealthy or another reader holds the slot.
	outage func(*walOutage)
	// check reads a slot just created once (checkSlot; tests replace it).
	check func(ctx context.Context, q queryOne, slot, pub string) error
	// unreadable and recreate belong to the run goroutine: streams that
	// keep failing with a decoder error (walslot.go) set recreate, the
	// error's text, and the next ensureSlot drops and recreates the slot.
	unreadable unreadableWatch
	recreate   string
	healthy    atomic.Bool // the current stream has been open for streamHealthy
	// recreateHook (tests) is called before a slot to recreate is read
	// again.
	recreateHook func(slot string)

	signal chan struct{} // rows were buffered, or the stream's state changed
	space  chan struct{} // the loop took rows: a full buffer has room again

	mu        sync.Mutex
	rows      []walRow
	gap       bool          // the stream (re)started since the last take: claim from the table
	streaming bool          // a replication stream is open
	received  pglogrepl.LSN // the end of the last commit buffered (or dropped)
	confirmed pglogrepl.LSN // the position the loop has taken everything below
	taken     int64         // rows handed to the loop (tests)
	delay     time.Duration // WALLag.DecodeDelay

	// Log-only mode (logPrefix != ""): while the loop holds events of
	// logical decoding messages it took (hold), the slot's position does
	// not move past them: what take and the stream would confirm waits in
	// later until settle. rewind discards the buffer and restarts the
	// stream at the slot's position instead; gen tells a stream of an
	// earlier generation (still running after a rewind) from the current.
	logPrefix    string
	logState     *walLogState // the loss guard (walstate.go); nil without log-only mode
	hold         bool
	later        pglogrepl.LSN
	gen          int
	cancelStream context.CancelFunc
}

// advance confirms lsn to the slot, or keeps it for settle while the loop
// holds log events. Called with w.mu held.
func (w *walReader) advance(lsn pglogrepl.LSN) {
	if w.hold {
		w.later = max64(w.later, lsn)
		return
	}
	w.confirmed = max64(w.confirmed, lsn)
}

// settle ends a hold: the log events taken are published or written to
// the table, so the slot may move past them.
func (w *walReader) settle() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hold {
		w.hold = false
		w.confirmed = max64(w.confirmed, w.later)
		w.later = 0
	}
}

// rewind gives up the log events taken and not settled (a failed cycle,
// a spill that did not commit): the buffer is emptied and the stream
// restarts at the slot's confirmed position, which is before them, so
// they are read again (at least once: some may have been published).
func (w *walReader) rewind() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.hold, w.later = false, 0
	w.rows = nil
	w.received = w.confirmed // what was received past it is read again
	w.gap = true
	w.gen++
	if w.cancelStream != nil {
		w.cancelStream()
	}
}

// confirmedState returns the position confirmed to the slot, the slot's
// name, and whether the stream is open.
func (w *walReader) confirmedState() (pglogrepl.LSN, string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.confirmed, w.cfg.Slot, w.streaming
}

// lagState returns WALLag.DecodeDelay, the slot's name, and whether the
// stream is open.
func (w *walReader) lagState() (time.Duration, string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.delay, w.cfg.Slot, w.streaming
}

func newWALReader(cfg WALConfig, table, quoted, instance string, log *slog.Logger) *walReader {
	return &walReader{cfg: cfg, table: table, quoted: quoted, instance: instance, log: log,
		buffer: cfg.Buffer, statusInt: cfg.StatusInterval, receiveTimeout: cfg.ReceiveTimeout, signal: make(chan struct{}, 1), space: make(chan struct{}, 1), gap: true,
		check: checkSlot, unreadable: unreadableWatch{after: unreadableAfter}, createSlow: slotCreateSlow,
		foreign:   newRepeatLog(log, slog.LevelWarn, "WAL source: the slot is held by a reader that is not an outbox relay; no relay can read it until that reader stops (pg_terminate_backend(pid), or stop the tool; or name another WALConfig.Slot); claiming from the table meanwhile, and in log-only mode the relays are not ready"),
		undecoded: newRepeatLog(log, slog.LevelWarn, "WAL source: rows of the outbox table in the stream could not be decoded; claiming them from the table (fix or dead-letter the row: the claim fails on it too)")}
}

// skipGap opens a gap after a transaction of stream generation gen whose
// rows were not all decoded: the loop claims from the table (which holds
// them) before it takes more from the stream, and the rows taken after
// are checked against the table, as after a restart of the stream.
func (w *walReader) skipGap(gen int) {
	w.mu.Lock()
	if gen == w.gen {
		w.gap, w.skipped = true, true
	}
	w.mu.Unlock()
	w.wake()
}

// takeSkipped reports and clears whether a gap opened by skipGap is to
// be covered.
func (w *walReader) takeSkipped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.skipped
	w.skipped = false
	return s
}

func (w *walReader) wake() {
	select {
	case w.signal <- struct{}{}:
	default:
	}
}

// take returns up to max buffered rows in commit order, whether a gap
// (a restarted stream) came before them, and whether the stream is open.
// Taking confirms the rows' transactions to the slot once every row of
// theirs is taken.
func (w *walReader) take(max int) (rows []walRow, gap, streaming bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	defer func() {
		select {
		case w.space <- struct{}{}:
		default:
		}
	}()
	n := min(max, len(w.rows))
	rows = append([]walRow(nil), w.rows[:n]...)
	w.rows = append(w.rows[:0], w.rows[n:]...)
	gap, w.gap = w.gap, false
	for i := range rows {
		if rows[i].log {
			w.hold = true // until settle, unhold or rewind
			break
		}
	}
	if len(w.rows) == 0 {
		w.advance(w.received)
	} else if n > 0 {
		// Everything of the transactions before the first row left is
		// taken.
		for i := n - 1; i >= 0; i-- {
			if rows[i].end != w.rows[0].end {
				w.advance(rows[i].end)
				break
			}
		}
	}
	w.taken += int64(n)
	return rows, gap, w.streaming
}

// coverGap clears the gap flag (the caller claims from the table, which
// covers it) and reports whether the stream is open.
func (w *walReader) coverGap() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.streaming {
		w.gap = false
	}
	return w.streaming
}

// putBack returns rows taken by the loop to the front of the buffer (the
// database could not judge them yet: their transactions were not visible).
// The slot's position does not move back: a restarted stream reads from
// the table first.
func (w *walReader) putBack(rows []walRow) {
	w.mu.Lock()
	w.rows = append(rows, w.rows...)
	w.hold, w.later = false, 0
	w.mu.Unlock()
}

// full reports whether the buffer holds Buffer rows or more.
func (w *walReader) full() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.rows) >= w.buffer
}

func max64(a, b pglogrepl.LSN) pglogrepl.LSN {
	if a > b {
		return a
	}
	return b
}

// run keeps a stream open until ctx ends, reconnecting with backoff.
func (w *walReader) run(ctx context.Context) {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 100 * time.Millisecond
	bo.MaxInterval = 5 * time.Second
	bo.MaxElapsedTime = 0
	unavailable := newRepeatLog(w.log, slog.LevelWarn, "WAL source unavailable; claiming from the table")
	// Not ended by a stream that opens: an unreadable slot's streams
	// open, then fail at the same record.
	undecodable := newRepeatLog(w.log, slog.LevelWarn, "WAL source: PostgreSQL's decoder cannot read the slot; claiming from the table meanwhile (a slot that keeps failing at one position is dropped and created again)")
	w.opened = unavailable.ok
	var down *walOutage
	for ctx.Err() == nil {
		started := time.Now()
		err := w.stream(ctx)
		if w.healthy.Swap(false) {
			// The stream had been open for streamHealthy: a new outage,
			// and a new count of decoder errors, if any.
			down = nil
			w.unreadable = unreadableWatch{after: w.unreadable.after}
		}
		if ctx.Err() != nil {
			break
		}
		w.mu.Lock()
		was := w.streaming
		w.streaming, w.gap = false, true
		w.mu.Unlock()
		w.wake()
		if w.observer != nil {
			w.observer.WALStreaming(false, err)
		}
		wait := bo.NextBackOff()
		w.mu.Lock()
		pos := w.confirmed
		w.mu.Unlock()
		// Another reader holds the slot (55006): a relay whose membership
		// expired is terminated (fenced); a reader that is not an outbox
		// relay (foreign: pg_recvlogical, another tool) is reported.
		var pe *pgconn.PgError
		held := errors.As(err, &pe) && pe.Code == "55006"
		var fenced, foreign string
		var fenceErr error
		if held && w.fence != nil {
			fenced, foreign, fenceErr = w.fence(ctx, w.cfg.Slot)
		}
		if held && foreign != "" {
			err = fmt.Errorf("%w: slot %s is read by %s, not by an outbox relay", ErrWALUnavailable, w.cfg.Slot, foreign)
		}
		if w.outage != nil {
			switch {
			case held && foreign == "":
				down = nil // another relay streams: its readiness tells
			case down == nil:
				// (A foreign reader counts: no relay reads the slot,
				// and log-only events wait in it.)
				down = &walOutage{since: time.Now(), err: err}
			default:
				down = &walOutage{since: down.since, err: err}
			}
			w.outage(down)
		}
		if w.unreadable.failed(err, pos, time.Now()) {
			w.recreate = decoderError(err)
			w.unreadable = unreadableWatch{after: w.unreadable.after}
			wait = 0
		}
		switch {
		case errors.Is(err, ErrSlotUnreadable):
			undecodable.failed(err, "slot", w.cfg.Slot, "position", pos.String(), "recreate_after", w.unreadable.after.String())
		case held:
			// Another reader holds the slot: stand by. A relay holder
			// whose membership expired (frozen, or cut off from the
			// database) is terminated, so that the slot is not held
			// until wal_sender_timeout.
			wait = w.standbyWait
			switch {
			case fenceErr != nil:
				w.log.Warn("WAL source: checking the slot's reader failed", "slot", w.cfg.Slot, "error", fenceErr)
			case fenced != "":
				w.log.Warn("WAL source: terminated the slot's reader, a relay whose membership expired (frozen or cut off); taking the slot over", "slot", w.cfg.Slot, "reader", fenced)
				wait = 0
			case foreign != "":
				// Not terminated: it may be a tool an operator runs on
				// purpose. Said at WARN (it was at DEBUG, and a relay
				// stood by for ever with the slot read by nobody of
				// its own; found by a helper).
				w.foreign.failed(errors.New(foreign), "slot", w.cfg.Slot)
			}
			if wait > 0 && foreign == "" {
				w.log.Debug("WAL source standing by: another reader holds the slot", "slot", w.cfg.Slot, "error", err)
			}
		case was:
			w.log.Warn("WAL source stream ended; claiming from the table until it is back", "slot", w.cfg.Slot, "error", err)
		default:
			// Once per distinct error (its whole text), then once a minute
			// with the count: a server without wal_level = logical fails
			// every attempt, every 5 s, for as long as it runs.
			unavailable.failed(errors.New(err.Error()), "slot", w.cfg.Slot)
		}
		if time.Since(started) > time.Minute {
			bo.Reset()
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	w.mu.Lock()
	was := w.streaming
	w.streaming = false
	w.mu.Unlock()
	if was && w.observer != nil {
		w.observer.WALStreaming(false, ctx.Err())
	}
}

// connect opens a replication connection (replication=database).
func (w *walReader) connect(ctx context.Context) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(w.cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("%w: parsing WALConfig.DSN: %v", ErrInvalidConfig, redactPgError(err))
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["application_name"] = walApplicationName(w.instance)
	// The output functions run in the walsender with these settings: the
	// text forms parsed below.
	cfg.RuntimeParams["DateStyle"] = "ISO"
	cfg.RuntimeParams["TimeZone"] = "UTC"
	cfg.RuntimeParams["bytea_output"] = "hex"
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgconn.ConnectConfig(cctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: replication connection: %v", ErrWALUnavailable, redactPgError(err))
	}
	return conn, nil
}

// walApplicationName is the replication connection's application_name:
// how another relay recognises the slot's reader in pg_stat_replication.
func walApplicationName(instance string) string {
	name := "outbox-relay " + instance
	if len(name) > 63 {
		name = name[:63]
	}
	return name
}

// redactPgError keeps a connection error's text from quoting a password
// (pgconn's errors name the host and user, not the password; this is a
// guard for parse errors, which may quote the DSN).
func redactPgError(err error) error {
	var pe *pgconn.ParseConfigError
	if errors.As(err, &pe) {
		return errors.New("cannot parse the DSN (not shown: it may hold a password)")
	}
	return err
}

// stream opens the slot and reads it until an error or ctx's end; at
// ctx's end it reports the position the loop settled last, so that the
// next reader does not read again what this relay published since the
// last report (a graceful stop causes no duplicates, log-only mode
// included).
func (w *walReader) stream(parent context.Context) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	w.mu.Lock()
	gen := w.gen
	w.cancelStream = cancel
	w.mu.Unlock()
	conn, err := w.connect(ctx)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if err := w.ensureSlot(ctx, conn); err != nil {
		return err
	}
	args := []string{"proto_version '1'", "publication_names '" + w.cfg.Publication + "'"}
	if w.logPrefix != "" {
		args = append(args, "messages 'true'") // logical decoding messages (PostgreSQL 14)
	}
	if err := pglogrepl.StartReplication(ctx, conn, w.cfg.Slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: args}); err != nil {
		return fmt.Errorf("%w: starting replication from slot %s: %w", ErrWALUnavailable, w.cfg.Slot, err)
	}
	defer func() {
		if parent.Err() == nil {
			return // the stream failed: the connection may be broken
		}
		w.mu.Lock()
		pos := w.confirmed
		w.mu.Unlock()
		fctx, fcancel := context.WithTimeout(context.Background(), time.Second)
		defer fcancel()
		if err := pglogrepl.SendStandbyStatusUpdate(fctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos}); err != nil {
			w.log.Debug("WAL source: the last position report at stop failed; the next reader may read again what was published since the one before", "error", err)
		}
	}()
	w.mu.Lock()
	if gen != w.gen {
		w.mu.Unlock()
		return errors.New("rewound") // the loop gave up taken log events meanwhile: start again at the slot's position
	}
	w.streaming, w.gap = true, true
	w.mu.Unlock()
	w.wake()
	if w.observer != nil {
		w.observer.WALStreaming(true, nil)
	}
	if w.opened != nil {
		w.opened()
	}
	w.log.Info("WAL source streaming", "slot", w.cfg.Slot, "publication", w.cfg.Publication)

	rels := map[uint32]*walRelation{}
	var txn []walRow
	// skipped counts the rows of the current transaction the relay could
	// not decode (skipErr, the last error), left to the table.
	skipped, skipErr := 0, error(nil)
	inTxn := false
	var commitTime time.Time
	var xid uint32
	nextStatus := time.Now()
	var sent pglogrepl.LSN
	// heard is when the server last sent something. An idle walsender
	// sends nothing while the relay reports its position, so a status
	// update asks for a reply once the stream has been silent for a
	// StatusInterval; a connection silent for silenceLimit despite that
	// (a network path that drops everything without closing: a NAT or a
	// firewall that lost the flow) is ended after WALConfig.ReceiveTimeout,
	// and the stream reconnects.
	// Without it the relay kept a dead stream until the kernel gave up on
	// the socket, and log-only events, in no table, waited that long.
	heard := time.Now()
	openedAt := heard
	for {
		now := time.Now()
		if !w.healthy.Load() && now.Sub(openedAt) >= streamHealthy {
			w.healthy.Store(true)
			if w.outage != nil {
				w.outage(nil)
			}
		}
		if presumedDead(w.receiveTimeout, heard, now) {
			return fmt.Errorf("%w: nothing from the server on the replication connection for %v (a reply was asked for every %v): presumed dead", ErrWALUnavailable, now.Sub(heard).Round(time.Millisecond), w.statusInt)
		}
		w.mu.Lock()
		pos := w.confirmed
		w.mu.Unlock()
		// In log-only mode a position not yet reported is events a
		// restarted relay publishes again: report it within
		// logStatusInterval, not StatusInterval.
		early := w.logPrefix != "" && pos > sent && now.Add(w.statusInt-logStatusInterval).After(nextStatus)
		if !now.Before(nextStatus) || early {
			ask := now.Sub(heard) >= w.statusInt
			if err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{WALWritePosition: pos, ReplyRequested: ask}); err != nil {
				return fmt.Errorf("sending the slot position: %w", err)
			}
			sent = pos
			nextStatus = now.Add(w.statusInt)
		}
		if w.full() {
			heard = time.Now() // not reading: the server's silence means nothing
			// Backpressure: the server's walsender waits on the socket
			// until the loop takes rows; the position is still reported
			// every StatusInterval, so the server does not time the
			// connection out.
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-w.space:
			case <-time.After(time.Until(nextStatus)):
			}
			continue
		}
		deadline := nextStatus
		if w.logPrefix != "" {
			deadline = minTime(deadline, time.Now().Add(logStatusInterval))
		}
		rctx, cancel := context.WithDeadline(ctx, deadline)
		raw, err := conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				continue
			}
			return err
		}
		heard = time.Now()
		switch m := raw.(type) {
		case *pgproto3.ErrorResponse:
			// A decoder error (XX000) wraps ErrSlotUnreadable: run
			// recreates a slot that keeps failing so (walslot.go).
			return unreadable(fmt.Errorf("%w: %w", ErrWALUnavailable, pgconn.ErrorResponseToPgError(m)))
		case *pgproto3.CopyData:
			if len(m.Data) == 0 {
				continue
			}
			switch m.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
				if err != nil {
					return fmt.Errorf("parsing a keepalive: %w", err)
				}
				w.mu.Lock()
				if !inTxn && !ka.ReplyRequested {
					w.delay = 0 // the walsender waits for WAL: it caught up
				}
				if !inTxn && len(w.rows) == 0 && ka.ServerWALEnd > w.received && gen == w.gen {
					// Nothing of ours is in flight: the slot may move to
					// the keepalive's position, so that other tables'
					// writes do not keep WAL for it. A logical walsender's
					// keepalive carries the position it has decoded up to
					// (walsender.c: sentPtr, or the end of a transaction
					// it skipped), not the server's flush position: every
					// commit of ours below it was sent before it.
					w.received = ka.ServerWALEnd
					w.advance(ka.ServerWALEnd)
				}
				w.mu.Unlock()
				if ka.ReplyRequested {
					nextStatus = time.Now()
				}
			case pglogrepl.XLogDataByteID:
				xld, err := pglogrepl.ParseXLogData(m.Data[1:])
				if err != nil {
					return fmt.Errorf("parsing WAL data: %w", err)
				}
				msg, err := pglogrepl.Parse(xld.WALData)
				if err != nil {
					return fmt.Errorf("decoding pgoutput: %w", err)
				}
				switch lm := msg.(type) {
				case *pglogrepl.RelationMessage:
					// A relation the relay cannot map (a publication
					// with a column list) is kept with its error: its
					// rows are left to the table, below. (Other tables'
					// rows are not the relay's: skipped by OID.)
					rels[lm.RelationID] = newWALRelation(lm)
				case *pglogrepl.BeginMessage:
					inTxn, txn, commitTime, xid = true, txn[:0], lm.CommitTime, lm.Xid
				case *pglogrepl.InsertMessage:
					if lm.RelationID != w.relid {
						continue // another table of the publication
					}
					rel := rels[lm.RelationID]
					if rel == nil {
						return fmt.Errorf("decoding pgoutput: insert into relation %d before its description", lm.RelationID)
					}
					row, created, err := rel.message(lm.Tuple)
					if err != nil {
						// A row the relay cannot decode (written by hand:
						// headers that are not strings; or its relation
						// unmapped). Failing the stream here failed it at
						// this record for ever, whatever the operator did
						// to the row, and the slot kept the server's WAL.
						// The row is in the table: it is left out, and
						// the transaction's commit opens a gap, which the
						// loop covers with a claim (which reads the row as
						// it is then, and fails on it as the polling
						// relay does until it is fixed), as after a
						// restart of the stream.
						skipped, skipErr = skipped+1, err
						continue
					}
					if created.IsZero() {
						created = commitTime
					}
					txn = append(txn, walRow{msg: row, xid: xid, age: max(0, xld.ServerTime.Sub(created)), at: time.Now()})
				case *pglogrepl.LogicalDecodingMessage:
					if w.logPrefix == "" || lm.Prefix != w.logPrefix {
						continue // another application's message
					}
					if !lm.Transactional {
						w.log.Warn("WAL source: ignoring a non-transactional message with the outbox's prefix (the driver writes transactional ones)", "prefix", lm.Prefix)
						continue
					}
					msgs, err := decodeLogMessage(lm.Content)
					if err != nil {
						return fmt.Errorf("decoding the events of a logical decoding message at %s: %w", lm.LSN, err)
					}
					age := max(0, xld.ServerTime.Sub(commitTime))
					for _, m := range msgs {
						txn = append(txn, walRow{msg: m, xid: xid, age: age, at: time.Now(), log: true})
					}
				case *pglogrepl.CommitMessage:
					inTxn = false
					w.mu.Lock()
					w.delay = max(0, xld.ServerTime.Sub(lm.CommitTime))
					w.mu.Unlock()
					w.push(txn, lm.TransactionEndLSN, gen)
					txn = txn[:0]
					if skipped > 0 {
						w.skipGap(gen)
						w.undecoded.failed(skipErr, "table", w.table, "rows", skipped, "transaction_end", lm.TransactionEndLSN.String())
						skipped, skipErr = 0, nil
					}
				}
			}
		default:
			return fmt.Errorf("unexpected replication message %T", raw)
		}
	}
}

// walOutage is a run of failed streams of the log-only mode: since the
// first failure, with the last error (Ready).
type walOutage struct {
	since time.Time
	err   error
}

// streamHealthy is how long a stream must stay open to end an outage: an
// unreadable slot's streams open, then fail at once.
const streamHealthy = 2 * time.Second

// logStatusInterval is how soon, at most, a relay reading logical
// decoding messages (log-only mode) reports a position that moved: what
// it has not reported is published again after a crash.
const logStatusInterval = 100 * time.Millisecond

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// push buffers one committed transaction's rows (a transaction is never
// split; the buffer may pass Buffer by one transaction).
func (w *walReader) push(txn []walRow, end pglogrepl.LSN, gen int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if gen != w.gen {
		return // a stream rewound meanwhile: the next one reads this again
	}
	if end > w.received {
		w.received = end
	}
	if len(txn) == 0 {
		if len(w.rows) == 0 {
			w.advance(end)
		}
		return
	}
	for i := range txn {
		txn[i].end = end
		w.rows = append(w.rows, txn[i])
	}
	w.wake()
}

// advanceUnused moves the slot, in table mode, towards the server's
// current position while the relay cannot stream it (its publication
// does not publish the table's inserts, or filters them: an operator must
// act, which may take days). The slot would otherwise keep the server's
// WAL from where the stream stopped, without bound, for rows that are in
// the table and claimed from it meanwhile; the stream that opens once the
// publication is fixed starts with a claim, as after any gap (found by a
// helper: WAL grew while the relay reported itself ready). A slot of
// another plugin or database, or read by someone, is left alone. So is a
// slot that holds logical decoding messages of the table (log-only
// writers beside a relay that is not in that mode: their events are in
// no table): up to position L (the server's, read first) the slot is
// peeked for them, and moved to L only if there are none. In log-only
// mode it is never moved. Errors are logged at DEBUG: the relay claims
// from the table anyway.
func (w *walReader) advanceUnused(ctx context.Context, conn *pgconn.PgConn) {
	if w.logState != nil || time.Since(w.advancedAt) < advanceEvery {
		return
	}
	w.advancedAt = time.Now()
	q := pgconnQuery(conn)
	slot := sqlLiteral(w.cfg.Slot)
	to, err := q(ctx, "SELECT pg_current_wal_lsn()::text FROM pg_replication_slots WHERE slot_name = "+slot+
		" AND plugin = 'pgoutput' AND database = current_database() AND NOT active")
	if err == nil {
		prefix := append([]byte(w.logPrefix), 0)
		var n string
		n, err = q(ctx, "SELECT count(*) FROM pg_logical_slot_peek_binary_changes("+slot+", "+sqlLiteral(to)+"::pg_lsn, NULL, "+
			"'proto_version', '1', 'publication_names', "+sqlLiteral(w.cfg.Publication)+", 'messages', 'true') c "+
			"WHERE get_byte(c.data, 0) = 77 AND substring(c.data FROM 11 FOR "+strconv.Itoa(len(prefix))+") = '\\x"+hex.EncodeToString(prefix)+"'::bytea")
		if err == nil && n != "0" {
			w.log.Debug("WAL source: not moving the unused slot: it holds logical decoding messages of the table", "slot", w.cfg.Slot, "messages", n)
			return
		}
	}
	if err == nil {
		_, err = q(ctx, "SELECT pg_replication_slot_advance("+slot+", "+sqlLiteral(to)+"::pg_lsn)::text")
	}
	if err != nil && !strings.HasPrefix(err.Error(), "no row from") {
		w.log.Debug("WAL source: moving the unused slot to the current position failed", "slot", w.cfg.Slot, "error", err)
	}
}

// advanceEvery bounds how often advanceUnused reads and moves the slot:
// the peek decodes the WAL from the slot's position, once per attempt to
// stream (every 5 s at most) otherwise.
const advanceEvery = 10 * time.Second

// presumedDead reports whether a replication connection from which
// nothing was heard since heard is presumed dead at now: silent for more
// than limit (WALConfig.ReceiveTimeout after defaults; zero or negative:
// never).
func presumedDead(limit time.Duration, heard, now time.Time) bool {
	return limit > 0 && now.Sub(heard) > limit
}

// ensureSlot creates the slot if it is missing, and recreates it if the
// server invalidated it (wal_status 'lost': the WAL it needed was
// removed, max_slot_wal_keep_size): in table mode nothing is lost, the
// rows are in the table.
func (w *walReader) ensureSlot(ctx context.Context, conn *pgconn.PgConn) error {
	if w.cfg.Slot == "" {
		res, err := conn.Exec(ctx, "SELECT current_database()").ReadAll()
		if err != nil || len(res) != 1 || len(res[0].Rows) != 1 {
			return fmt.Errorf("%w: reading the database name: %v", ErrWALUnavailable, err)
		}
		slot := SlotName(string(res[0].Rows[0][0]), w.table)
		w.mu.Lock() // lagState reads it from another goroutine
		w.cfg.Slot = slot
		w.mu.Unlock()
	}
	res, err := conn.Exec(ctx, "SELECT 1 FROM pg_publication WHERE pubname = '"+w.cfg.Publication+"'").ReadAll()
	if err != nil {
		return fmt.Errorf("%w: reading publication %s: %v", ErrWALUnavailable, w.cfg.Publication, err)
	}
	if len(res) != 1 || len(res[0].Rows) == 0 {
		_, err := conn.Exec(ctx, "CREATE PUBLICATION "+w.cfg.Publication+" FOR TABLE "+w.quoted+" WITH (publish = 'insert')").ReadAll()
		var pe *pgconn.PgError
		if err != nil && !(errors.As(err, &pe) && pe.Code == "42710") { // 42710: another relay created it meanwhile
			return fmt.Errorf("%w: creating publication %s: %v", ErrWALUnavailable, w.cfg.Publication, err)
		}
		if err == nil {
			w.log.Info("publication created", "publication", w.cfg.Publication)
		}
	}
	res, err = conn.Exec(ctx, publicationCheck(w.cfg.Publication, w.quoted)).ReadAll()
	if err != nil {
		return fmt.Errorf("%w: reading publication %s: %v", ErrWALUnavailable, w.cfg.Publication, err)
	}
	oid, err := pgconnQuery(conn)(ctx, "SELECT COALESCE(to_regclass("+sqlLiteral(w.quoted)+")::oid, 0)::text")
	if err != nil {
		return fmt.Errorf("%w: reading the table's OID: %v", ErrWALUnavailable, err)
	}
	relid, err := strconv.ParseUint(oid, 10, 32)
	if err != nil {
		return fmt.Errorf("%w: the table's OID %q: %v", ErrWALUnavailable, oid, err)
	}
	w.relid = uint32(relid)
	if len(res) == 1 && len(res[0].Rows) == 1 {
		if err := publicationProblem(w.cfg.Publication, w.table, string(res[0].Rows[0][0]) == "t", string(res[0].Rows[0][1]) == "t", string(res[0].Rows[0][2]) == "t"); err != nil {
			w.advanceUnused(ctx, conn)
			return err
		}
	}
	if w.logState != nil {
		if err := w.logState.prepare(ctx, conn); err != nil {
			return err
		}
	}
	reason := "missing (dropped)"
	if w.recreate != "" {
		reason = "unreadable by the server (" + w.recreate + ")" // dropped below, or dropped already
	}
	res, err = conn.Exec(ctx, "SELECT COALESCE(wal_status, ''), plugin, database = current_database(), COALESCE(confirmed_flush_lsn, '0/0') FROM pg_replication_slots WHERE slot_name = '"+w.cfg.Slot+"'").ReadAll()
	if err != nil {
		return fmt.Errorf("%w: reading slot %s: %v", ErrWALUnavailable, w.cfg.Slot, err)
	}
	if len(res) == 1 && len(res[0].Rows) == 1 {
		row := res[0].Rows[0]
		if string(row[1]) != "pgoutput" || string(row[2]) != "t" {
			return fmt.Errorf("%w: slot %s exists but is not a pgoutput slot of this database: name another WALConfig.Slot", ErrInvalidConfig, w.cfg.Slot)
		}
		if w.recreate != "" && string(row[0]) != "lost" {
			if w.recreateHook != nil {
				w.recreateHook(w.cfg.Slot)
			}
			still, release, err := w.stillUnreadable(ctx, conn)
			if err != nil {
				return err
			}
			if release != nil {
				defer release() // after the new slot is created and checked
			}
			if !still {
				w.log.Info("replication slot readable again (another relay recreated it, or the failure passed): keeping it", "slot", w.cfg.Slot)
				w.recreate = ""
				reason = "missing (dropped)"
			}
		}
		switch {
		case string(row[0]) == "lost":
			reason = "invalidated (wal_status lost)"
			w.log.Warn("replication slot invalidated by the server (wal_status lost); recreating it and claiming from the table meanwhile (nothing is lost: the table holds every row)", "slot", w.cfg.Slot)
			if err := pglogrepl.DropReplicationSlot(ctx, conn, w.cfg.Slot, pglogrepl.DropReplicationSlotOptions{}); err != nil {
				return fmt.Errorf("%w: dropping the invalidated slot %s: %v", ErrWALUnavailable, w.cfg.Slot, err)
			}
		case w.recreate != "":
			// Its streams failed with a decoder error at the same
			// position for unreadableAfter, and it still fails
			// (stillUnreadable, whose lock this relay holds).
			w.log.Error("replication slot unreadable: PostgreSQL's decoder fails on it at the same position every time; dropping it and creating another (table mode loses nothing; log-only mode records the window as a loss)",
				"slot", w.cfg.Slot, "error", w.recreate)
			if err := pglogrepl.DropReplicationSlot(ctx, conn, w.cfg.Slot, pglogrepl.DropReplicationSlotOptions{}); err != nil {
				return fmt.Errorf("%w: dropping the unreadable slot %s: %v", ErrWALUnavailable, w.cfg.Slot, err)
			}
		default:
			// The stream starts at the slot's confirmed position: report
			// that until the loop takes more.
			lsn, err := pglogrepl.ParseLSN(string(row[3]))
			if err != nil {
				return fmt.Errorf("%w: slot %s: %v", ErrWALUnavailable, w.cfg.Slot, err)
			}
			w.startAt(lsn)
			if w.logState != nil {
				return w.logState.slotFound(ctx, conn, w.cfg.Slot, lsn)
			}
			return nil
		}
	}
	for attempt := 1; ; attempt++ {
		lsn, err := w.createSlot(ctx, conn)
		if err != nil {
			return err
		}
		w.recreate = ""
		if w.logState != nil {
			// Writers may emit into the slot from now on: a slot
			// dropped below as unreadable leaves a loss window.
			if err := w.logState.slotCreated(ctx, conn, w.cfg.Slot, reason, lsn); err != nil {
				return err
			}
		}
		err = w.check(ctx, pgconnQuery(conn), w.cfg.Slot, w.cfg.Publication)
		switch {
		case err == nil:
			w.startAt(lsn)
			w.log.Info("replication slot created", "slot", w.cfg.Slot)
			return nil
		case !errors.Is(err, ErrSlotUnreadable):
			// The check could not run: the slot stays, and a stream
			// that fails on it for unreadableAfter recreates it.
			return fmt.Errorf("%w: slot %s created: %w", ErrWALUnavailable, w.cfg.Slot, err)
		case attempt == slotCreateAttempts:
			return fmt.Errorf("%w: slot %s created %d times, unreadable each time: %w", ErrWALUnavailable, w.cfg.Slot, attempt, err)
		}
		w.log.Warn("replication slot created unreadable (PostgreSQL's decoder fails on it; other sessions dropped tables while it was created); dropping it and creating another",
			"slot", w.cfg.Slot, "attempt", attempt, "error", err)
		if err := pglogrepl.DropReplicationSlot(ctx, conn, w.cfg.Slot, pglogrepl.DropReplicationSlotOptions{}); err != nil {
			return fmt.Errorf("%w: dropping the unreadable slot %s: %v", ErrWALUnavailable, w.cfg.Slot, err)
		}
		reason = WALLossUnreadableAtCreation
	}
}

// createSlot creates the slot and returns its consistent point, once the
// commits before it are visible (waitCommitsVisible).
func (w *walReader) createSlot(ctx context.Context, conn *pgconn.PgConn) (pglogrepl.LSN, error) {
	// The server waits for the transactions running now to end before
	// the slot's consistent point: one left open elsewhere holds the
	// creation as long as it stays open. Say so, rather than wait
	// silently (found by a helper: 12 s of an open transaction, nothing
	// logged).
	slow := time.AfterFunc(w.createSlow, func() {
		w.log.Warn("replication slot still being created: PostgreSQL waits for the transactions that were running when the creation began to end (a transaction left open elsewhere holds it: pg_stat_activity, state 'idle in transaction'); log-only writers are refused (driver.ErrNoSlot) until it completes, table mode claims meanwhile",
			"slot", w.cfg.Slot, "waited", w.createSlow)
	})
	defer slow.Stop()
	created, err := pglogrepl.CreateReplicationSlot(ctx, conn, w.cfg.Slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42710" { // another relay created it meanwhile
			return 0, fmt.Errorf("%w: slot %s was created by another relay meanwhile", ErrWALUnavailable, w.cfg.Slot)
		}
		return 0, fmt.Errorf("%w: creating slot %s: %v", ErrWALUnavailable, w.cfg.Slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(created.ConsistentPoint)
	if err != nil {
		return 0, fmt.Errorf("%w: slot %s created at %q: %v", ErrWALUnavailable, w.cfg.Slot, created.ConsistentPoint, err)
	}
	if err := waitCommitsVisible(ctx, conn); err != nil {
		return 0, fmt.Errorf("%w: slot %s created: %v", ErrWALUnavailable, w.cfg.Slot, err)
	}
	return lsn, nil
}

// commitsInvisible counts the transactions that have committed (the
// commit log says so) but that snapshots still show running: the backend
// writes its commit record and sets the commit log before it leaves the
// process array.
const commitsInvisible = "SELECT count(*) FROM pg_snapshot_xip(pg_current_snapshot()) AS x(xid) WHERE pg_xact_status(x.xid) = 'committed'"

// waitCommitsVisible returns once no transaction that has committed is
// still invisible to new snapshots. A new slot streams the transactions
// that commit after its consistent point, and the claim that follows
// (the stream starts with a gap) must see every one that committed
// before it; the consistent point is reached when the decoder reads the
// last running transaction's commit record, which can be a moment before
// that transaction becomes visible. Without this wait the claim could
// miss such a row and the loop go back to the stream, which does not
// carry it: it waited for the next poll while later events of its
// aggregate went out (TestWALSourceRelayKilledAtRandomMoments, once,
// on a loaded machine: the first relay created the slot while the
// writers committed). It polls every millisecond; the wait is
// microseconds unless the machine is saturated.
func waitCommitsVisible(ctx context.Context, conn *pgconn.PgConn) error {
	return waitVisible(ctx, pgconnQuery(conn))
}

// waitVisible is waitCommitsVisible on q (a pool, or a connection).
func waitVisible(ctx context.Context, q queryOne) error {
	for {
		n, err := q(ctx, commitsInvisible)
		if err != nil {
			return fmt.Errorf("waiting for the commits decoded to be visible: %w", err)
		}
		if n == "0" {
			return nil
		}
		t := time.NewTimer(time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// publicationCheck is the query for publicationProblem: whether
// publication pub publishes inserts, and whether it publishes table (a
// quoted SQL name), by any of its forms (FOR TABLE, TABLES IN SCHEMA, ALL
// TABLES). It compares the table's OID with those of the publication's
// tables (pg_get_publication_tables, whose relid column every supported
// version has): it used to cast the names of pg_publication_tables' rows
// to regclass, and a name whose table another session dropped meanwhile
// failed the whole statement ("relation ... does not exist"; seen once
// in a loaded run of TestWALCreateCommand). The third column says
// whether the publication has a row filter on the table (PostgreSQL 15's
// WHERE; read through to_jsonb, so that a version without the qual column
// answers false). Plain text: it runs on a replication connection too.
func publicationCheck(pub, table string) string {
	return "SELECT p.pubinsert, EXISTS (SELECT 1 FROM pg_get_publication_tables(p.pubname::text) g " +
		"WHERE g.relid = to_regclass(" + sqlLiteral(table) + ")), " +
		"EXISTS (SELECT 1 FROM pg_get_publication_tables(p.pubname::text) g " +
		"WHERE g.relid = to_regclass(" + sqlLiteral(table) + ") AND to_jsonb(g) ->> 'qual' IS NOT NULL) " +
		"FROM pg_publication p WHERE p.pubname = " + sqlLiteral(pub)
}

// publicationProblem returns the error (wrapping ErrInvalidConfig) for a
// publication that exists under the source's name but would not stream
// every insert of the table: one made for other tables, without inserts,
// or with a row filter. A row filter keeps rows out of the stream with
// no gap the relay could see: such a row waited for the fallback poll
// while later events of its aggregate went out from the stream (found by
// a helper: A-2 published before A-1).
func publicationProblem(pub, table string, inserts, hasTable, filtered bool) error {
	switch {
	case !hasTable:
		return fmt.Errorf("%w: publication %s does not publish table %s: name another WALConfig.Publication (--wal-publication), or ALTER PUBLICATION %s ADD TABLE %s", ErrInvalidConfig, pub, table, pub, table)
	case !inserts:
		return fmt.Errorf("%w: publication %s does not publish inserts: ALTER PUBLICATION %s SET (publish = 'insert')", ErrInvalidConfig, pub, pub)
	case filtered:
		return fmt.Errorf("%w: publication %s has a row filter on table %s, and the WAL source needs every row (per-aggregate order): ALTER PUBLICATION %s SET TABLE %s", ErrInvalidConfig, pub, table, pub, table)
	}
	return nil
}

// sqlLiteral quotes s as an SQL string literal (standard_conforming_strings).
func sqlLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// startAt sets the reported position to lsn, the slot's confirmed
// position when a stream starts, and empties the buffer: the stream
// starts with a gap, and the claim that covers it reads those rows from
// the table (the new stream may deliver them again too).
func (w *walReader) startAt(lsn pglogrepl.LSN) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rows = nil
	w.confirmed, w.received = lsn, lsn
}

// walRelation maps the outbox table's columns, as pgoutput describes
// them, to a Message.
type walRelation struct {
	idx map[string]int
	err error // the relation cannot be mapped: every row of it fails with err
}

var walColumns = []string{"id", "message_id", "aggregate_type", "aggregate_id", "event_type", "topic", "partition_key",
	"content_type", "payload", "headers", "attempts", "created_at"}

// newWALRelation maps m's columns; a relation without one of walColumns
// (a publication with a column list, or not an outbox table) has err set.
func newWALRelation(m *pglogrepl.RelationMessage) *walRelation {
	r := &walRelation{idx: map[string]int{}}
	for i, c := range m.Columns {
		r.idx[c.Name] = i
	}
	for _, c := range walColumns {
		if _, ok := r.idx[c]; !ok {
			r.err = fmt.Errorf("relation %s.%s in the publication has no column %s (a publication column list, or not an outbox table)", m.Namespace, m.RelationName, c)
			break
		}
	}
	return r
}

// message decodes one inserted row (text format), and its created_at
// (zero if it does not parse).
func (r *walRelation) message(t *pglogrepl.TupleData) (Message, time.Time, error) {
	var m Message
	if r.err != nil {
		return m, time.Time{}, r.err
	}
	if t == nil {
		return m, time.Time{}, errors.New("insert without a tuple")
	}
	col := func(name string) (string, bool, error) {
		i := r.idx[name]
		if i >= len(t.Columns) {
			return "", false, fmt.Errorf("column %s missing from the tuple", name)
		}
		c := t.Columns[i]
		switch c.DataType {
		case pglogrepl.TupleDataTypeNull:
			return "", false, nil
		case pglogrepl.TupleDataTypeText:
			return string(c.Data), true, nil
		}
		return "", false, fmt.Errorf("column %s: unexpected tuple data type %q", name, c.DataType)
	}
	var err error
	text := func(name string) string {
		if err != nil {
			return ""
		}
		var v string
		v, _, err = col(name)
		return v
	}
	num := func(name string) int64 {
		s := text(name)
		if err != nil {
			return 0
		}
		var n int64
		n, err = strconv.ParseInt(s, 10, 64)
		return n
	}
	m.ID = num("id")
	m.MessageID = text("message_id")
	m.AggregateType = text("aggregate_type")
	m.AggregateID = text("aggregate_id")
	m.EventType = text("event_type")
	m.Topic = text("topic")
	m.Partition = int(num("partition_key"))
	m.ContentType = text("content_type")
	m.Attempts = int(num("attempts"))
	payload := text("payload")
	headers := text("headers")
	created := text("created_at")
	if err != nil {
		return m, time.Time{}, err
	}
	if !strings.HasPrefix(payload, `\x`) {
		return m, time.Time{}, errors.New("payload is not in bytea's hex form")
	}
	if m.Payload, err = hex.DecodeString(payload[2:]); err != nil {
		return m, time.Time{}, fmt.Errorf("payload: %w", err)
	}
	if headers != "" {
		if err := json.Unmarshal([]byte(headers), &m.Headers); err != nil {
			return m, time.Time{}, fmt.Errorf("headers of row %d: %w", m.ID, err)
		}
	}
	ts, _ := time.Parse("2006-01-02 15:04:05.999999-07", created)
	return m, ts, nil
}
