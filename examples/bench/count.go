package main

import (
	"context"
	sqldriver "database/sql/driver"
	"errors"
	"strings"
	"sync/atomic"
)

// counter counts the calls that reach the network driver: Begin, Exec,
// Query, Prepare (and prepared-statement Exec/Query), Commit, Rollback.
// Each is one round trip to the server (pgx may pipeline a statement's
// parse/bind/execute into one; go-sql-driver/mysql without
// interpolateParams prepares, executes and closes: counted as two, the
// close is fire-and-forget). On SQLite (in-process) they are calls, not
// network round trips.
type counter struct{ n atomic.Int64 }

func (c *counter) add() { c.n.Add(1) }

// Load returns the count so far.
func (c *counter) Load() int64 { return c.n.Load() }

// countingConnector wraps a driver.Connector; the outbox driver wraps it in
// turn (driver.New(...).WrapConnector(countingConnector)), so what it counts
// is exactly what the application plus the outbox hook send.
type countingConnector struct {
	c   sqldriver.Connector
	cnt *counter
}

func (cc countingConnector) Connect(ctx context.Context) (sqldriver.Conn, error) {
	conn, err := cc.c.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: conn, cnt: cc.cnt}, nil
}

func (cc countingConnector) Driver() sqldriver.Driver { return cc.c.Driver() }

// dsnConnector turns a driver and DSN into a Connector (for SQLite).
type dsnConnector struct {
	d   sqldriver.Driver
	dsn string
}

func (d dsnConnector) Connect(context.Context) (sqldriver.Conn, error) { return d.d.Open(d.dsn) }
func (d dsnConnector) Driver() sqldriver.Driver                        { return d.d }

type countingConn struct {
	sqldriver.Conn
	cnt *counter
}

var (
	_ sqldriver.ConnBeginTx        = (*countingConn)(nil)
	_ sqldriver.ExecerContext      = (*countingConn)(nil)
	_ sqldriver.QueryerContext     = (*countingConn)(nil)
	_ sqldriver.ConnPrepareContext = (*countingConn)(nil)
	_ sqldriver.Pinger             = (*countingConn)(nil)
	_ sqldriver.SessionResetter    = (*countingConn)(nil)
	_ sqldriver.Validator          = (*countingConn)(nil)
	_ sqldriver.NamedValueChecker  = (*countingConn)(nil)
)

func (c *countingConn) BeginTx(ctx context.Context, opts sqldriver.TxOptions) (sqldriver.Tx, error) {
	b, ok := c.Conn.(sqldriver.ConnBeginTx)
	if !ok {
		return nil, errors.New("bench: driver connection without BeginTx")
	}
	tx, err := b.BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	c.cnt.add()
	return countingTx{tx: tx, cnt: c.cnt}, nil
}

func (c *countingConn) ExecContext(ctx context.Context, q string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	e, ok := c.Conn.(sqldriver.ExecerContext)
	if !ok {
		return nil, sqldriver.ErrSkip
	}
	r, err := e.ExecContext(ctx, q, args)
	if err != sqldriver.ErrSkip && !isNotify(q) {
		c.cnt.add()
	}
	return r, err
}

func (c *countingConn) QueryContext(ctx context.Context, q string, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	e, ok := c.Conn.(sqldriver.QueryerContext)
	if !ok {
		return nil, sqldriver.ErrSkip
	}
	r, err := e.QueryContext(ctx, q, args)
	if err != sqldriver.ErrSkip && !isNotify(q) {
		c.cnt.add()
	}
	return r, err
}

func (c *countingConn) PrepareContext(ctx context.Context, q string) (sqldriver.Stmt, error) {
	var s sqldriver.Stmt
	var err error
	if p, ok := c.Conn.(sqldriver.ConnPrepareContext); ok {
		s, err = p.PrepareContext(ctx, q)
	} else {
		s, err = c.Conn.Prepare(q)
	}
	if err != nil {
		c.cnt.add()
		return nil, err
	}
	if isNotify(q) {
		return s, nil
	}
	c.cnt.add()
	return &countingStmt{Stmt: s, cnt: c.cnt}, nil
}

// isNotify reports whether q is the PostgreSQL wake-up NOTIFY the outbox
// driver's notifier sends on a connection of its own after commits
// (driver/notifier.go): it is not part of any transaction measured here,
// and it coalesces (one per several commits), so counting it would make
// a transaction's round trips depend on timing.
func isNotify(q string) bool { return strings.Contains(q, "pg_notify(") }

func (c *countingConn) Ping(ctx context.Context) error {
	if p, ok := c.Conn.(sqldriver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *countingConn) ResetSession(ctx context.Context) error {
	if r, ok := c.Conn.(sqldriver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *countingConn) IsValid() bool {
	if v, ok := c.Conn.(sqldriver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *countingConn) CheckNamedValue(nv *sqldriver.NamedValue) error {
	if v, ok := c.Conn.(sqldriver.NamedValueChecker); ok {
		return v.CheckNamedValue(nv)
	}
	return sqldriver.ErrSkip
}

type countingTx struct {
	tx  sqldriver.Tx
	cnt *counter
}

func (t countingTx) Commit() error   { t.cnt.add(); return t.tx.Commit() }
func (t countingTx) Rollback() error { t.cnt.add(); return t.tx.Rollback() }

type countingStmt struct {
	sqldriver.Stmt
	cnt *counter
}

func (s *countingStmt) ExecContext(ctx context.Context, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	s.cnt.add()
	if e, ok := s.Stmt.(sqldriver.StmtExecContext); ok {
		return e.ExecContext(ctx, args)
	}
	return nil, sqldriver.ErrSkip
}

func (s *countingStmt) QueryContext(ctx context.Context, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	s.cnt.add()
	if q, ok := s.Stmt.(sqldriver.StmtQueryContext); ok {
		return q.QueryContext(ctx, args)
	}
	return nil, sqldriver.ErrSkip
}

func (s *countingStmt) CheckNamedValue(nv *sqldriver.NamedValue) error {
	if v, ok := s.Stmt.(sqldriver.NamedValueChecker); ok {
		return v.CheckNamedValue(nv)
	}
	return sqldriver.ErrSkip
}
