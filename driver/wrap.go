package driver

import (
	"context"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/sqloutbox/outbox/emit"
)

// The wrapper: a driver, a connector, a connection and a transaction type
// of our own, each as thin as database/sql allows. What database/sql gets
// from a driver besides these (statements, rows, results) is handed back
// exactly as the driver made it, so a driver's own optional interfaces
// (mysql.Result's AllRowsAffected, pgx's rows) still reach the application.
// The only statements the wrapper wraps are the few that change a
// transaction's savepoints or extent (see savepoint.go).

// wrappedDriver is what Wrap returns. It always offers DriverContext, so
// database/sql opens every connection through a wrappedConnector.
type wrappedDriver struct {
	parent sqldriver.Driver
	o      *Outbox

	// notifiers serve connections opened with Open, by DSN (name ->
	// *notifier): database/sql never calls Open on a DriverContext, but a
	// wrapper in front of ours may. They live as long as the process.
	notifiers sync.Map
}

var (
	_ sqldriver.Driver        = (*wrappedDriver)(nil)
	_ sqldriver.DriverContext = (*wrappedDriver)(nil)
)

// Open opens a connection on the wrapped driver and wraps it.
func (d *wrappedDriver) Open(name string) (sqldriver.Conn, error) {
	c, err := d.parent.Open(name)
	if err != nil {
		return nil, err
	}
	var n *notifier
	if v, ok := d.notifiers.Load(name); ok {
		n = v.(*notifier)
	} else if n = d.o.newNotifier(dsnConnector{name: name, drv: d.parent}.Connect); n != nil {
		v, _ := d.notifiers.LoadOrStore(name, n)
		n = v.(*notifier)
	}
	return d.o.wrapConn(c, n), nil
}

// OpenConnector returns a connector for name: the wrapped driver's own if
// it has one, otherwise one that calls its Open, as database/sql does.
func (d *wrappedDriver) OpenConnector(name string) (sqldriver.Connector, error) {
	if dc, ok := d.parent.(sqldriver.DriverContext); ok {
		c, err := dc.OpenConnector(name)
		if err != nil {
			return nil, err
		}
		return d.o.wrapConnector(c, d), nil
	}
	return d.o.wrapConnector(dsnConnector{name: name, drv: d.parent}, d), nil
}

// dsnConnector is database/sql's fallback connector for drivers without
// DriverContext.
type dsnConnector struct {
	name string
	drv  sqldriver.Driver
}

func (c dsnConnector) Connect(context.Context) (sqldriver.Conn, error) { return c.drv.Open(c.name) }
func (c dsnConnector) Driver() sqldriver.Driver                        { return c.drv }

// wrappedConnector is what WrapConnector returns.
type wrappedConnector struct {
	parent sqldriver.Connector
	o      *Outbox
	drv    sqldriver.Driver // what Driver reports; nil: the parent's, wrapped
	wake   *notifier        // the wake-up NOTIFY of its connections' commits; nil without
}

// wrapConnector wraps c; drv is what its Driver reports (nil: c's, wrapped).
func (o *Outbox) wrapConnector(c sqldriver.Connector, drv sqldriver.Driver) *wrappedConnector {
	return &wrappedConnector{parent: c, o: o, drv: drv, wake: o.newNotifier(c.Connect)}
}

var (
	_ sqldriver.Connector = (*wrappedConnector)(nil)
	_ io.Closer           = (*wrappedConnector)(nil)
)

// Connect opens a connection on the wrapped connector and wraps it.
func (c *wrappedConnector) Connect(ctx context.Context) (sqldriver.Conn, error) {
	conn, err := c.parent.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return c.o.wrapConn(conn, c.wake), nil
}

// Driver returns the wrapped driver (database/sql's DB.Driver).
func (c *wrappedConnector) Driver() sqldriver.Driver {
	if c.drv != nil {
		return c.drv
	}
	return &wrappedDriver{parent: c.parent.Driver(), o: c.o}
}

// Close stops the connector's wake-up notifier (after sending the NOTIFY
// still owed, waiting at most 1 s; see notifier.go), then closes the
// wrapped connector if it is an io.Closer. database/sql calls it from
// DB.Close.
func (c *wrappedConnector) Close() error {
	c.wake.close()
	if cl, ok := c.parent.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}

// conn is every connection the wrapper hands to database/sql. It binds
// transactions begun with an emit scope, tracks their savepoints, and
// keeps the commit hook's prepared INSERTs (cache, when it applies).
//
// database/sql type-asserts a connection for optional interfaces, so conn
// implements all of them and, where the wrapped connection lacks one,
// answers as database/sql would without it (driver.ErrSkip, nil, true, or
// the fallback to Begin/Prepare database/sql itself uses).
//
// database/sql uses a connection from one goroutine at a time (it holds
// the connection's lock for every call), so tx and plain need no lock.
type conn struct {
	parent sqldriver.Conn
	o      *Outbox
	cache  *stmtCache // nil when the statement cache does not apply
	tx     *tx        // the bound transaction open on this connection
	wake   *notifier  // signalled after commits with events; nil: none

	// The wrapped connection's optional interfaces, asserted once when it
	// is wrapped (a value's type never changes); nil where it lacks one.
	beginTx   sqldriver.ConnBeginTx
	preparer  sqldriver.ConnPrepareContext
	execer    sqldriver.ExecerContext
	queryer   sqldriver.QueryerContext
	checker   sqldriver.NamedValueChecker
	resetter  sqldriver.SessionResetter
	validator sqldriver.Validator

	// plain remembers the last statements classified plain on this
	// connection (round robin; see classify).
	plain     [plainMemo]string
	plainNext int
}

// plainMemo is how many plain statements a connection remembers: a
// transaction's few statements, repeated transaction after transaction,
// are compared (length first) instead of scanned again.
const plainMemo = 8

// plainMemoBytes is the longest statement a connection remembers.
const plainMemoBytes = 4096

var (
	_ sqldriver.Conn               = (*conn)(nil)
	_ sqldriver.ConnBeginTx        = (*conn)(nil)
	_ sqldriver.ConnPrepareContext = (*conn)(nil)
	_ sqldriver.ExecerContext      = (*conn)(nil)
	_ sqldriver.QueryerContext     = (*conn)(nil)
	_ sqldriver.Pinger             = (*conn)(nil)
	_ sqldriver.SessionResetter    = (*conn)(nil)
	_ sqldriver.Validator          = (*conn)(nil)
	_ sqldriver.NamedValueChecker  = (*conn)(nil)
)

// newConn is a bare wrapper of c: every conn is made here, so that its
// optional interfaces are asserted.
func (o *Outbox) newConn(c sqldriver.Conn) *conn {
	w := &conn{parent: c, o: o}
	w.beginTx, _ = c.(sqldriver.ConnBeginTx)
	w.preparer, _ = c.(sqldriver.ConnPrepareContext)
	w.execer, _ = c.(sqldriver.ExecerContext)
	w.queryer, _ = c.(sqldriver.QueryerContext)
	w.checker, _ = c.(sqldriver.NamedValueChecker)
	w.resetter, _ = c.(sqldriver.SessionResetter)
	w.validator, _ = c.(sqldriver.Validator)
	return w
}

func (o *Outbox) wrapConn(c sqldriver.Conn, wake *notifier) *conn {
	w := o.newConn(c)
	w.wake = wake
	if o.cacheable(c) {
		w.cache = &stmtCache{finalize: o.cfg.Dialect == SQLite}
	}
	return w
}

// Unwrap returns the driver's own connection inside c, for code that
// needs a driver-specific method inside (*sql.Conn).Raw:
//
//	err := conn.Raw(func(dc any) error {
//		pgxConn := driver.Unwrap(dc).(*stdlib.Conn)
//		_, err := pgxConn.Conn().CopyFrom(ctx, ...)
//		return err
//	})
//
// A value the wrapper did not make is returned unchanged, so Unwrap is
// safe on any connection. Statements run on the unwrapped connection
// bypass the wrapper: inside a bound transaction, do not use it for
// SAVEPOINT, ROLLBACK TO or RELEASE (their effect on buffered events would
// go unseen).
func Unwrap(c any) any {
	for {
		w, ok := c.(*conn)
		if !ok {
			return c
		}
		c = w.parent
	}
}

// Close closes the cached statements on SQLite (see stmtCache), then the
// connection, and returns the connection's Close error.
func (c *conn) Close() error {
	if c.cache != nil {
		c.cache.close()
	}
	return c.parent.Close()
}

func (c *conn) Begin() (sqldriver.Tx, error) {
	//lint:ignore SA1019 forwarded for drivers that only have Begin
	return c.parent.Begin()
}

// Errors of the Begin fallback, worded as database/sql words its own.
var (
	errNoIsolation = errors.New("sql: driver does not support non-default isolation level")
	errNoReadOnly  = errors.New("sql: driver does not support read-only transactions")
)

// BeginTx begins on the wrapped connection and, when ctx carries an emit
// scope and the transaction is not read-only, binds a new batch to the
// scope. Without ConnBeginTx it falls back to Begin exactly where
// database/sql would. An unbound transaction is the driver's own.
func (c *conn) BeginTx(ctx context.Context, opts sqldriver.TxOptions) (sqldriver.Tx, error) {
	var t sqldriver.Tx
	var err error
	if c.beginTx != nil {
		t, err = c.beginTx.BeginTx(ctx, opts)
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
		t, err = c.parent.Begin()
	}
	if err != nil {
		return nil, err
	}
	sc := emit.FromContext(ctx)
	if sc == nil || opts.ReadOnly {
		c.tx = nil
		return t, nil
	}
	c.tx = &tx{parent: t, c: c, ctx: ctx, batch: sc.BeginWith(c.o.Limits(), c.o.cfg.Capture)}
	return c.tx, nil
}

// Prepare and PrepareContext return the driver's statement, except for the
// few statements that change a transaction's savepoints or extent, which
// get a wrapper that applies them to the bound transaction when executed
// (see savepoint.go). They are classified whether or not a transaction is
// bound: database/sql may run a statement prepared outside a transaction
// inside one on the same connection. Inside a bound transaction,
// transaction control and what cannot be classified are refused before
// the driver sees them, as when executed directly.
func (c *conn) Prepare(query string) (sqldriver.Stmt, error) {
	cls, err := c.checkPrepare(query)
	if err != nil {
		return nil, err
	}
	s, err := c.parent.Prepare(query)
	if err != nil {
		return nil, err
	}
	return c.wrapStmt(s, cls, query), nil
}

func (c *conn) PrepareContext(ctx context.Context, query string) (sqldriver.Stmt, error) {
	cls, err := c.checkPrepare(query)
	if err != nil {
		return nil, err
	}
	s, err := c.prepareParent(ctx, query)
	if err != nil {
		return nil, err
	}
	return c.wrapStmt(s, cls, query), nil
}

func (c *conn) prepareParent(ctx context.Context, query string) (sqldriver.Stmt, error) {
	if c.preparer != nil {
		return c.preparer.PrepareContext(ctx, query)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return c.parent.Prepare(query)
}

// ExecContext runs query on the wrapped connection; inside a bound
// transaction it first classifies it (savepoint.go).
func (c *conn) ExecContext(ctx context.Context, query string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	if c.tx != nil {
		if cls := c.classify(query); cls.kind != kindPlain {
			return c.execControl(ctx, cls, query, args, c.execParent)
		}
	}
	return c.execParent(ctx, query, args)
}

func (c *conn) execParent(ctx context.Context, query string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	if c.execer != nil {
		return c.execer.ExecContext(ctx, query, args)
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

// QueryContext runs query on the wrapped connection; inside a bound
// transaction it first classifies it. A savepoint command sent as a query
// is executed (it returns no rows) so that its outcome is known before
// the wrapper applies it, and answered with an empty result set.
func (c *conn) QueryContext(ctx context.Context, query string, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	if c.tx != nil {
		if cls := c.classify(query); cls.kind != kindPlain {
			if _, err := c.execControl(ctx, cls, query, args, c.execParentOrPrepare); err != nil {
				return nil, err
			}
			return emptyRows{}, nil
		}
	}
	return c.queryParent(ctx, query, args)
}

func (c *conn) queryParent(ctx context.Context, query string, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	if c.queryer != nil {
		return c.queryer.QueryContext(ctx, query, args)
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

// execParentOrPrepare executes query on the wrapped connection, preparing
// it when the driver answers ExecContext with driver.ErrSkip.
func (c *conn) execParentOrPrepare(ctx context.Context, query string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	res, err := c.execParent(ctx, query, args)
	if !errors.Is(err, sqldriver.ErrSkip) {
		return res, err
	}
	s, err := c.prepareParent(ctx, query)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return stmtExecResult(ctx, s, args)
}

func (c *conn) Exec(query string, args []sqldriver.Value) (sqldriver.Result, error) {
	return c.ExecContext(context.Background(), query, valuesToNamed(args))
}

func (c *conn) Query(query string, args []sqldriver.Value) (sqldriver.Rows, error) {
	return c.QueryContext(context.Background(), query, valuesToNamed(args))
}

func (c *conn) Ping(ctx context.Context) error {
	if p, ok := c.parent.(sqldriver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *conn) ResetSession(ctx context.Context) error {
	if c.resetter != nil {
		return c.resetter.ResetSession(ctx)
	}
	return nil
}

func (c *conn) IsValid() bool {
	if c.validator != nil {
		return c.validator.IsValid()
	}
	return true
}

// CheckNamedValue forwards to the wrapped connection; without one,
// driver.ErrSkip makes database/sql apply its default conversion.
func (c *conn) CheckNamedValue(nv *sqldriver.NamedValue) error {
	if c.checker != nil {
		return c.checker.CheckNamedValue(nv)
	}
	return sqldriver.ErrSkip
}

// tx is a bound transaction: what it carries from BeginTx to Commit (the
// batch Emit buffers into, the savepoints opened in it) in one allocation.
// Commit runs the commit hook (commit.go).
type tx struct {
	parent     sqldriver.Tx
	c          *conn
	ctx        context.Context // BeginTx's
	batch      *emit.Batch
	savepoints []savepoint // oldest first
}

// Commit writes the buffered events and commits (see Outbox.commit).
func (t *tx) Commit() error {
	t.c.tx = nil
	return t.c.o.commit(t)
}

// Rollback drops the buffered events and rolls back.
func (t *tx) Rollback() error {
	t.c.tx = nil
	t.batch.Discard()
	return t.parent.Rollback()
}

// emptyRows is the result set of a savepoint command sent as a query.
type emptyRows struct{}

func (emptyRows) Columns() []string                 { return []string{} }
func (emptyRows) Close() error                      { return nil }
func (emptyRows) Next(dest []sqldriver.Value) error { return io.EOF }

// stmtExecResult executes a prepared statement with StmtExecContext, or
// with the deprecated Exec for drivers that lack it.
func stmtExecResult(ctx context.Context, stmt sqldriver.Stmt, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	if se, ok := stmt.(sqldriver.StmtExecContext); ok {
		return se.ExecContext(ctx, args)
	}
	vals, err := namedToValues(args)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	//lint:ignore SA1019 fallback for drivers that lack StmtExecContext
	return stmt.Exec(vals)
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

func valuesToNamed(args []sqldriver.Value) []sqldriver.NamedValue {
	nv := make([]sqldriver.NamedValue, len(args))
	for k, v := range args {
		nv[k] = sqldriver.NamedValue{Ordinal: k + 1, Value: v}
	}
	return nv
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
