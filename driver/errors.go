package driver

import (
	"context"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/sqlerr"
)

// DuplicateIDError is the commit hook's error when an event's ID is
// already in the outbox table: an earlier committed transaction emitted an
// event with the same Event.ID. The transaction was rolled back (nothing
// of it committed). It matches emit.ErrDuplicateID (outbox.ErrDuplicateID)
// and, returned from Commit, ErrWriteEvents; errors.As yields the ID.
//
// A reuse is caught while the earlier row is in the table: pending, sent
// (marking an event sent leaves its row in place) or dead, from its commit
// until retention (relay.Retention) removes it, at the first pass after
// the row is sent and older than RetentionConfig.After (7 days by default,
// counted from its created_at); dead letters are never removed by
// retention. Once the row is gone (retention, or a delete-on-publish
// setup at once), the same ID commits again and consumers deduplicate it
// (at-least-once delivery; see docs/guarantees.md).
type DuplicateIDError struct {
	// ID is the reused message ID; empty if the database did not say which
	// of the transaction's IDs it was and the lookup after the rollback
	// found none (the earlier row was deleted meanwhile).
	ID string
	// Table is the outbox table.
	Table string
	// Err is the driver's unique-violation error (SQLSTATE 23505 on
	// PostgreSQL, error 1062 on MySQL/MariaDB, SQLITE_CONSTRAINT_UNIQUE
	// (2067) on SQLite).
	Err error
}

// Error names the reused ID (when known), the table and the driver's error.
func (e *DuplicateIDError) Error() string {
	id := "one of the transaction's message IDs"
	if e.ID != "" {
		id = "message ID " + strconv.Quote(e.ID)
	}
	return fmt.Sprintf("outbox: %s is already in %s (an earlier committed transaction emitted it): %v", id, e.Table, e.Err)
}

// Is reports whether target is emit.ErrDuplicateID.
func (e *DuplicateIDError) Is(target error) bool { return target == emit.ErrDuplicateID }

// Unwrap returns the driver's error.
func (e *DuplicateIDError) Unwrap() error { return e.Err }

// errorTexts returns the messages of err's chain and any Detail field
// (lib/pq and pgx put "Key (message_id)=(...) already exists." there).
func errorTexts(err error) string {
	var b strings.Builder
	sqlerr.Walk(err, func(e error) bool {
		b.WriteString(e.Error())
		v := reflect.ValueOf(e)
		if v.Kind() == reflect.Pointer {
			v = v.Elem()
		}
		if v.Kind() == reflect.Struct {
			if d := v.FieldByName("Detail"); d.IsValid() && d.Kind() == reflect.String {
				b.WriteByte('\n')
				b.WriteString(d.String())
			}
		}
		b.WriteByte('\n')
		return false
	})
	return b.String()
}

// duplicateID builds the DuplicateIDError for a unique violation of the
// event INSERT, after the rollback. The ID is taken from the driver's
// message where it names it (PostgreSQL's detail, MySQL's "Duplicate entry
// '...'"); otherwise (SQLite names only the column) the table is asked,
// on the same connection, which of the transaction's IDs it holds.
func (o *Outbox) duplicateID(ctx context.Context, c *conn, events []emit.Event, err error) error {
	de := &DuplicateIDError{Table: o.cfg.Table, Err: err}
	text := errorTexts(err)
	for i := range events {
		if id := events[i].ID; strings.Contains(text, "("+id+")") || strings.Contains(text, "'"+id+"'") {
			de.ID = id
			return de
		}
	}
	const chunk = 500
	for start := 0; start < len(events) && de.ID == ""; start += chunk {
		end := min(start+chunk, len(events))
		args := make([]sqldriver.NamedValue, 0, end-start)
		for k := start; k < end; k++ {
			args = append(args, sqldriver.NamedValue{Ordinal: len(args) + 1, Value: events[k].ID})
		}
		q := o.dialect.Bind("SELECT message_id FROM " + o.dialect.QuotedTable() +
			" WHERE message_id IN (?" + strings.Repeat(", ?", len(args)-1) + ") LIMIT 1")
		v, qerr := queryOne(ctx, c, q, args)
		if qerr != nil {
			break // the violation is the error to report
		}
		de.ID = v
	}
	return de
}

// queryValue runs a query on the wrapped connection itself (inside the
// commit hook, where going through database/sql would deadlock) and
// returns the first column of its first row, nil for no row or NULL. A
// driver that answers QueryContext with driver.ErrSkip gets prepare, query,
// close; a driver's panic is returned as an error.
func queryValue(ctx context.Context, c *conn, q string, args []sqldriver.NamedValue) (v sqldriver.Value, err error) {
	err = recovered(func() error {
		rows, err := c.queryParent(ctx, q, args)
		if errors.Is(err, sqldriver.ErrSkip) {
			var s sqldriver.Stmt
			if s, err = c.prepareParent(ctx, q); err != nil {
				return err
			}
			defer s.Close()
			if sq, ok := s.(sqldriver.StmtQueryContext); ok {
				rows, err = sq.QueryContext(ctx, args)
			} else {
				var vals []sqldriver.Value
				if vals, err = namedToValues(args); err == nil {
					//lint:ignore SA1019 fallback for drivers that lack StmtQueryContext
					rows, err = s.Query(vals)
				}
			}
		}
		if err != nil {
			return err
		}
		defer rows.Close()
		dest := make([]sqldriver.Value, max(len(rows.Columns()), 1))
		if err := rows.Next(dest); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		v = dest[0]
		return nil
	})
	return v, err
}

// queryOne is queryValue as text ("" for no row or NULL).
func queryOne(ctx context.Context, c *conn, q string, args []sqldriver.NamedValue) (string, error) {
	v, err := queryValue(ctx, c, q, args)
	switch x := v.(type) {
	case nil:
		return "", err
	case []byte:
		return string(x), err
	case string:
		return x, err
	default:
		return fmt.Sprint(x), err
	}
}

// checkServer refuses, once per Outbox, a server older than the dialect
// supports (dialect.SupportedVersion), at the first commit that writes
// events: the relay would refuse to run, and events would pile up unseen.
// The check costs one query on the first such commit; a failed check is
// not remembered, so it runs again at the next commit.
func (o *Outbox) checkServer(ctx context.Context, c *conn) error {
	if o.serverChecked.Load() {
		return nil
	}
	ver, err := queryOne(ctx, c, o.dialect.Query("version"), nil)
	if err != nil {
		return fmt.Errorf("outbox: reading server version: %w", err)
	}
	if err := dialect.SupportedVersion(dialect.Name(o.cfg.Dialect), ver); err != nil {
		return err
	}
	o.serverChecked.Store(true)
	return nil
}
