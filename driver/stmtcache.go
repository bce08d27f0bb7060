package driver

import (
	"context"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
)

// StatementCacheSize is how many prepared event INSERTs one connection
// keeps (least recently used first out). A statement is keyed by its row
// count (and, on PostgreSQL, whether it carries the NOTIFY), so a workload
// whose transactions emit 1 to 8 events uses at most 16; INSERTs of more
// than 256 rows are never cached. An evicted statement is closed (one round
// trip on lib/pq and pgx; go-sql-driver/mysql's close is not answered).
const StatementCacheSize = 16

// cacheable reports whether connections of o get the statement cache:
//
//   - not with Config.DisableStatementCache;
//   - not on pgx's stdlib connections: pgx keeps its own statement cache
//     (its default QueryExecModeCacheStatement; BenchmarkCommit measured
//     emit10 the same with and without ours), and a user who chose another
//     mode, such as simple protocol for PgBouncer, chose not to prepare;
//   - not on MySQL/MariaDB with an unqualified Config.Table: a MySQL
//     prepared statement keeps the database that was current when it was
//     prepared, so after USE on a pooled connection the cached INSERT
//     would write events into the previous database's outbox while the
//     transaction's own statements follow USE. PostgreSQL re-resolves a
//     prepared statement's names when search_path changes, and SQLite
//     re-prepares on a schema change.
func (o *Outbox) cacheable(conn sqldriver.Conn) bool {
	switch {
	case o.cfg.DisableStatementCache:
		return false
	case o.cfg.Dialect == MySQL && !strings.Contains(o.cfg.Table, "."):
		return false
	}
	t := reflect.TypeOf(conn)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return !strings.HasPrefix(t.PkgPath(), "github.com/jackc/pgx/")
}

// cachingConn is the driver connection the wrapper hands to sqlmw when the
// statement cache is on (see cacheable). It keeps the commit hook's
// prepared INSERTs for the connection's lifetime. sqlmw has no hook for a
// connection's Close; this type is that hook, installed through sqlmw's
// ConnectorConnect interception.
//
// On SQLite, Close finalizes the statements before closing the connection
// (sqlite3_close_v2 would otherwise keep the database open as a zombie).
// On the servers it drops them unclosed: the server frees a session's
// statements when the session ends, and closing them first would wait on
// the network, without a deadline on lib/pq, for a connection that is
// usually being closed because it broke. For the same reason a statement
// whose execution failed is forgotten, not closed, on the servers (on MySQL
// it counts toward max_prepared_stmt_count until its connection closes).
//
// database/sql type-asserts a connection for optional interfaces, so
// cachingConn implements all of them and, where the wrapped connection
// lacks one, answers as database/sql would without it (driver.ErrSkip, nil,
// true, or the fallback to Begin/Prepare database/sql itself uses).
type cachingConn struct {
	parent   sqldriver.Conn
	finalize bool // close statements on Close and on failure (SQLite)

	mu    sync.Mutex
	stmts []cachedStmt // most recently used last
}

type cachedStmt struct {
	key  int
	stmt sqldriver.Stmt
}

// cachingTx marks a transaction begun on a cachingConn, so the commit hook
// can find the connection's cache (sqlmw hands the interceptor its own
// wrapper of the connection, which cannot be unwrapped).
type cachingTx struct {
	sqldriver.Tx
	conn *cachingConn
}

var (
	_ sqldriver.Conn               = (*cachingConn)(nil)
	_ sqldriver.ConnBeginTx        = (*cachingConn)(nil)
	_ sqldriver.ConnPrepareContext = (*cachingConn)(nil)
	_ sqldriver.ExecerContext      = (*cachingConn)(nil)
	_ sqldriver.QueryerContext     = (*cachingConn)(nil)
	_ sqldriver.Pinger             = (*cachingConn)(nil)
	_ sqldriver.SessionResetter    = (*cachingConn)(nil)
	_ sqldriver.Validator          = (*cachingConn)(nil)
	_ sqldriver.NamedValueChecker  = (*cachingConn)(nil)
)

// exec runs query (the INSERT with cache key key) with args on c, through
// the connection's prepared statement for key, preparing it on first use.
// A statement whose Exec fails (or panics) is dropped, closed on SQLite
// only (see cachingConn), so the next commit prepares it again (after
// DEALLOCATE ALL or DISCARD ALL, for instance).
func (c *cachingConn) exec(ctx context.Context, key int, query string, args []sqldriver.NamedValue) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var stmt sqldriver.Stmt
	err := recovered(func() (err error) {
		stmt, err = c.stmtLocked(ctx, key, query)
		return err
	})
	if err != nil {
		return err
	}
	if err := recovered(func() error { return stmtExec(ctx, stmt, args) }); err != nil {
		c.dropLocked(key)
		return err
	}
	return nil
}

// recovered runs f, turning a panic into an error: a driver may panic on
// an interface it only half implements.
func recovered(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("driver panicked: %v", r)
		}
	}()
	return f()
}

// stmtLocked returns the cached statement for key, moved to the
// most-recently-used end, or prepares and caches it, closing the least
// recently used statement when the cache is full.
func (c *cachingConn) stmtLocked(ctx context.Context, key int, query string) (sqldriver.Stmt, error) {
	for i := len(c.stmts) - 1; i >= 0; i-- {
		if e := c.stmts[i]; e.key == key {
			copy(c.stmts[i:], c.stmts[i+1:])
			c.stmts[len(c.stmts)-1] = e
			return e.stmt, nil
		}
	}
	stmt, err := c.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if len(c.stmts) == StatementCacheSize {
		// Close errors of an evicted statement do not concern this
		// transaction; a broken connection fails the Exec that follows.
		_ = c.stmts[0].stmt.Close()
		c.stmts = append(c.stmts[:0], c.stmts[1:]...)
	}
	c.stmts = append(c.stmts, cachedStmt{key: key, stmt: stmt})
	return stmt, nil
}

func (c *cachingConn) dropLocked(key int) {
	for i, e := range c.stmts {
		if e.key == key {
			if c.finalize {
				_ = recovered(e.stmt.Close) // the Exec error is the one to report
			}
			c.stmts = append(c.stmts[:i], c.stmts[i+1:]...)
			return
		}
	}
}

// stmtExec executes a prepared statement with StmtExecContext, or with the
// deprecated Exec for drivers that lack it.
func stmtExec(ctx context.Context, stmt sqldriver.Stmt, args []sqldriver.NamedValue) error {
	if se, ok := stmt.(sqldriver.StmtExecContext); ok {
		_, err := se.ExecContext(ctx, args)
		return err
	}
	vals, err := namedToValues(args)
	if err != nil {
		return err
	}
	//lint:ignore SA1019 fallback for drivers that lack StmtExecContext
	_, err = stmt.Exec(vals)
	return err
}

// Close closes the cached statements on SQLite (see cachingConn), then
// the connection. It returns the connection's Close error; a statement's
// is dropped, as database/sql drops those of the statements it closes
// before a connection.
func (c *cachingConn) Close() error {
	c.mu.Lock()
	if c.finalize {
		for _, e := range c.stmts {
			_ = recovered(e.stmt.Close)
		}
	}
	c.stmts = nil
	c.mu.Unlock()
	return c.parent.Close()
}

func (c *cachingConn) Prepare(query string) (sqldriver.Stmt, error) {
	return c.parent.Prepare(query)
}

func (c *cachingConn) PrepareContext(ctx context.Context, query string) (sqldriver.Stmt, error) {
	if pc, ok := c.parent.(sqldriver.ConnPrepareContext); ok {
		return pc.PrepareContext(ctx, query)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return c.parent.Prepare(query)
}

func (c *cachingConn) Begin() (sqldriver.Tx, error) {
	//lint:ignore SA1019 forwarded for drivers that only have Begin
	return c.parent.Begin()
}

// Errors of the Begin fallback, worded as database/sql words its own.
var (
	errNoIsolation = errors.New("sql: driver does not support non-default isolation level")
	errNoReadOnly  = errors.New("sql: driver does not support read-only transactions")
)

// BeginTx begins on the wrapped connection and marks the transaction as
// this connection's, for the commit hook. Without ConnBeginTx it falls back
// to Begin exactly where database/sql would.
func (c *cachingConn) BeginTx(ctx context.Context, opts sqldriver.TxOptions) (sqldriver.Tx, error) {
	var tx sqldriver.Tx
	var err error
	if bt, ok := c.parent.(sqldriver.ConnBeginTx); ok {
		tx, err = bt.BeginTx(ctx, opts)
	} else {
		switch {
		case opts.Isolation != 0:
			return nil, errNoIsolation
		case opts.ReadOnly:
			return nil, errNoReadOnly
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		//lint:ignore SA1019 fallback for drivers that lack ConnBeginTx
		tx, err = c.parent.Begin()
	}
	if err != nil {
		return nil, err
	}
	return &cachingTx{Tx: tx, conn: c}, nil
}

func (c *cachingConn) ExecContext(ctx context.Context, query string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	if ex, ok := c.parent.(sqldriver.ExecerContext); ok {
		return ex.ExecContext(ctx, query, args)
	}
	//lint:ignore SA1019 fallback for drivers that lack ExecerContext
	if ex, ok := c.parent.(sqldriver.Execer); ok {
		vals, err := namedToValues(args)
		if err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return ex.Exec(query, vals)
	}
	return nil, sqldriver.ErrSkip
}

func (c *cachingConn) QueryContext(ctx context.Context, query string, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	if q, ok := c.parent.(sqldriver.QueryerContext); ok {
		return q.QueryContext(ctx, query, args)
	}
	//lint:ignore SA1019 fallback for drivers that lack QueryerContext
	if q, ok := c.parent.(sqldriver.Queryer); ok {
		vals, err := namedToValues(args)
		if err != nil {
			return nil, err
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		return q.Query(query, vals)
	}
	return nil, sqldriver.ErrSkip
}

func (c *cachingConn) Exec(query string, args []sqldriver.Value) (sqldriver.Result, error) {
	//lint:ignore SA1019 forwarded for drivers that only have it
	if ex, ok := c.parent.(sqldriver.Execer); ok {
		return ex.Exec(query, args)
	}
	return nil, sqldriver.ErrSkip
}

func (c *cachingConn) Query(query string, args []sqldriver.Value) (sqldriver.Rows, error) {
	//lint:ignore SA1019 forwarded for drivers that only have it
	if q, ok := c.parent.(sqldriver.Queryer); ok {
		return q.Query(query, args)
	}
	return nil, sqldriver.ErrSkip
}

func (c *cachingConn) Ping(ctx context.Context) error {
	if p, ok := c.parent.(sqldriver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *cachingConn) ResetSession(ctx context.Context) error {
	if r, ok := c.parent.(sqldriver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *cachingConn) IsValid() bool {
	if v, ok := c.parent.(sqldriver.Validator); ok {
		return v.IsValid()
	}
	return true
}

// CheckNamedValue forwards to the wrapped connection; without one,
// driver.ErrSkip makes database/sql apply its default conversion.
func (c *cachingConn) CheckNamedValue(nv *sqldriver.NamedValue) error {
	if ch, ok := c.parent.(sqldriver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return sqldriver.ErrSkip
}

// namedToValues converts arguments for the deprecated, positional-only
// driver interfaces, rejecting named ones as database/sql does.
func namedToValues(args []sqldriver.NamedValue) ([]sqldriver.Value, error) {
	vals := make([]sqldriver.Value, len(args))
	for k, a := range args {
		if a.Name != "" {
			return nil, errors.New("sql: driver does not support the use of Named Parameters")
		}
		vals[k] = a.Value
	}
	return vals, nil
}
