package driver

import (
	"context"
	sqldriver "database/sql/driver"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/logmsg"
	"github.com/sqloutbox/outbox/internal/sqlerr"
	"github.com/sqloutbox/outbox/partition"
)

// commit is the commit hook, run by tx.Commit: it writes the buffered
// events on the transaction's own connection (database/sql holds that
// connection's lock for the whole of Commit, so nothing else can use it
// meanwhile), then COMMITs, then wakes relays: those in this process
// through Wakeup, those in others (PostgreSQL) through the connector's
// notifier, which sends the NOTIFY on a connection of its own so that the
// writers' transactions never queue one (notifier.go). If the INSERT
// fails it rolls back and returns ErrWriteEvents: business changes are
// never committed without their events. A transaction that emitted nothing
// commits with no extra statement.
func (o *Outbox) commit(t *tx) error {
	events := t.batch.Take()
	if len(events) == 0 {
		return t.parent.Commit()
	}
	ctx := t.ctx
	err := o.checkServer(ctx, t.c)
	if err == nil {
		if o.cfg.LogOnly {
			var content []byte
			if content, err = o.logContent(ctx, t.c, events); err == nil {
				if t.c.execer != nil && !strings.ContainsRune(o.cfg.Table, '\\') {
					if done, err := o.commitLog(ctx, t, content, len(events)); done {
						return err
					}
				}
				err = o.writeLog(ctx, t.c, content, len(events))
			}
		} else {
			err = o.write(ctx, t.c, events)
		}
	}
	if err != nil {
		if rbErr := t.parent.Rollback(); rbErr != nil {
			err = errors.Join(err, fmt.Errorf("rollback: %w", rbErr))
		} else if sqlerr.UniqueViolation(err) {
			err = o.duplicateID(ctx, t.c, events, err)
		}
		return fmt.Errorf("%w: %w", ErrWriteEvents, err)
	}
	if err := t.parent.Commit(); err != nil {
		// COMMIT failed, or its outcome is unknown (connection lost after
		// sending it): the relay publishes the rows exactly if they exist.
		// Other processes' relays are woken all the same (a spurious
		// NOTIFY costs one empty claim; a missing one, a poll interval).
		t.c.wake.signal()
		return err
	}
	o.notify()
	t.c.wake.signal()
	return nil
}

// logContent returns events encoded as one logical decoding message of
// the log-only mode (Config.LogOnly; internal/logmsg's format), after
// checking once per Outbox that the database has a pgoutput slot
// (ErrNoSlot): without one nothing would decode the message.
func (o *Outbox) logContent(ctx context.Context, c *conn, events []emit.Event) ([]byte, error) {
	if !o.slotChecked.Load() {
		// confirmed_flush_lsn is NULL while the slot is being created: the
		// server waits for the transactions running then to end before the
		// slot's consistent point, and a message committed before that
		// point is not decoded by it (a long transaction elsewhere holds
		// the creation for as long as it runs).
		ok, err := queryOne(ctx, c, `SELECT EXISTS (SELECT 1 FROM pg_replication_slots
			WHERE database = current_database() AND plugin = 'pgoutput' AND wal_status IS DISTINCT FROM 'lost'
			AND confirmed_flush_lsn IS NOT NULL)::text`, nil)
		if err != nil {
			return nil, fmt.Errorf("outbox: looking for a replication slot (LogOnly): %w", err)
		}
		if ok != "true" {
			return nil, ErrNoSlot
		}
		o.slotChecked.Store(true)
	}
	parts, err := o.commitPartitions(ctx, c)
	if err != nil {
		return nil, err
	}
	evs := make([]logmsg.Event, len(events))
	for k := range events {
		ev := &events[k]
		var headers string
		if len(ev.Headers) > 0 {
			h, err := json.Marshal(ev.Headers)
			if err != nil {
				return nil, fmt.Errorf("encoding headers of %s: %w", ev.ID, err)
			}
			headers = string(h)
		}
		evs[k] = logmsg.Event{MessageID: ev.ID, AggregateType: ev.AggregateType, AggregateID: ev.AggregateID, EventType: ev.Type,
			Topic: ev.Topic, ContentType: ev.ContentType, Headers: headers, Payload: ev.Payload,
			Partition: partition.Of(ev.AggregateType, ev.AggregateID, parts)}
	}
	return logmsg.Encode(make([]byte, 0, logmsg.Size(evs)), evs), nil
}

// commitLog writes content (logContent) as one transactional logical
// decoding message and COMMITs in one round trip: both statements in one
// simple-protocol query, the content inline as hex (the wrapped driver's
// ExecerContext with no arguments: lib/pq and pgx send that as one Query
// message, and PostgreSQL runs it as one string, skipping what follows a
// failed statement). A COMMIT after the message would be a second round
// trip of its own (BenchmarkCommit, BENCHMARKS.md). The message decoded
// by the relay's WAL source at COMMIT is dropped by PostgreSQL's decoder
// if the transaction (or the subtransaction that emitted it, for a
// savepoint rolled back) aborts; Emit buffers events in the transaction,
// so a savepoint rolled back has already dropped its events here.
//
// On an error it finds out which statement failed with one more query:
// in a transaction left aborted (SQLSTATE 25P02) the message failed and
// COMMIT never ran, so it rolls back and returns ErrWriteEvents, as the
// two-statement path does; outside a transaction COMMIT ran and failed
// (a deferred constraint, a serialization failure), returned as it is;
// a connection lost leaves the outcome unknown, returned as it is (the
// relay publishes the events exactly if the transaction committed). done
// is false, and nothing was sent, if the driver declines the query
// (driver.ErrSkip): commit then takes the two-statement path.
func (o *Outbox) commitLog(ctx context.Context, t *tx, content []byte, n int) (done bool, _ error) {
	c := t.c
	q := make([]byte, 0, 2*len(content)+128)
	q = append(q, "SELECT pg_logical_emit_message(true, "...)
	q = appendLiteral(q, logmsg.Prefix(o.cfg.Table))
	q = append(q, ", decode('"...)
	q = hex.AppendEncode(q, content)
	q = append(q, "', 'hex')); COMMIT"...)
	err := recovered(func() error { _, err := c.execer.ExecContext(ctx, string(q), nil); return err })
	if errors.Is(err, sqldriver.ErrSkip) {
		return false, nil
	}
	if err == nil {
		o.notify()
		c.wake.signal()
		return true, nil
	}
	var probe error
	if perr := recovered(func() error { _, err := c.execer.ExecContext(ctx, "SELECT 1", nil); return err }); perr != nil {
		probe = perr
	}
	switch {
	case probe != nil && sqlerr.PostgresCode(probe) == "25P02": // in_failed_sql_transaction
		werr := fmt.Errorf("writing %d events as a logical decoding message: %w", n, err)
		if rbErr := t.parent.Rollback(); rbErr != nil {
			werr = errors.Join(werr, fmt.Errorf("rollback: %w", rbErr))
		}
		return true, fmt.Errorf("%w: %w", ErrWriteEvents, werr)
	case probe == nil:
		return true, err // COMMIT ran and failed: nothing committed
	default:
		c.wake.signal() // the outcome is unknown (see commit)
		return true, err
	}
}

// appendLiteral appends s as a PostgreSQL string literal: quotes doubled.
// A backslash would mean different things as standard_conforming_strings
// is on or off: commit sends a name with one through writeLog instead.
func appendLiteral(b []byte, s string) []byte {
	b = append(b, '\'')
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			b = append(b, '\'')
		}
		b = append(b, s[i])
	}
	return append(b, '\'')
}

// writeLog writes content (logContent) as one transactional logical
// decoding message through a prepared statement, for wrapped drivers
// without ExecerContext (commit then COMMITs in a second round trip).
func (o *Outbox) writeLog(ctx context.Context, c *conn, content []byte, n int) error {
	args := []sqldriver.NamedValue{{Ordinal: 1, Value: logmsg.Prefix(o.cfg.Table)}, {Ordinal: 2, Value: content}}
	const q = "SELECT pg_logical_emit_message(true, $1, $2::bytea)"
	var err error
	if c.cache != nil {
		err = c.cache.exec(ctx, c, logMessageKey, q, args)
	} else {
		err = recovered(func() error { _, err := c.execParentOrPrepare(ctx, q, args); return err })
	}
	if err != nil {
		return fmt.Errorf("writing %d events as a logical decoding message: %w", n, err)
	}
	return nil
}

// logMessageKey is writeLog's key in a connection's statement cache
// (insert keys are row counts, 1..cachedInsertRows).
const logMessageKey = -2

// insertCache keeps rendered multi-row INSERTs for small row counts,
// keyed by row count; a connection's statement cache uses the same keys.
type insertCache struct {
	mu sync.RWMutex
	m  map[int]string
}

const cachedInsertRows = 256

// insertSQL returns the multi-row INSERT for rows events and its cache key
// (-1 above cachedInsertRows rows: neither the text nor a prepared
// statement is kept).
func (o *Outbox) insertSQL(rows int) (string, int) {
	if rows > cachedInsertRows {
		return o.dialect.Insert(rows), -1
	}
	key := rows
	o.inserts.mu.RLock()
	q, ok := o.inserts.m[key]
	o.inserts.mu.RUnlock()
	if ok {
		return q, key
	}
	q = o.dialect.Insert(rows)
	o.inserts.mu.Lock()
	if o.inserts.m == nil {
		o.inserts.m = map[int]string{}
	}
	o.inserts.m[key] = q
	o.inserts.mu.Unlock()
	return q, key
}

// write INSERTs events with as few multi-row statements as the dialect's
// parameter limit and dialect.MaxStatementBytes allow (one for a typical
// transaction), through the connection's statement cache when it has one.
func (o *Outbox) write(ctx context.Context, c *conn, events []emit.Event) error {
	parts, err := o.commitPartitions(ctx, c)
	if err != nil {
		return err
	}
	maxRows := o.dialect.MaxInsertRows()
	headers := make([]any, len(events))
	for k := range events {
		if len(events[k].Headers) > 0 {
			h, err := json.Marshal(events[k].Headers)
			if err != nil {
				return fmt.Errorf("encoding headers of %s: %w", events[k].ID, err)
			}
			headers[k] = string(h)
		}
	}
	for start := 0; start < len(events); {
		end, bytes := start, 0
		for end < len(events) && end-start < maxRows {
			size := len(events[end].Payload)
			if h, ok := headers[end].(string); ok {
				size += len(h)
			}
			if end > start && bytes+size > dialect.MaxStatementBytes {
				break
			}
			bytes += size
			end++
		}
		args := make([]sqldriver.NamedValue, 0, (end-start)*dialect.InsertColumns)
		for k := start; k < end; k++ {
			ev := &events[k]
			var topic any
			if ev.Topic != "" {
				topic = ev.Topic
			}
			payload := ev.Payload
			if payload == nil {
				payload = []byte{} // NOT NULL column; raw content types may be empty
			}
			for _, v := range [...]any{
				ev.ID, ev.AggregateType, ev.AggregateID, ev.Type, topic,
				int64(partition.Of(ev.AggregateType, ev.AggregateID, parts)),
				ev.ContentType, payload, headers[k],
			} {
				args = append(args, sqldriver.NamedValue{Ordinal: len(args) + 1, Value: v})
			}
		}
		q, key := o.insertSQL(end - start)
		var err error
		if c.cache != nil && key >= 0 {
			err = c.cache.exec(ctx, c, key, q, args)
		} else {
			err = recovered(func() error { _, err := c.execParentOrPrepare(ctx, q, args); return err })
		}
		if err != nil {
			return fmt.Errorf("inserting %d events into %s: %w", end-start, o.cfg.Table, err)
		}
		start = end
	}
	return nil
}
