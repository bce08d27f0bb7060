package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Errors wrapped by InTx's error, besides the driver's own (match both with
// errors.Is/As). The message keeps the driver's error after the prefix:
// "outbox: begin: dial tcp ...: connection refused".
var (
	// ErrBegin: BeginTx failed (no connection, a cancelled context, the
	// server refused). The transaction never began and fn did not run, so
	// nothing was written: retrying InTx is always safe.
	ErrBegin = errors.New("outbox: begin")
	// ErrCommit: Commit failed. The transaction may or may not have
	// committed (a connection lost during COMMIT leaves the outcome
	// unknown; driver.ErrWriteEvents means it rolled back): its events are
	// published if and only if it committed, as with tx.Commit. Retry only
	// work that is idempotent or checked first.
	ErrCommit = errors.New("outbox: commit")
)

// TxBeginner begins a transaction: *sql.DB and *sql.Conn implement it.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// InTx runs fn in a transaction with its own emit scope, the unit of work
// every service otherwise writes by hand: it calls NewContext(ctx), begins
// a transaction on db (an outbox-wrapped *sql.DB or *sql.Conn) with that
// context and the driver's default options (for another isolation level,
// begin it yourself as InTx does), calls fn with the scoped context and the transaction, and commits. Emit
// with the context fn receives (or one derived from it) buffers events in
// this transaction; they are written just before its COMMIT.
//
// If fn returns an error or panics, the transaction is rolled back (its
// events are discarded, never published) and fn's error is returned as
// is, joined with the rollback's error if that failed other than with
// sql.ErrTxDone; a panic is re-raised after the rollback. An error from
// BeginTx is returned wrapping ErrBegin and the driver's error (safe to
// retry), one from Commit wrapping ErrCommit and the driver's error; after
// a failed Commit the transaction's outcome decides whether its events are
// published, as with tx.Commit.
func InTx(ctx context.Context, db TxBeginner, fn func(ctx context.Context, tx *sql.Tx) error) (err error) {
	ctx = NewContext(ctx)
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBegin, err)
	}
	committed := false
	defer func() {
		if committed {
			return
		}
		// fn failed or panicked: roll back (a panic goes on after it).
		if rerr := tx.Rollback(); rerr != nil && !errors.Is(rerr, sql.ErrTxDone) && err != nil {
			err = errors.Join(err, fmt.Errorf("outbox: rollback: %w", rerr))
		}
	}()
	if err := fn(ctx, tx); err != nil {
		return err
	}
	committed = true
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%w: %w", ErrCommit, err)
	}
	return nil
}
