package driver

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/partition"
)

// Dialect names the SQL dialect of the wrapped database.
type Dialect string

// The supported dialects.
const (
	// Postgres: PostgreSQL 12+ through lib/pq or pgx's stdlib driver.
	Postgres Dialect = "postgres"
	// MySQL: MySQL 8.0+ or MariaDB 10.6+ through go-sql-driver/mysql.
	MySQL Dialect = "mysql"
	// SQLite: SQLite 3.42+ through modernc.org/sqlite (pure Go).
	SQLite Dialect = "sqlite"
)

// DefaultTable is the outbox table's default name, the seed article's
// outbox_message.
const DefaultTable = "outbox_message"

// Errors returned by this package; match them with errors.Is.
var (
	// ErrInvalidConfig: Config failed validation (unknown dialect, bad
	// table name, partition count out of range, negative limits).
	ErrInvalidConfig = errors.New("outbox: invalid driver config")
	// ErrDriverRegistered: Register was given a name database/sql already knows.
	ErrDriverRegistered = errors.New("outbox: sql driver name already registered")
	// ErrWriteEvents: the commit hook could not INSERT the transaction's
	// events; it rolled the transaction back, so neither the business
	// changes nor the events were committed. The driver's error is wrapped.
	ErrWriteEvents = errors.New("outbox: writing events before COMMIT failed; transaction rolled back")
	// ErrNoSlot (Config.LogOnly): no logical replication slot of the
	// pgoutput plugin exists in the database, or the only ones are still
	// being created (the server waits for the transactions running at
	// the creation to end, and decodes only what commits after), so a
	// logical decoding message written now would reach no relay.
	// Returned wrapped in ErrWriteEvents by a commit with events; create
	// the slot with `outbox wal create` (relay.CreateWAL) or by starting
	// the relay, and let its creation finish.
	ErrNoSlot = errors.New("outbox: log-only mode needs the relay's replication slot, and the database has no pgoutput slot ready (none, or one still being created)")

	// ErrSchemaMissing: the outbox table was never migrated (relay start).
	ErrSchemaMissing = dialect.ErrSchemaMissing
	// ErrSchemaOutdated: the table is at an older schema version than this
	// build needs; run Migrate.
	ErrSchemaOutdated = dialect.ErrSchemaOutdated
	// ErrSchemaTooNew: the table was migrated by a newer build.
	ErrSchemaTooNew = dialect.ErrSchemaTooNew
	// ErrUnsupportedServer: the server is older than PostgreSQL 12, MySQL
	// 8.0, MariaDB 10.6 or SQLite 3.42.
	ErrUnsupportedServer = dialect.ErrUnsupportedServer
)

// Config binds one registered driver name (or one wrapped connector) to one
// outbox table.
type Config struct {
	// Dialect of the wrapped driver's database. Required.
	Dialect Dialect
	// Table is the outbox table, "name" or "schema.name" (letters, digits,
	// underscores; name at most 40 bytes). Default DefaultTable.
	Table string
	// Partitions is the number of relay partitions each row's aggregate is
	// hashed onto (partition.Of), stored on the row at write time. The
	// count itself is stored in the database (<table>_meta): Migrate
	// writes it on a fresh install (this value, or partition.DefaultCount
	// if 0; an existing install keeps the size of its lease table), the
	// commit hook and relays read it from there, and only
	// relay.Repartition changes it. Leave it 0 to use the stored count;
	// set it (1..partition.MaxCount) to assert it: every read of the stored
	// count through this Outbox (Migrate, Check, PartitionCount, the first
	// commit, a relay built from it) then fails with ErrPartitionMismatch
	// if the two differ, instead of writing rows no relay owns.
	Partitions int
	// Limits bound what one transaction may emit (see emit.Limits for the
	// defaults). Outbox.SetLimits changes them after Register, once the
	// broker connection says what it accepts.
	Limits emit.Limits
	// Capture, if set, adds headers to every event emitted into a
	// transaction of this Outbox: Emit calls it with its ctx and the
	// event's own headers, and adds what it returns unless the application
	// set a header of the same name (see emit.Capture for the shape and
	// the rules). Captured bytes count toward Limits. Default nil: nothing
	// is captured and Emit pays one nil check. Package
	// github.com/sqloutbox/outbox/otel's Capture puts the OpenTelemetry
	// trace context and baggage of Emit's ctx here.
	Capture emit.Capture
	// DisableNotify turns off the PostgreSQL NOTIFY that wakes relays in
	// other processes (relay.ListenPostgres). On by default for Postgres:
	// after a COMMIT that wrote events returns, the wrapped connector's
	// notifier sends a NOTIFY on the table's channel (Outbox.Channel)
	// from one connection of its own, opened from
	// the same connector at the first such commit, outside the pool (so
	// not counted by SetMaxOpenConns), and closed by DB.Close. Commits
	// that return while a NOTIFY is in flight share the next one. The
	// writers' own transactions queue no NOTIFY, so they do not serialize
	// on PostgreSQL's notification lock (BENCHMARKS.md, "NOTIFY and commit
	// throughput"). Turn it off when every relay runs in the writing
	// process (they are woken by Wakeup) or no relay listens: no
	// notifier is started and no connection opened. LogOnly implies it:
	// its events are in no table, and the WAL source's relays are woken
	// by their stream.
	DisableNotify bool
	// LogOnly (PostgreSQL 14 or later, wal_level = logical) writes a
	// transaction's events as one transactional logical decoding message
	// (pg_logical_emit_message(true, "outbox:<Table>", ...), format in
	// internal/logmsg) instead of rows: the commit hook writes one WAL
	// record and no table, index or pending-set row, and no id is drawn.
	// The message and COMMIT go in one query, so in one round trip (the
	// wrapped driver's ExecerContext without arguments: lib/pq, pgx; a
	// driver without it, or a table name with a backslash, gets the
	// message and COMMIT as two statements). Only a relay with Source SourceWAL reading a slot of this database
	// sees the events (the table holds only what the relay could not
	// publish at once: a retry, a dead letter, an event of a partition
	// another relay holds). A message is kept by the server only for the
	// replication slots that exist when it is written, so a commit with
	// events fails with ErrWriteEvents (wrapping ErrNoSlot) while no
	// pgoutput slot of the database exists (create it with `outbox wal
	// create` or by starting the relay); it is checked at the first such
	// commit and then trusted. The events are lost if the slot is dropped
	// or invalidated (max_slot_wal_keep_size) before the relay confirmed
	// them: the relay reports that window and refuses readiness until an
	// operator acknowledges it (docs/wal.md, "Log-only mode"). The same
	// Emit API and limits; ErrDuplicateID is not detected (no row holds
	// the id). No wake-up NOTIFY is sent (DisableNotify). Default
	// false: rows, which every relay source reads.
	// New refuses it on MySQL/MariaDB and SQLite (ErrInvalidConfig).
	LogOnly bool
	// Logger receives the warnings of the PostgreSQL wake-up notifier (a
	// NOTIFY that failed and is being retried; never the DSN). Default
	// slog.Default().
	Logger *slog.Logger
	// DisableStatementCache turns off the per-connection cache of prepared
	// event INSERTs (StatementCacheSize statements per connection). With
	// the cache, a commit that emits events executes one statement
	// prepared once per connection instead of sending and parsing the
	// INSERT each time: one round trip instead of two on
	// go-sql-driver/mysql without interpolateParams (prepare and execute;
	// the close is not answered) and on lib/pq without binary_parameters
	// (parse, then bind and execute), and no SQL parse on SQLite. The cache
	// does not apply to pgx's *stdlib.Conn when it reaches the wrapper
	// directly (pgx caches statements itself, in the mode its config sets;
	// behind another wrapper it cannot be recognised) nor, on
	// MySQL/MariaDB, to an unqualified Table (see the package doc: a
	// prepared statement there keeps the database current when it was
	// prepared; write "db.outbox_message" to get the cache). Turn it off
	// behind a pooler that does not keep prepared statements across
	// transactions (PgBouncer in transaction mode before 1.21, or without
	// max_prepared_statements), or if the application runs DISCARD ALL or
	// DEALLOCATE ALL on pooled connections: the commit after such a
	// statement fails with ErrWriteEvents (rolled back, nothing committed)
	// and the next one prepares again.
	DisableStatementCache bool
	// AllowProcedureCalls lets a MySQL/MariaDB CALL run inside a
	// transaction bound to an emit scope. A MySQL stored procedure may run
	// COMMIT, ROLLBACK or ROLLBACK TO SAVEPOINT of the caller's savepoint,
	// which the wrapper cannot see, so by default CALL there returns
	// ErrUncertainStatement. Set it if your procedures run no transaction
	// control or savepoint statements. (PostgreSQL procedures cannot end a
	// transaction begun by the client nor touch its savepoints, and SQLite
	// has none: CALL is never refused there.)
	AllowProcedureCalls bool
}

func (c Config) withDefaults() Config {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	c.Limits = c.Limits.WithDefaults()
	return c
}

// Outbox is one outbox configuration: the wrapper for drivers and
// connectors, the schema for its table, and the post-commit wake-up signal
// for relays. Create it with New or Register; it is safe for concurrent use.
type Outbox struct {
	cfg     Config
	dialect *dialect.Dialect
	inserts insertCache

	serverChecked atomic.Bool // checkServer passed once
	slotChecked   atomic.Bool // LogOnly: a pgoutput slot of the database was seen

	mu   sync.Mutex
	subs []chan struct{}

	// partitions is the stored relay partition count once read (0 before);
	// see outbox.go.
	partitions atomic.Int64

	// limits is what transactions begun from now on may emit
	// (Config.Limits, then SetLimits).
	limits atomic.Pointer[emit.Limits]
}

// New validates cfg and returns an Outbox. It does not touch a database:
// an Outbox built from Dialect and Table alone is also how a process that
// only has a DSN (a standalone relay, the outbox command) describes the
// table to package relay and metrics. It returns an error wrapping
// ErrInvalidConfig for an unknown dialect, an invalid table name, a
// partition count outside 0..partition.MaxCount, invalid Limits, or
// LogOnly with another dialect than PostgreSQL.
func New(cfg Config) (*Outbox, error) {
	cfg = cfg.withDefaults()
	initial := cfg.Partitions
	if initial == 0 {
		initial = partition.DefaultCount
	}
	if err := partition.Validate(initial); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	d, err := dialect.NewPartitioned(dialect.Name(cfg.Dialect), cfg.Table, initial)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := cfg.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if cfg.LogOnly && cfg.Dialect != Postgres {
		return nil, fmt.Errorf("%w: LogOnly needs PostgreSQL (logical decoding messages), not %s", ErrInvalidConfig, cfg.Dialect)
	}
	o := &Outbox{cfg: cfg, dialect: d}
	o.limits.Store(&cfg.Limits)
	return o, nil
}

// SetLimits replaces the limits of what one transaction may emit
// (Config.Limits; zero fields take emit's defaults) for the transactions
// begun from now on; those already open keep the limits they began with.
// It lets an application register the driver at start-up and set the
// broker's record limit once its connection is up, e.g.
//
//	l := ob.Limits()
//	l.MaxRecordBytes = pub.MaxRecordBytes() // relay/kafka, relay/nats, ...
//	err := ob.SetLimits(l)
//
// It returns an error wrapping ErrInvalidConfig (and emit.ErrInvalidField)
// for invalid limits (see emit.Limits.Validate), leaving the current ones
// in force. Safe for concurrent use with transactions and Emit.
func (o *Outbox) SetLimits(l emit.Limits) error {
	if err := l.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	l = l.WithDefaults()
	o.limits.Store(&l)
	return nil
}

// Limits returns the limits transactions begun now get, defaults filled
// in (Config.Limits, or the last SetLimits).
func (o *Outbox) Limits() emit.Limits { return *o.limits.Load() }

var registerMu sync.Mutex

// Register creates an Outbox for cfg and registers drv, wrapped, with
// database/sql under name, for sql.Open(name, dsn). It returns an error
// wrapping ErrInvalidConfig, or ErrDriverRegistered if name is taken.
func Register(name string, drv sqldriver.Driver, cfg Config) (*Outbox, error) {
	o, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := o.Register(name, drv); err != nil {
		return nil, err
	}
	return o, nil
}

// Register registers drv, wrapped by o, with database/sql under name. One
// name is bound to one Outbox; to write to two databases, register two
// names. It returns ErrDriverRegistered (wrapped) if name is taken, and
// ErrInvalidConfig for an empty name or a nil driver; it never panics.
func (o *Outbox) Register(name string, drv sqldriver.Driver) (err error) {
	if name == "" || drv == nil {
		return fmt.Errorf("%w: Register needs a name and a driver", ErrInvalidConfig)
	}
	registerMu.Lock()
	defer registerMu.Unlock()
	for _, n := range sql.Drivers() {
		if n == name {
			return fmt.Errorf("%w: %q", ErrDriverRegistered, name)
		}
	}
	defer func() {
		if r := recover(); r != nil { // another package registered it concurrently
			err = fmt.Errorf("%w: %q: %v", ErrDriverRegistered, name, r)
		}
	}()
	sql.Register(name, o.Wrap(drv))
	return nil
}

// Wrap returns drv wrapped by o, for callers that register it themselves
// or open it through sql.OpenDB(connector) with its DriverContext. The
// wrapped driver always implements driver.DriverContext: with a driver
// that has OpenConnector its connector is wrapped, otherwise connections
// are opened with drv.Open(name), as database/sql does.
func (o *Outbox) Wrap(drv sqldriver.Driver) sqldriver.Driver {
	return &wrappedDriver{parent: drv, o: o}
}

// WrapConnector returns c wrapped by o, for sql.OpenDB: for example
// sql.OpenDB(ob.WrapConnector(stdlib.GetConnector(pgxConfig))) or
// sql.OpenDB(ob.WrapConnector(mysqlConnector)). On PostgreSQL (unless
// Config.DisableNotify) each wrapped connector has its own wake-up
// notifier, holding one connection opened with c.Connect (see
// Config.DisableNotify). The wrapped connector's Close stops the notifier
// and closes c if c is an io.Closer.
func (o *Outbox) WrapConnector(c sqldriver.Connector) sqldriver.Connector {
	return o.wrapConnector(c, nil)
}

// Config returns o's configuration with defaults filled in (Partitions
// stays 0 unless set: the stored count is read with PartitionCount;
// Limits is the current one, see SetLimits).
func (o *Outbox) Config() Config {
	c := o.cfg
	c.Limits = o.Limits()
	return c
}

// Channel returns the PostgreSQL NOTIFY channel of o's table, on which
// the driver wakes relays in other processes after commits (see
// DisableNotify) and relay.ListenPostgres listens: "<name>_wakeup" for a
// table named without a schema, "<schema>.<name>_wakeup" for a
// schema-qualified one (a name longer than PostgreSQL's 63 bytes is cut
// to 46 and ends in a 16-hex-digit hash), case kept: LISTEN must quote it
// (LISTEN "s.outbox_message_wakeup"). Empty for other dialects.
func (o *Outbox) Channel() string {
	if o.cfg.Dialect != Postgres {
		return ""
	}
	return o.dialect.Channel()
}

// Wakeup subscribes to the post-commit signal: after every COMMIT that
// wrote outbox rows has returned success, each subscriber's channel
// receives a value if it has none waiting (signals coalesce; capacity 1).
// A relay in the same process passes it as relay.Config.Wakeup. The
// signal never fires before COMMIT succeeded.
func (o *Outbox) Wakeup() <-chan struct{} {
	ch := make(chan struct{}, 1)
	o.mu.Lock()
	o.subs = append(o.subs, ch)
	o.mu.Unlock()
	return ch
}

func (o *Outbox) notify() {
	o.mu.Lock()
	for _, ch := range o.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	o.mu.Unlock()
}

// Migrate creates or upgrades o's table on db (see func Migrate for the
// locking), then reads the stored relay partition count as PartitionCount
// does. db may be opened with or without the wrapper. A schema-qualified
// table's schema must already exist. Besides the database error it
// returns ErrSchemaTooNew or, when Config.Partitions is set and the table
// already stores another count, ErrPartitionMismatch (wrapped; the schema
// is migrated all the same). When it created or upgraded the schema it
// logs so at INFO on Config.Logger, naming the database, the table and the
// versions.
func (o *Outbox) Migrate(ctx context.Context, db *sql.DB) error {
	before, verr := o.dialect.Version(ctx, db)
	if err := o.dialect.Migrate(ctx, db); err != nil {
		return err
	}
	if _, err := o.PartitionCount(ctx, db); err != nil {
		return err
	}
	after, aerr := o.dialect.Version(ctx, db)
	if verr == nil && aerr == nil && after != before {
		// Say where: a DSN without a database name writes into the
		// driver's default one, and nothing else would tell.
		what := "outbox schema upgraded"
		if before == 0 {
			what = "outbox schema created"
		}
		log := o.cfg.Logger
		if log == nil {
			log = slog.Default()
		}
		log.Info(what, "database", o.databaseName(ctx, db), "table", o.cfg.Table, "dialect", string(o.cfg.Dialect), "from_version", before, "to_version", after)
	}
	return nil
}

// databaseName names the database db is connected to, for Migrate's log
// line: PostgreSQL's current_database(), MySQL's DATABASE(), SQLite's main
// file ("" in memory); "(unknown)" if the query fails.
func (o *Outbox) databaseName(ctx context.Context, db *sql.DB) string {
	q := map[Dialect]string{
		Postgres: "SELECT current_database()",
		MySQL:    "SELECT COALESCE(DATABASE(), '(none selected)')",
		SQLite:   "SELECT file FROM pragma_database_list WHERE name = 'main'",
	}[o.cfg.Dialect]
	var name string
	if q == "" || db.QueryRowContext(ctx, q).Scan(&name) != nil {
		return "(unknown)"
	}
	if name == "" && o.cfg.Dialect == SQLite {
		return "(in memory)"
	}
	return name
}

// DDL returns the schema as SQL statements for o's dialect and table, for
// teams that apply migrations with their own tool (goose, atlas, Flyway).
// The meta migration stores Config.Partitions (partition.DefaultCount if 0)
// when the lease table is empty.
func (o *Outbox) DDL() string { return o.dialect.DDL() }

// Migrate creates or upgrades the outbox table described by cfg on db, and
// logs at INFO (Config.Logger) which database and table it created or
// upgraded, from which version to which (nothing when it changed
// nothing). It is safe to run twice and from several processes at once: PostgreSQL takes
// a transaction-scoped advisory lock and applies DDL in that transaction;
// MySQL/MariaDB hold GET_LOCK on one connection and run idempotent
// statements (their DDL commits implicitly); SQLite runs under BEGIN
// IMMEDIATE. Applied versions are recorded in <table>_migrations. It
// returns ErrInvalidConfig for a bad cfg, or the database error, wrapped.
func Migrate(ctx context.Context, db *sql.DB, cfg Config) error {
	o, err := New(cfg)
	if err != nil {
		return err
	}
	return o.Migrate(ctx, db)
}

// DDL returns the schema SQL for cfg's dialect and table, or an error
// wrapping ErrInvalidConfig.
func DDL(cfg Config) (string, error) {
	o, err := New(cfg)
	if err != nil {
		return "", err
	}
	return o.DDL(), nil
}

// SchemaVersion returns the newest schema version applied to cfg's table
// on db (0 if never migrated) and the newest this build knows. It returns
// ErrInvalidConfig for a bad cfg, or the database error, wrapped.
func SchemaVersion(ctx context.Context, db *sql.DB, cfg Config) (current, latest int, err error) {
	o, err := New(cfg)
	if err != nil {
		return 0, 0, err
	}
	v, err := o.dialect.Version(ctx, db)
	if err != nil {
		return 0, 0, fmt.Errorf("outbox: reading schema version of %s: %w", o.cfg.Table, err)
	}
	return v, o.dialect.LatestVersion(), nil
}

// RequiredSchemaVersion returns the oldest schema version this build's
// writers and relays run on for dialect d: the newest migration they
// need. Versions above it, up to LatestSchemaVersion, add what only other
// tools read (schema version 8 on PostgreSQL, 7 on SQLite: the dead
// letters' index of the admin page); Migrate applies them too. It returns
// ErrInvalidConfig (wrapped) for an unknown dialect.
func RequiredSchemaVersion(d Dialect) (int, error) {
	o, err := New(Config{Dialect: d})
	if err != nil {
		return 0, err
	}
	return o.dialect.RequiredVersion(), nil
}

// LatestSchemaVersion returns the newest schema version this build knows
// for dialect d, or ErrInvalidConfig (wrapped) for an unknown dialect.
func LatestSchemaVersion(d Dialect) (int, error) {
	o, err := New(Config{Dialect: d})
	if err != nil {
		return 0, err
	}
	return o.dialect.LatestVersion(), nil
}
