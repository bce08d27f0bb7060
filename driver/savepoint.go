package driver

import (
	"context"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"

	"github.com/sqloutbox/outbox/emit"
)

// Errors of statements inside a bound transaction; match them with
// errors.Is. The statement was not sent to the database, and the
// transaction is unchanged and usable.
var (
	// ErrTransactionControl: a statement that would end, restart or
	// implicitly commit the bound transaction (COMMIT, END, ROLLBACK, BEGIN,
	// START TRANSACTION, ABORT, PREPARE TRANSACTION, XA, SET autocommit,
	// and on MySQL/MariaDB DDL and the other statements that commit
	// implicitly) was sent as a plain statement. The buffered events would
	// be lost or written outside the transaction; use tx.Commit or
	// tx.Rollback, and run DDL outside the transaction.
	ErrTransactionControl = errors.New("outbox: transaction control statement inside a transaction bound to an emit scope")
	// ErrUncertainStatement: the wrapper cannot tell what the statement
	// does to the transaction's savepoints (several statements in one
	// string of which one is not plain, a MySQL CALL without
	// Config.AllowProcedureCalls, a MySQL /*! */ executable comment, an
	// unterminated quote, a savepoint command it cannot parse, or ROLLBACK
	// TO / RELEASE of a savepoint it did not see created). It refuses
	// rather than guess: a wrong guess publishes an event whose rows were
	// rolled back.
	ErrUncertainStatement = errors.New("outbox: cannot tell what the statement does to the savepoints of a transaction bound to an emit scope")
)

// savepoint is an open savepoint: its folded name and the batch position
// when it was set.
type savepoint struct {
	name string
	mark emit.Mark
}

// find returns the index of the newest open savepoint called name, or -1.
func (b *tx) find(name string) int {
	for i := len(b.savepoints) - 1; i >= 0; i-- {
		if b.savepoints[i].name == name {
			return i
		}
	}
	return -1
}

// check refuses a statement before it is sent: transaction control, what
// cannot be classified, and a ROLLBACK TO or RELEASE of a savepoint the
// wrapper never saw (it would not know which events to drop).
func (c *conn) check(cls stmtClass, query string) error {
	switch cls.kind {
	case kindTxControl:
		return fmt.Errorf("%w: %s (statement %s)", ErrTransactionControl, cls.reason, quoteStmt(query))
	case kindUncertain:
		if c.o.cfg.AllowProcedureCalls && cls.procedure {
			return nil
		}
		return fmt.Errorf("%w: %s (statement %s)", ErrUncertainStatement, cls.reason, quoteStmt(query))
	case kindRollbackTo, kindRelease:
		if c.tx.find(cls.name) < 0 {
			return fmt.Errorf("%w: no savepoint %q was set in this transaction through the outbox driver (statement %s)", ErrUncertainStatement, cls.name, quoteStmt(query))
		}
	}
	return nil
}

// checkPrepare refuses, inside a bound transaction, preparing what
// executing would refuse regardless of the savepoints open by then
// (transaction control, what cannot be classified). ROLLBACK TO and RELEASE
// are checked when executed: the savepoint may be set in between.
// It returns the statement's class for wrapStmt.
func (c *conn) checkPrepare(query string) (stmtClass, error) {
	cls := c.classify(query)
	if c.tx != nil && (cls.kind == kindTxControl || cls.kind == kindUncertain) {
		return cls, c.check(cls, query)
	}
	return cls, nil
}

// apply records a savepoint command that the database executed
// successfully. Savepoint semantics are the SQL standard's, which
// PostgreSQL, MySQL/MariaDB and SQLite share: ROLLBACK TO x drops the events
// emitted since x and every savepoint set after x, and keeps x open; RELEASE
// x keeps the events and closes x and every savepoint set after it. A
// reused name: PostgreSQL and SQLite keep the older savepoint, shadowed
// until the newer one is released; MySQL/MariaDB delete the older one.
func (c *conn) apply(cls stmtClass) {
	b := c.tx
	switch cls.kind {
	case kindSavepoint:
		if c.o.cfg.Dialect == MySQL {
			if i := b.find(cls.name); i >= 0 {
				b.savepoints = append(b.savepoints[:i], b.savepoints[i+1:]...)
			}
		}
		b.savepoints = append(b.savepoints, savepoint{name: cls.name, mark: b.batch.Mark()})
	case kindRollbackTo:
		if i := b.find(cls.name); i >= 0 {
			b.batch.RollbackTo(b.savepoints[i].mark)
			b.savepoints = b.savepoints[:i+1]
		}
	case kindRelease:
		if i := b.find(cls.name); i >= 0 {
			b.savepoints = b.savepoints[:i]
		}
	}
}

// execControl runs a statement classified as not plain inside a bound
// transaction: refused (check) or executed with run and, on success,
// applied. A driver.ErrSkip from run is returned as is: database/sql then
// prepares the statement, and the wrapped statement applies it.
func (c *conn) execControl(ctx context.Context, cls stmtClass, query string, args []sqldriver.NamedValue,
	run func(context.Context, string, []sqldriver.NamedValue) (sqldriver.Result, error)) (sqldriver.Result, error) {
	if err := c.check(cls, query); err != nil {
		return nil, err
	}
	res, err := run(ctx, query, args)
	if err == nil {
		c.apply(cls)
	}
	return res, err
}

// wrapStmt returns s itself for a plain statement, or a ctlStmt that
// applies the statement to the connection's bound transaction.
func (c *conn) wrapStmt(s sqldriver.Stmt, cls stmtClass, query string) sqldriver.Stmt {
	if cls.kind == kindPlain {
		return s
	}
	return &ctlStmt{parent: s, c: c, cls: cls, query: query}
}

// ctlStmt is a prepared savepoint or transaction-control statement. Run
// inside a bound transaction it is checked and applied like the same
// statement sent directly; outside one it is the driver's statement.
type ctlStmt struct {
	parent sqldriver.Stmt
	c      *conn
	cls    stmtClass
	query  string
}

var (
	_ sqldriver.StmtExecContext   = (*ctlStmt)(nil)
	_ sqldriver.StmtQueryContext  = (*ctlStmt)(nil)
	_ sqldriver.NamedValueChecker = (*ctlStmt)(nil)
)

func (s *ctlStmt) Close() error  { return s.parent.Close() }
func (s *ctlStmt) NumInput() int { return s.parent.NumInput() }

func (s *ctlStmt) Exec(args []sqldriver.Value) (sqldriver.Result, error) {
	return s.ExecContext(context.Background(), valuesToNamed(args))
}

func (s *ctlStmt) Query(args []sqldriver.Value) (sqldriver.Rows, error) {
	return s.QueryContext(context.Background(), valuesToNamed(args))
}

func (s *ctlStmt) exec(ctx context.Context, _ string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	return stmtExecResult(ctx, s.parent, args)
}

func (s *ctlStmt) ExecContext(ctx context.Context, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	if s.c.tx == nil {
		return stmtExecResult(ctx, s.parent, args)
	}
	return s.c.execControl(ctx, s.cls, s.query, args, s.exec)
}

func (s *ctlStmt) QueryContext(ctx context.Context, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	if s.c.tx == nil {
		if sq, ok := s.parent.(sqldriver.StmtQueryContext); ok {
			return sq.QueryContext(ctx, args)
		}
		vals, err := namedToValues(args)
		if err != nil {
			return nil, err
		}
		//lint:ignore SA1019 fallback for drivers that lack StmtQueryContext
		return s.parent.Query(vals)
	}
	if _, err := s.c.execControl(ctx, s.cls, s.query, args, s.exec); err != nil {
		return nil, err
	}
	return emptyRows{}, nil
}

// CheckNamedValue forwards to the driver's statement or, where it has no
// checker, to the driver's connection, as database/sql does for the
// driver's own statement. (driver.ErrSkip from here would not reach the
// connection's checker: database/sql asks a statement's checker instead
// of the connection's, and on ErrSkip applies its default conversion,
// which rejects what only the connection's checker accepts, such as
// lib/pq's slices.)
func (s *ctlStmt) CheckNamedValue(nv *sqldriver.NamedValue) error {
	if ch, ok := s.parent.(sqldriver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return s.c.CheckNamedValue(nv)
}

// quoteStmt quotes a statement for an error message, cut to 80 bytes.
func quoteStmt(q string) string {
	if len(q) > 80 {
		q = q[:77] + "..."
	}
	return fmt.Sprintf("%q", q)
}
