// Package driver wraps a database/sql driver so that the events a
// transaction emits are written to the outbox table on the same connection
// just before COMMIT, and relays are woken just after it.
//
// # Setup
//
//	ob, err := driver.Register("outbox-postgres", &pq.Driver{}, driver.Config{Dialect: driver.Postgres})
//	db, err := sql.Open("outbox-postgres", dsn)
//	err = ob.Migrate(ctx, db)
//
// or, with a connector (pgx, go-sql-driver/mysql):
//
//	ob, err := driver.New(driver.Config{Dialect: driver.Postgres})
//	db := sql.OpenDB(ob.WrapConnector(stdlib.GetConnector(*pgxConfig)))
//
// One registered name (or one wrapped connector) is bound to one outbox
// table; two databases need two names. The wrapper works with lib/pq, pgx's
// stdlib driver, go-sql-driver/mysql and modernc.org/sqlite.
//
// # The commit hook
//
// The wrapper is this package's own (see "Why not sqlmw" below). BeginTx
// with a context carrying an emit scope (outbox.NewContext) binds a buffer
// to the scope and to the connection; outbox.Emit validates and appends to
// it. At Commit, with database/sql holding the connection's lock for the
// whole call, the hook:
//
//  1. takes the buffered events (later Emits get ErrNoTransaction);
//  2. if there are none, just COMMITs: no extra statement, no signal;
//  3. INSERTs them with multi-row statements on the transaction's own
//     driver connection: one statement for a typical transaction, more
//     only past the dialect's bind-parameter limit (65,535 on PostgreSQL
//     and MySQL, 32,766 on SQLite) or 4 MiB of payload per statement. The
//     statement comes from the connection's statement cache (below); where
//     the cache is off or does not apply, it goes through the driver's
//     ExecContext, and go-sql-driver/mysql without interpolateParams
//     answers that with driver.ErrSkip, so the hook then prepares,
//     executes and closes;
//  4. on an INSERT error, rolls back and returns ErrWriteEvents: business
//     changes never commit without their events;
//  5. COMMITs; only once COMMIT returned success does it signal Wakeup
//     subscribers. If COMMIT fails the rows were never committed; if its
//     outcome is unknown (connection lost after COMMIT was sent) the rows
//     decide: the relay publishes exactly what is in the table;
//  6. on PostgreSQL (unless Config.DisableNotify), signals the wrapped
//     connector's notifier, which sends a NOTIFY on the table's channel
//     for relay.ListenPostgres from a connection of its own, coalescing
//     commits that return while one is in flight (see below).
//
// In the log-only mode (Config.LogOnly) steps 3 to 5 are one query: the
// events are one logical decoding message, sent with COMMIT in one
// simple-protocol string (SELECT pg_logical_emit_message(...); COMMIT),
// so one round trip; after an error one more query tells a failed
// message (rolled back, ErrWriteEvents) from a failed COMMIT. A driver
// that declines a statement without arguments (driver.ErrSkip) gets the
// message and COMMIT as two statements.
//
// Rollback, explicit or by database/sql when the BeginTx context ends,
// discards the buffer. Read-only transactions are not bound. At the first
// commit that writes events, the hook checks the server version once per
// Outbox and refuses one older than supported (ErrUnsupportedServer), as
// Migrate and the relay do. A unique violation of the INSERT is a reused
// Event.ID: it is returned as a *DuplicateIDError (matching
// outbox.ErrDuplicateID and ErrWriteEvents) naming the ID, found in the
// driver's message or, where that names only the column (SQLite), by
// asking the table after the rollback.
//
// # Savepoints and transaction control
//
// ORMs nest transactions with savepoints (GORM's nested Transaction, bun's
// nested RunInTx, sqlx by hand), sent as ordinary statements. The
// connection wrapper classifies every statement run inside a bound
// transaction, on the Exec and Query paths and prepared, with a small lexer
// that knows each dialect's quotes and comments (classify.go), and keeps
// the transaction's savepoint stack on the connection (the statement's ctx
// need not carry the scope):
//
//   - SAVEPOINT x records the buffer's position; ROLLBACK [WORK|TRANSACTION]
//     TO [SAVEPOINT] x drops the events emitted since x and every savepoint
//     set after x, and keeps x open; RELEASE [SAVEPOINT] x keeps the events
//     and closes x and what came after it. A reused name shadows the older
//     savepoint on PostgreSQL and SQLite and replaces it on MySQL/MariaDB,
//     as the servers do. Names fold as the server folds them: PostgreSQL
//     lower-cases unquoted names and keeps quoted ones; MySQL and SQLite
//     compare case-insensitively. A command is applied only once the
//     database executed it successfully; sent as a query it is executed
//     (it returns no rows) so that its outcome is known.
//   - Transaction control sent as a statement (COMMIT, END, ROLLBACK,
//     BEGIN, START TRANSACTION, ABORT, PREPARE TRANSACTION, XA, SET
//     autocommit, and on MySQL/MariaDB the statements that commit
//     implicitly: DDL other than CREATE/DROP TEMPORARY TABLE, LOCK and
//     UNLOCK TABLES, GRANT, ANALYZE TABLE, ...) would lose the buffer or
//     write it outside the transaction: it is refused with
//     ErrTransactionControl, not sent, and the transaction stays usable.
//   - What the wrapper cannot classify with certainty is refused with
//     ErrUncertainStatement, never guessed in the direction of a ghost:
//     several statements in one string of which one is not plain, a MySQL
//     CALL (a stored procedure may COMMIT or roll back to the caller's
//     savepoint; Config.AllowProcedureCalls lets it run), MySQL's /*! */
//     executable comments, an unterminated quote or comment, a string whose
//     extent depends on backslash settings (NO_BACKSLASH_ESCAPES,
//     standard_conforming_strings), and ROLLBACK TO or RELEASE of a
//     savepoint the wrapper never saw set.
//
// Statements outside bound transactions are not classified. A statement
// prepared outside one is classified once, at Prepare, since database/sql
// may run it inside one on the same connection; plain statements are the
// driver's own.
//
// Classifying is cheap for the statements that matter least: one pass over
// the text proves most statements plain (their first word is no command
// the wrapper knows, and no semicolon, unclosed quote or comment, or MySQL
// executable comment follows; anything else is lexed), and each connection
// remembers the last 8 statements it found plain, so a repeated statement
// costs a string comparison. A bound transaction that emits nothing costs
// about a thousand instructions more than the driver's own (BENCHMARKS.md,
// "Issue 34"), less than github.com/ngrok/sqlmw with a no-op interceptor.
//
// # The wake-up NOTIFY (PostgreSQL)
//
// Relays in other processes learn of commits through LISTEN/NOTIFY
// (relay.ListenPostgres). The writers' transactions do not queue the
// NOTIFY: PostgreSQL serializes the commits of every transaction that
// queued one on a database-wide lock held through its WAL flush, which with
// 64 writers and synchronous_commit on cut commit throughput by two thirds
// (BENCHMARKS.md, "NOTIFY and commit throughput"). Instead, after COMMIT
// returns, the hook signals a notifier owned by the wrapped connector (one
// per *sql.DB): one goroutine and one connection, opened from the same
// connector at the first commit that wrote events, outside the pool's
// limits, closed by DB.Close after it sent the NOTIFY still owed. It sends
// a pg_notify on the table's channel (Outbox.Channel) in an autocommit statement of its
// own (synchronous_commit off for that statement only); every commit that
// returns while one is in flight is covered by exactly one more. A failed NOTIFY is retried at once on a new connection, then with
// backoff (100 ms doubling to 10 s), logged to Config.Logger; relays'
// polls cover the gap. It also signals after a COMMIT that returned an
// error, whose outcome may be unknown: a spurious wake-up costs one empty
// claim. Connections opened through the driver's Open (not OpenConnector;
// database/sql never does that) share one notifier per DSN for the
// process's lifetime.
//
// # The statement cache
//
// Each connection the wrapper opens keeps the hook's INSERTs prepared,
// keyed by row count, at most
// StatementCacheSize of them, least recently used out; INSERTs of more than
// 256 rows are not kept. Measured with BenchmarkCommit (BENCHMARKS.md), it
// saves the SQL parse of the multi-row INSERT on SQLite and a round trip on
// go-sql-driver/mysql without interpolateParams (prepare, execute, close
// become execute) and on lib/pq without binary_parameters (parse, then bind
// and execute, become bind and execute).
//
// It lives in the connection wrapper. On SQLite it finalizes the statements before closing the
// connection. On the servers it leaves them to the session's end instead:
// lib/pq waits for the server's answer to a statement Close without a
// deadline, so closing them first made closing a connection to a silent
// server hang (TestStatementCacheCloseDoesNotWaitOnServer). A statement
// whose execution fails is dropped and prepared again by the next commit.
// A statement evicted from a full cache is closed on every driver (the
// connection has just prepared its successor, so it is alive; left open,
// evictions would pile up toward MySQL's max_prepared_stmt_count): one
// more round trip on lib/pq and pgx, none answered on MySQL.
//
// It does not apply:
//
//   - to pgx's *stdlib.Conn, recognised by its type when it reaches the
//     wrapper directly: pgx caches statements itself in its default mode
//     (BenchmarkCommit: emit10 the same with and without ours), and a user
//     who set another QueryExecMode (simple protocol for PgBouncer) chose
//     not to prepare. Behind another wrapper (otelsql, a counting
//     connector) pgx cannot be recognised and the cache applies: set
//     DisableStatementCache if you chose pgx's simple protocol;
//   - on MySQL/MariaDB to an unqualified Config.Table: a prepared statement
//     there keeps the database that was current when it was prepared, so
//     after USE on a pooled connection the cached INSERT would write events
//     into the previous database while the transaction's own statements
//     follow USE (TestStatementCacheFollowsCurrentSchema). Qualify the
//     table ("app.outbox_message") to get the cache. PostgreSQL re-resolves
//     a prepared statement's names when search_path changes;
//   - when Config.DisableStatementCache is set, which it should be behind
//     PgBouncer in transaction mode without prepared-statement support, or
//     when the application runs DISCARD ALL / DEALLOCATE ALL on pooled
//     connections (after which the next commit on that connection fails
//     with ErrWriteEvents, as it does with pgx's cache);
//
// # What reaches the application
//
// Only connections and bound transactions are wrapped. Statements, rows
// and results are the driver's own, so driver-specific interfaces still
// reach the application (go-sql-driver/mysql's mysql.Result with
// AllRowsAffected and AllLastInsertIds, its multi-result rows). The one
// exception is the prepared statement of a savepoint or transaction-control
// command, which the wrapper wraps to apply it to a bound transaction
// (above); outside one it runs as the driver's statement, and its arguments
// are checked by the driver's statement or, where that has no checker, by
// the driver's connection, as without the wrapper. Inside (*sql.Conn).Raw
// the connection is the wrapper's: Unwrap returns the driver's (pgx's
// *stdlib.Conn for CopyFrom). The wrapper forwards every optional
// interface database/sql looks for on a connection, answering as
// database/sql would where the driver lacks one.
//
// TestDriverSuitesPassThrough checks this against the drivers' own test
// suites: it runs lib/pq's and go-sql-driver/mysql's (from the module
// cache, pointed at the wrapper by a generated overlay) once on the driver
// and once through the wrapper, without an emit scope, and requires every
// test that passes on the driver to pass through the wrapper (about 750
// tests and subtests of lib/pq, with and without binary_parameters, and
// 400 of mysql, including its TestExecMultipleResults). The only exceptions are mysql's TestPing and
// TestQueryMultipleResults, which assert the driver's unexported
// connection type inside Raw; with Unwrap applied there they pass too.
//
// # Why not sqlmw
//
// The design began on github.com/ngrok/sqlmw. It wraps every result in
// its own type (only LastInsertId and RowsAffected survive), hands its
// unexported connection type to Raw with no way to unwrap it, cannot wrap
// a driver.Connector, has no hook for a connection's Close, and its
// fallbacks panicked on drivers without ExecerContext; it has had no
// release since 2022, and no interceptor method could change any of that.
// Transparency is what this package promises, so the wrapper is ours: four
// small types (wrap.go) and the statement classifier (classify.go).
//
// # The relay partition count
//
// Each row's relay partition is partition.Of(aggregate type, aggregate ID,
// N), and N is stored in the table (<table>_meta, schema version 5 on
// PostgreSQL and SQLite, 4 on MySQL/MariaDB): Migrate writes it once (an
// existing install takes its lease table's size, a new one
// Config.Partitions or 32), relays and this package read it, and only
// relay.Repartition changes it. The commit hook reads it on the first
// commit that emitted events, on that transaction's own connection, and
// caches it in the Outbox: later commits cost no extra statement. Migrate,
// Check and PartitionCount read it too (and refresh the cache). A
// Config.Partitions that disagrees with the stored count fails all of them
// with ErrPartitionMismatch (the commit with ErrWriteEvents as well,
// rolled back) rather than write rows into partitions no relay owns.
//
// # Schema
//
// The DDL per dialect ships inside the module (embedded SQL, versioned).
// Migrate applies it safely, concurrently and repeatedly; DDL prints it for
// goose, atlas or Flyway users. Payload bytes round-trip exactly: BYTEA,
// LONGBLOB or BLOB, never jsonb or MySQL JSON (both reorder keys).
// Timestamps come from the database clock: TIMESTAMPTZ via clock_timestamp()
// on PostgreSQL, DATETIME(6) via UTC_TIMESTAMP(6) on MySQL/MariaDB (both
// microseconds), integer milliseconds on SQLite.
package driver
