package driver

import (
	"context"
	sqldriver "database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/ngrok/sqlmw"

	"github.com/sqloutbox/outbox/emit"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/partition"
)

// interceptor binds transactions to emit scopes and writes their events
// just before COMMIT. Everything else passes through sqlmw untouched.
type interceptor struct {
	sqlmw.NullInterceptor
	o *Outbox
}

type txKey struct{}

// txState is what one bound transaction carries from BeginTx to Commit.
type txState struct {
	batch *emit.Batch
	conn  sqldriver.ConnBeginTx // the wrapped driver's own connection
	cache *cachingConn          // its statement cache; nil when off
}

// ConnectorConnect opens a connection and, where the statement cache
// applies (Outbox.cacheable), wraps it in a cachingConn (sqlmw calls this
// for every connection database/sql opens through a wrapped driver or
// connector).
func (i *interceptor) ConnectorConnect(ctx context.Context, c sqldriver.Connector) (sqldriver.Conn, error) {
	conn, err := c.Connect(ctx)
	if err != nil || !i.o.cacheable(conn) {
		return conn, err
	}
	return &cachingConn{parent: conn, finalize: i.o.cfg.Dialect == SQLite}, nil
}

// ConnBeginTx begins the transaction and, when ctx carries an emit scope
// and the transaction is not read-only, binds a new batch to the scope.
// The batch travels to TxCommit in the context sqlmw keeps for the tx.
func (i *interceptor) ConnBeginTx(ctx context.Context, conn sqldriver.ConnBeginTx, opts sqldriver.TxOptions) (context.Context, sqldriver.Tx, error) {
	tx, err := conn.BeginTx(ctx, opts)
	if err != nil {
		return ctx, nil, err
	}
	sc := emit.FromContext(ctx)
	if sc == nil || opts.ReadOnly {
		return ctx, tx, nil
	}
	st := &txState{batch: sc.Begin(i.o.cfg.Limits), conn: conn}
	if ct, ok := tx.(*cachingTx); ok {
		st.cache = ct.conn
	}
	return context.WithValue(ctx, txKey{}, st), tx, nil
}

// TxCommit writes the buffered events on the transaction's own connection
// (database/sql holds that connection's lock for the whole of Commit, so
// nothing else can use it meanwhile), then COMMITs, then wakes relays. If
// the INSERT fails it rolls back and returns ErrWriteEvents: business
// changes are never committed without their events. A transaction that
// emitted nothing commits with no extra statement.
func (i *interceptor) TxCommit(ctx context.Context, tx sqldriver.Tx) error {
	st, _ := ctx.Value(txKey{}).(*txState)
	if st == nil {
		return tx.Commit()
	}
	events := st.batch.Take()
	if len(events) == 0 {
		return tx.Commit()
	}
	if err := i.o.write(ctx, st, events); err != nil {
		if rbErr := tx.Rollback(); rbErr != nil {
			err = errors.Join(err, fmt.Errorf("rollback: %w", rbErr))
		}
		return fmt.Errorf("%w: %w", ErrWriteEvents, err)
	}
	if err := tx.Commit(); err != nil {
		// COMMIT failed, or its outcome is unknown (connection lost after
		// sending it): the relay publishes the rows exactly if they exist.
		return err
	}
	i.o.notify()
	return nil
}

// TxRollback drops the transaction's buffered events.
func (i *interceptor) TxRollback(ctx context.Context, tx sqldriver.Tx) error {
	if st, _ := ctx.Value(txKey{}).(*txState); st != nil {
		st.batch.Discard()
	}
	return tx.Rollback()
}

// insertCache keeps rendered multi-row INSERTs for small row counts,
// keyed by rows*2 (+1 with NOTIFY); a connection's statement cache uses
// the same keys.
type insertCache struct {
	mu sync.RWMutex
	m  map[int]string
}

const cachedInsertRows = 256

// insertSQL returns the multi-row INSERT for rows events, with the
// PostgreSQL NOTIFY folded in when notify is set, and its cache key (-1
// above cachedInsertRows rows: neither the text nor a prepared statement is
// kept).
func (o *Outbox) insertSQL(rows int, notify bool) (string, int) {
	render := func() string {
		if notify {
			return o.dialect.InsertNotify(rows)
		}
		return o.dialect.Insert(rows)
	}
	if rows > cachedInsertRows {
		return render(), -1
	}
	key := rows * 2
	if notify {
		key++
	}
	o.inserts.mu.RLock()
	q, ok := o.inserts.m[key]
	o.inserts.mu.RUnlock()
	if ok {
		return q, key
	}
	q = render()
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
func (o *Outbox) write(ctx context.Context, st *txState, events []emit.Event) error {
	parts, err := o.commitPartitions(ctx, st.conn)
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
		// One NOTIFY per transaction, folded into its last INSERT.
		notify := end == len(events) && o.cfg.Dialect == Postgres && !o.cfg.DisableNotify
		q, key := o.insertSQL(end-start, notify)
		var err error
		if st.cache != nil && key >= 0 {
			err = st.cache.exec(ctx, key, q, args)
		} else {
			err = execOnConn(ctx, st.conn, q, args)
		}
		if err != nil {
			return fmt.Errorf("inserting %d events into %s: %w", end-start, o.cfg.Table, err)
		}
		start = end
	}
	return nil
}

// execOnConn runs query on a driver connection directly. Drivers that
// answer ExecContext with driver.ErrSkip (go-sql-driver/mysql without
// interpolateParams) get prepare, exec, close.
func execOnConn(ctx context.Context, conn any, query string, args []sqldriver.NamedValue) (err error) {
	defer func() {
		if r := recover(); r != nil { // sqlmw's fallbacks assume interfaces a driver may lack
			err = fmt.Errorf("driver panicked: %v", r)
		}
	}()
	if ex, ok := conn.(sqldriver.ExecerContext); ok {
		_, err := ex.ExecContext(ctx, query, args)
		if !errors.Is(err, sqldriver.ErrSkip) {
			return err
		}
	}
	pc, ok := conn.(sqldriver.ConnPrepareContext)
	if !ok {
		return errors.New("driver connection supports neither ExecerContext nor ConnPrepareContext")
	}
	stmt, err := pc.PrepareContext(ctx, query)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := stmt.Close(); err == nil {
			err = cerr
		}
	}()
	return stmtExec(ctx, stmt, args)
}
