package inbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/cenkalti/backoff/v4"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/sqlerr"
)

// DefaultTable is the inbox table's default name.
const DefaultTable = "inbox_message"

// Limits on the text fields of a Message and on Config.Consumer, in bytes.
// Text fields must be valid UTF-8 without NUL (PostgreSQL's text columns
// reject NUL; MySQL's columns are VARBINARY of these sizes).
const (
	MaxConsumerBytes      = 128
	MaxMessageIDBytes     = 255
	MaxAggregateTypeBytes = 255
	MaxAggregateIDBytes   = 255
	MaxTopicBytes         = 255
	// MaxCauseBytes is how much of a park or retry cause is stored; a
	// longer cause is cut at a rune boundary.
	MaxCauseBytes = 2000
)

// Errors returned by this package; match them with errors.Is.
var (
	// ErrInvalidConfig: New was given a Config it cannot use (unknown
	// dialect, bad table name, missing or invalid Consumer), or Retention
	// an invalid RetentionConfig.
	ErrInvalidConfig = errors.New("inbox: invalid config")
	// ErrInvalidMessage: a Message with an empty or invalid ID, or a text
	// field too long or not valid UTF-8 without NUL. Nothing was written.
	ErrInvalidMessage = errors.New("inbox: invalid message")
	// ErrHandler wraps the error of the handler given to Handle or Retry
	// (the handler's own error is wrapped too: errors.Is matches both).
	// The transaction was rolled back: neither the effect nor the inbox row
	// was committed.
	ErrHandler = errors.New("inbox: handler failed")
	// ErrHandlerPanic wraps the value of a handler panic that Handle,
	// HandleBatch, Retry or ServeRequests recovered (with ErrHandler: the
	// transaction was rolled back, as for a handler error). The stack is
	// logged at ERROR.
	ErrHandlerPanic = errors.New("inbox: handler panicked")
	// ErrInvalidFilter: Retry or Skip with a ParkedFilter that selects
	// nothing explicitly (no ID, no AggregateID, All not set), or a
	// negative Limit.
	ErrInvalidFilter = errors.New("inbox: invalid parked filter")
	// ErrNothingMatched: Retry or Skip found no parked (Skip) or parked or
	// held (Retry) message of this consumer matching the filter.
	// ListParked returns an empty list and nil instead: an empty list is
	// an answer there.
	ErrNothingMatched = errors.New("inbox: no parked message matched")
	// ErrSchemaTooNew: the inbox table was migrated by a newer build.
	ErrSchemaTooNew = errors.New("inbox: schema is newer than this build")
	// ErrSchemaMissing: Check found no migrated inbox table, or a
	// statement of Handle, HandleBatch, Park, Retry, Skip, ListParked,
	// RequestRetry or ServeRequests found its table missing (SQLSTATE
	// 42P01, MySQL error 1146, SQLite "no such table"); the driver's
	// error is wrapped too.
	ErrSchemaMissing = errors.New("inbox: inbox table is missing or not migrated")
	// ErrSchemaOutdated: Check found the table at an older version than
	// this build needs; run Migrate.
	ErrSchemaOutdated = errors.New("inbox: inbox schema is outdated")
	// ErrNotReady is wrapped by a broker runner's Ready (inbox/nats,
	// inbox/rabbitmq, inbox/redis, inbox/kafka) while the runner is not
	// consuming: before Run, after it returned, or while it cannot consume
	// (the cause is wrapped too, e.g. ErrSourceMissing).
	ErrNotReady = errors.New("inbox: runner not ready")
	// ErrSourceMissing is wrapped by a broker runner's errors when what it
	// consumes from does not exist: the NATS stream, the RabbitMQ
	// exchange its queue binds, the Redis stream key, the Kafka topic. The
	// error names what to create (and the outbox command that creates it,
	// where there is one). Each runner re-exports it under its own name.
	ErrSourceMissing = errors.New("inbox: what the runner consumes from does not exist")
)

// Message is one received message as the inbox sees it.
type Message struct {
	// ID is the message ID (the outbox's message ID header); with the
	// consumer name it is the dedupe key. Required, 1 to MaxMessageIDBytes.
	ID string
	// AggregateType and AggregateID name the aggregate the message belongs
	// to. While a message of the same consumer and aggregate is parked,
	// later ones are stored as held instead of applied, so the aggregate's
	// order is kept. Both empty: the message holds nothing and is never
	// held.
	AggregateType, AggregateID string
	// Topic, Partition and Offset say where the message came from; they
	// are stored for operators and not interpreted.
	Topic     string
	Partition int32
	Offset    int64
	// Key, Headers and Payload are the message's bytes. They are stored
	// only for parked and held messages (Retry needs them); a processed
	// row keeps none of them. An empty Headers map comes back nil.
	Key     []byte
	Headers map[string]string
	Payload []byte
}

func (m Message) held() bool { return m.AggregateType != "" || m.AggregateID != "" }

// Status of a stored message (the status column).
const (
	statusProcessed = 1
	statusParked    = 2
	statusHeld      = 3
	statusSkipped   = 4
)

// Outcome is what Handle did with a message.
type Outcome int

const (
	// Applied: the handler ran and its transaction, with the inbox row,
	// committed.
	Applied Outcome = iota + 1
	// Duplicate: the message was processed (or skipped) before, by this
	// consumer; the handler did not run.
	Duplicate
	// Held: the message's aggregate is held behind a parked message: it
	// was stored (held) and the handler did not run; Retry runs it later.
	// A redelivery of a message already stored as parked or held is Held
	// too.
	Held
)

// String returns "applied", "duplicate" or "held".
func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Held:
		return "held"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Filter is an optional pre-filter Handle asks before it begins a
// transaction (package github.com/sqloutbox/outbox/inbox/redis implements
// it on Redis). The table stays the authority: the filter may only save
// work, never decide that a message is new.
type Filter interface {
	// Seen reports whether consumer has certainly processed id before:
	// true makes Handle return Duplicate without a transaction. false, or
	// an error (which means "unknown"), falls back to the table.
	Seen(ctx context.Context, consumer, id string) (bool, error)
	// Mark records that consumer processed id. Handle calls it only after
	// the database commit (a mark written before a handler that then
	// failed would drop the message); its error is logged and never fails
	// the message.
	Mark(ctx context.Context, consumer, id string) error
}

// BatchMarker is an optional extension of a Filter: MarkAll records that
// consumer processed every one of ids at once (inboxredis: one pipelined
// round trip). HandleBatch uses it, when the Filter has it, instead of one
// Mark per message; like Mark, it is called only after the commit, and
// its error is logged and never fails a message.
type BatchMarker interface {
	MarkAll(ctx context.Context, consumer string, ids []string) error
}

// Config configures an Inbox.
type Config struct {
	// Dialect of the database: driver.Postgres, driver.MySQL or
	// driver.SQLite. Required.
	Dialect driver.Dialect
	// Table is the inbox table, "name" or "schema.name" (letters, digits,
	// underscores, not starting with a digit; name at most
	// MaxTableNameBytes, schema at most 63). Default DefaultTable. Migrate
	// also creates <name>_migrations beside it.
	Table string
	// Consumer names the consuming service (or consumer group); the dedupe
	// key is (Consumer, Message.ID), so several consumers share one table
	// and each applies a message once. Required, 1 to MaxConsumerBytes of
	// UTF-8 without NUL.
	Consumer string
	// Filter is an optional pre-filter (package inboxredis); nil: the
	// table alone.
	Filter Filter
	// Observer hears what Handle, Park, Retry and Skip do; nil: nothing.
	Observer Observer
	// Logger receives warnings (a Filter error); default slog.Default().
	Logger *slog.Logger
}

// Inbox is one consumer's view of an inbox table. Create it with New; it
// is safe for concurrent use.
type Inbox struct {
	cfg   Config
	s     *schema
	obs   Observer
	log   *slog.Logger
	stats counters
}

// New validates cfg and returns an Inbox. It does not touch a database.
// It returns an error wrapping ErrInvalidConfig for an unknown dialect, an
// invalid table name or an empty or invalid Consumer.
func New(cfg Config) (*Inbox, error) {
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if err := checkText(cfg.Consumer, MaxConsumerBytes, true); err != nil {
		return nil, fmt.Errorf("%w: Consumer %s", ErrInvalidConfig, err)
	}
	s, err := newSchema(cfg.Dialect, cfg.Table)
	if err != nil {
		return nil, err
	}
	in := &Inbox{cfg: cfg, s: s, obs: cfg.Observer, log: cfg.Logger}
	if in.obs == nil {
		in.obs = NopObserver{}
	}
	if in.log == nil {
		in.log = slog.Default()
	}
	in.log = in.log.With("component", "outbox.inbox", "table", cfg.Table, "consumer", cfg.Consumer)
	return in, nil
}

// Config returns the configuration with defaults applied.
func (in *Inbox) Config() Config { return in.cfg }

// Migrate creates or upgrades the inbox table and its indexes (and
// <table>_migrations, which records the applied versions) on db. It is
// idempotent and safe to run from several processes at once
// (PostgreSQL: an advisory lock and transactional DDL; MySQL/MariaDB:
// GET_LOCK; SQLite: BEGIN IMMEDIATE). A database migrated by a newer
// build is refused with ErrSchemaTooNew.
func (in *Inbox) Migrate(ctx context.Context, db *sql.DB) error {
	if db == nil {
		return fmt.Errorf("%w: Migrate needs a *sql.DB", ErrInvalidConfig)
	}
	return in.s.migrate(ctx, db)
}

// Check reports whether db's inbox table is migrated to the version this
// build needs, without changing anything (for a consumer's start-up or
// readiness check): nil, or ErrSchemaMissing, ErrSchemaOutdated or
// ErrSchemaTooNew (wrapped with the versions), or the database error. A
// schema applied from DDL by another tool has no recorded version: run
// Migrate over it once (it only records the version; every statement is
// IF NOT EXISTS) or Check reports ErrSchemaMissing.
func (in *Inbox) Check(ctx context.Context, db *sql.DB) error {
	if db == nil {
		return fmt.Errorf("%w: Check needs a *sql.DB", ErrInvalidConfig)
	}
	var v sql.NullInt64
	if err := db.QueryRowContext(ctx, "SELECT MAX(version) FROM "+in.s.migrationsTable()).Scan(&v); err != nil {
		// A missing table is the common case of "not migrated"; the
		// ping tells it apart from a dead connection.
		if perr := db.PingContext(ctx); perr != nil {
			return fmt.Errorf("inbox: check: %w", perr)
		}
		v = sql.NullInt64{}
	}
	switch latest := int64(in.s.latest()); {
	case !v.Valid || v.Int64 == 0:
		return fmt.Errorf("%w: table %s (run Migrate or apply DDL)", ErrSchemaMissing, in.cfg.Table)
	case v.Int64 < latest:
		return fmt.Errorf("%w: table %s at version %d, this build needs %d", ErrSchemaOutdated, in.cfg.Table, v.Int64, latest)
	case v.Int64 > latest:
		return fmt.Errorf("%w: table %s at version %d, this build knows up to %d", ErrSchemaTooNew, in.cfg.Table, v.Int64, latest)
	}
	return nil
}

// DDL returns the inbox's schema as one SQL script for the configured
// dialect and table, for teams that apply schema changes with their own
// tool (the <table>_migrations bookkeeping is not included).
func (in *Inbox) DDL() string { return in.s.ddl() }

// checkText validates a text field: at most max bytes of valid UTF-8
// without NUL, and not empty if required.
func checkText(v string, max int, required bool) error {
	switch {
	case required && v == "":
		return errors.New("is empty")
	case len(v) > max:
		return fmt.Errorf("is %d bytes, more than %d", len(v), max)
	case !utf8.ValidString(v):
		return errors.New("is not valid UTF-8")
	case strings.IndexByte(v, 0) >= 0:
		return errors.New("contains NUL")
	}
	return nil
}

func validate(m Message) error {
	for _, f := range []struct {
		name     string
		v        string
		max      int
		required bool
	}{
		{"ID", m.ID, MaxMessageIDBytes, true},
		{"AggregateType", m.AggregateType, MaxAggregateTypeBytes, false},
		{"AggregateID", m.AggregateID, MaxAggregateIDBytes, false},
		{"Topic", m.Topic, MaxTopicBytes, false},
	} {
		if err := checkText(f.v, f.max, f.required); err != nil {
			return fmt.Errorf("%w: %s %s", ErrInvalidMessage, f.name, err)
		}
	}
	return nil
}

// causeText renders a park or retry cause for the cause column.
func causeText(err error) string {
	if err == nil {
		return ""
	}
	s := strings.ToValidUTF8(strings.ReplaceAll(err.Error(), "\x00", ""), "\uFFFD")
	if len(s) > MaxCauseBytes {
		cut := MaxCauseBytes
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}

// Handle processes msg exactly once per consumer: it begins a transaction
// on db with a fresh outbox emit scope (outbox.NewContext), so that a
// handler may outbox.Emit through an outbox-wrapped db into the same
// transaction (the chained-service case); records (Consumer, msg.ID) in
// the inbox table under its unique key; runs fn with the transaction; and
// commits both together.
//
// A message recorded before (processed or skipped) is recognised, without
// running fn: Duplicate, nil. A configured Filter is asked first and may
// answer Duplicate without a transaction; it is marked after the commit.
// While an earlier message of the same consumer and aggregate is parked or
// held, msg is stored as held, fn does not run, and Handle returns Held
// (Retry runs it later, in order).
//
// Concurrent deliveries of one message apply it once: the others wait on
// the unique key and then return Duplicate, or, if the one they waited for
// rolled back (its handler failed), one of them applies it. On MySQL and
// MariaDB, three or more waiters released by that rollback can deadlock
// each other on the key (InnoDB error 1213, which rolls the loser's whole
// transaction back, before its fn ran); Handle retries such a transaction,
// up to DeadlockRetries times, so the caller sees Duplicate or Applied, not
// the deadlock (TestConcurrentDeliveriesAfterAFailure: 1 applied, the rest
// duplicates, on every dialect). PostgreSQL's deadlock and serialization
// failures (SQLSTATE 40P01, 40001) in the inbox's own statements are
// retried the same way.
//
// fn's error rolls everything back (the effect and the inbox row, so a
// redelivery applies the message) and is returned wrapped with ErrHandler
// (errors.Is matches both); the Outcome is then 0. fn must not commit or
// roll back tx. A panic in fn is recovered: the transaction is rolled
// back, the stack logged at ERROR, and Handle returns an error wrapping
// ErrHandler and ErrHandlerPanic, like a handler error (the runners retry
// it, then park it).
//
// Errors: a nil db or fn returns ErrInvalidConfig; an invalid msg
// ErrInvalidMessage, before anything is written; an inbox table that does
// not exist ErrSchemaMissing (run Migrate); any other database error is
// returned wrapped, and the message counts as not processed (a redelivery
// decides).
//
// On SQLite give db one connection (db.SetMaxOpenConns(1)), as for the
// outbox: SQLite has one writer, and a transaction that read first cannot
// always wait for it.
//
// The held check assumes one aggregate's messages are handled one at a
// time, in order (the runners do so per partition): a message handled
// concurrently with the Park of an earlier one of its aggregate may be
// applied instead of held.
func (in *Inbox) Handle(ctx context.Context, db *sql.DB, msg Message, fn func(ctx context.Context, tx *sql.Tx) error) (Outcome, error) {
	if db == nil || fn == nil {
		return 0, fmt.Errorf("%w: Handle needs a *sql.DB and a handler", ErrInvalidConfig)
	}
	if err := validate(msg); err != nil {
		return 0, err
	}
	if f := in.cfg.Filter; f != nil {
		seen, err := f.Seen(ctx, in.cfg.Consumer, msg.ID)
		switch {
		case err != nil:
			in.stats.filterErrors.Add(1)
			in.log.Warn("inbox filter unavailable; checking the table", "message_id", msg.ID, "error", err)
		case seen:
			in.stats.filterHits.Add(1)
			in.stats.duplicates.Add(1)
			in.obs.Duplicate(msg)
			return Duplicate, nil
		}
	}
	start := time.Now()
	var out Outcome
	err := in.retryDeadlocks(ctx, func() (err error) {
		out, err = in.handle(ctx, db, msg, fn)
		return err
	})
	err = in.storeErr(err)
	switch {
	case err != nil:
		if errors.Is(err, ErrHandler) {
			in.stats.handlerErrors.Add(1)
			in.obs.HandlerFailed(msg, err)
		}
		return 0, err
	case out == Applied:
		in.stats.applied.Add(1)
		in.obs.Applied(msg, time.Since(start))
		in.mark(ctx, msg.ID)
	case out == Duplicate:
		in.stats.duplicates.Add(1)
		in.obs.Duplicate(msg)
		// A lost filter key (expired, evicted, deleted) costs one
		// transaction; put it back.
		in.mark(ctx, msg.ID)
	case out == Held:
		in.stats.held.Add(1)
		in.obs.Held(msg)
	}
	return out, nil
}

func (in *Inbox) mark(ctx context.Context, id string) {
	if f := in.cfg.Filter; f != nil {
		if err := f.Mark(context.WithoutCancel(ctx), in.cfg.Consumer, id); err != nil {
			in.stats.filterErrors.Add(1)
			in.log.Warn("inbox filter mark failed (the table still dedupes)", "message_id", id, "error", err)
		}
	}
}

func (in *Inbox) handle(ctx context.Context, db *sql.DB, msg Message, fn func(ctx context.Context, tx *sql.Tx) error) (Outcome, error) {
	pg := in.s.dialect == driver.Postgres
	held := false
	if msg.held() && !pg {
		// MySQL and SQLite: the hold probe, before the transaction, so
		// that the transaction's first statement is its INSERT (SQLite:
		// a write transaction from the start, not a read that must be
		// upgraded). It is a plain read inside the transaction too: see
		// the ordering assumption in Handle's doc. The probe does not
		// read the message's status as PostgreSQL's does (on MariaDB that
		// costs about 50 µs more per message; duplicates are the rare
		// path, and the INSERT finds them).
		var one int
		err := db.QueryRowContext(ctx, in.s.q("held"), in.cfg.Consumer, msg.AggregateType, msg.AggregateID).Scan(&one)
		switch {
		case err == nil:
			held = true
		case !errors.Is(err, sql.ErrNoRows):
			return 0, fmt.Errorf("inbox: message %q: hold check: %w", msg.ID, err)
		}
	}
	ctx = outbox.NewContext(ctx)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("inbox: message %q: begin: %w", msg.ID, err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	if msg.held() && pg {
		// PostgreSQL: the hold probe rides in the inbox INSERT.
		res, err := tx.ExecContext(ctx, in.s.q("insert_processed_unheld"), in.cfg.Consumer, msg.ID,
			msg.AggregateType, msg.AggregateID, msg.Topic, msg.Partition, msg.Offset,
			in.cfg.Consumer, msg.AggregateType, msg.AggregateID)
		if err != nil {
			return 0, fmt.Errorf("inbox: message %q: recording: %w", msg.ID, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return 0, fmt.Errorf("inbox: message %q: recording: %w", msg.ID, err)
		} else if n == 1 {
			return in.run(ctx, tx, msg, fn)
		}
		// Held or recorded before: one probe tells a message recorded
		// before (a duplicate, or stored parked or held) from one whose
		// aggregate is held.
		var status, hold sql.NullInt64
		err = tx.QueryRowContext(ctx, in.s.q("recorded"), in.cfg.Consumer, msg.ID, in.cfg.Consumer, msg.AggregateType, msg.AggregateID).Scan(&status, &hold)
		if err != nil {
			return 0, fmt.Errorf("inbox: message %q: hold check: %w", msg.ID, err)
		}
		if status.Valid {
			return recordedOutcome(int(status.Int64)), nil
		}
		held = hold.Valid
	}
	var res sql.Result
	if held {
		res, err = tx.ExecContext(ctx, in.s.q("insert_stored"), in.storedArgs(msg, statusHeld, "", 0)...)
	} else {
		res, err = tx.ExecContext(ctx, in.s.q("insert_processed"), in.cfg.Consumer, msg.ID,
			msg.AggregateType, msg.AggregateID, msg.Topic, msg.Partition, msg.Offset)
	}
	if err != nil {
		return 0, fmt.Errorf("inbox: message %q: recording: %w", msg.ID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("inbox: message %q: recording: %w", msg.ID, err)
	}
	if n == 0 { // recorded before
		var status int
		if err := tx.QueryRowContext(ctx, in.s.q("status"), in.cfg.Consumer, msg.ID).Scan(&status); err != nil {
			return 0, fmt.Errorf("inbox: message %q: reading the recorded status: %w", msg.ID, err)
		}
		return recordedOutcome(status), nil
	}
	if held {
		if err := tx.Commit(); err != nil {
			return 0, fmt.Errorf("inbox: message %q: commit: %w", msg.ID, err)
		}
		return Held, nil
	}
	return in.run(ctx, tx, msg, fn)
}

// run runs fn in tx, where msg's inbox row is recorded, and commits.
func (in *Inbox) run(ctx context.Context, tx *sql.Tx, msg Message, fn func(ctx context.Context, tx *sql.Tx) error) (Outcome, error) {
	if err, _ := in.call(msg, func() error { return fn(ctx, tx) }); err != nil {
		return 0, err
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("inbox: message %q: commit: %w", msg.ID, err)
	}
	return Applied, nil
}

// DeadlockRetries is how many times Handle and HandleBatch run a
// transaction again that the database rolled back to break a deadlock in
// the inbox's own statements, after about 2 ms, then 4 ms, and so on
// (±50 % jitter).
const DeadlockRetries = 5

// retryDeadlocks runs op, and runs it again (up to DeadlockRetries times,
// with a short jittered exponential backoff) while it fails with a
// deadlock or serialization failure that is not the handler's
// (sqlerr.Deadlock): the database rolled the whole transaction back, so
// running it again is safe. It returns op's last error.
func (in *Inbox) retryDeadlocks(ctx context.Context, op func() error) error {
	b := backoff.WithContext(backoff.WithMaxRetries(backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(2*time.Millisecond),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0.5),
		backoff.WithMaxElapsedTime(0)), DeadlockRetries), ctx)
	var last error
	_ = backoff.RetryNotify(func() error {
		last = op()
		if last == nil || errors.Is(last, ErrHandler) || !sqlerr.Deadlock(last) {
			return backoff.Permanent(last)
		}
		return last
	}, b, func(err error, _ time.Duration) {
		in.stats.deadlocks.Add(1)
		in.log.Debug("inbox transaction rolled back by a deadlock; retrying", "error", err)
	})
	return last
}

// call runs a handler for msg, recovering a panic into an error wrapping
// ErrHandlerPanic (the stack is logged). It returns the handler's error
// wrapped with ErrHandler, and the handler's own error (the cause Retry
// stores).
func (in *Inbox) call(msg Message, f func() error) (wrapped, cause error) {
	defer func() {
		if v := recover(); v != nil {
			in.log.Error("inbox handler panicked; its transaction is rolled back", "message_id", msg.ID,
				"panic", fmt.Sprint(v), "stack", string(debug.Stack()))
			cause = fmt.Errorf("%w: %v", ErrHandlerPanic, v)
			wrapped = fmt.Errorf("%w: message %q: %w", ErrHandler, msg.ID, cause)
		}
	}()
	if err := f(); err != nil {
		return fmt.Errorf("%w: message %q: %w", ErrHandler, msg.ID, err), err
	}
	return nil, nil
}

// storeErr marks a database error that found the inbox table missing with
// ErrSchemaMissing; other errors are returned as they are.
func (in *Inbox) storeErr(err error) error {
	if err == nil || errors.Is(err, ErrHandler) || errors.Is(err, ErrSchemaMissing) || !sqlerr.UndefinedTable(err) {
		return err
	}
	return fmt.Errorf("%w: table %s (run Migrate or apply DDL): %w", ErrSchemaMissing, in.cfg.Table, err)
}

// recordedOutcome is Handle's answer for a message recorded before with
// status.
func recordedOutcome(status int) Outcome {
	if status == statusParked || status == statusHeld {
		return Held
	}
	return Duplicate
}

func (in *Inbox) storedArgs(msg Message, status int, why string, attempts int) []any {
	var c any
	if why != "" {
		c = why
	}
	return []any{in.cfg.Consumer, msg.ID, status, msg.AggregateType, msg.AggregateID, msg.Topic, msg.Partition, msg.Offset,
		nilIfEmpty(msg.Key), encodeHeaders(msg.Headers), nilIfEmpty(msg.Payload), c, attempts}
}

func nilIfEmpty(b []byte) any {
	if b == nil {
		return nil
	}
	if len(b) == 0 {
		return []byte{}
	}
	return b
}

// counters are an Inbox's running totals.
type counters struct {
	applied, duplicates, held, handlerErrors, parked, retried, skipped, filterHits, filterErrors, deadlocks atomic.Uint64
}

// Stats are an Inbox's running totals since New, for tests and status
// pages (an Observer gets the same events one by one).
type Stats struct {
	// Applied: handler transactions committed (Handle and Retry).
	Applied uint64
	// Duplicates: messages skipped as processed before (FilterHits of
	// them without a transaction).
	Duplicates uint64
	// Held: messages stored behind a parked message of their aggregate.
	Held uint64
	// HandlerErrors: handler calls that returned an error (Handle and Retry).
	HandlerErrors uint64
	// Parked: Park calls that stored a message as parked.
	Parked uint64
	// Retried: messages Retry applied (also counted in Applied).
	Retried uint64
	// Skipped: messages Skip marked skipped.
	Skipped uint64
	// FilterHits: duplicates the Filter answered; FilterErrors: Seen or
	// Mark calls that failed (the table decided).
	FilterHits, FilterErrors uint64
	// Deadlocks: transactions the database rolled back to break a
	// deadlock (or a serialization conflict) in the inbox's own
	// statements, which Handle or HandleBatch then ran again.
	Deadlocks uint64
}

// Stats returns the running totals.
func (in *Inbox) Stats() Stats {
	c := &in.stats
	return Stats{Applied: c.applied.Load(), Duplicates: c.duplicates.Load(), Held: c.held.Load(),
		HandlerErrors: c.handlerErrors.Load(), Parked: c.parked.Load(), Retried: c.retried.Load(),
		Skipped: c.skipped.Load(), FilterHits: c.filterHits.Load(), FilterErrors: c.filterErrors.Load(),
		Deadlocks: c.deadlocks.Load()}
}
