package consume_test

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/stdlib"

	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/inbox/internal/consume"
	"github.com/sqloutbox/outbox/inbox/internal/ledgertest"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// lyingConnector answers the first lies INSERTs that park a message
// (the inbox's insert_stored, which stores a cause) with
// context.DeadlineExceeded after the database executed them: what a
// client sees when its deadline runs out while the server commits.
type lyingConnector struct {
	dsn  string
	lies *atomic.Int32
}

func (c lyingConnector) Connect(context.Context) (sqldriver.Conn, error) {
	conn, err := stdlib.GetDefaultDriver().Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return lyingConn{conn, c.lies}, nil
}

func (c lyingConnector) Driver() sqldriver.Driver { return stdlib.GetDefaultDriver() }

type lyingConn struct {
	sqldriver.Conn
	lies *atomic.Int32
}

func (c lyingConn) ExecContext(ctx context.Context, q string, args []sqldriver.NamedValue) (sqldriver.Result, error) {
	res, err := c.Conn.(sqldriver.ExecerContext).ExecContext(ctx, q, args)
	if err == nil && strings.HasPrefix(strings.TrimSpace(q), "INSERT") && strings.Contains(q, "cause") && c.lies.Add(-1) >= 0 {
		return nil, context.DeadlineExceeded
	}
	return res, err
}

func (c lyingConn) QueryContext(ctx context.Context, q string, args []sqldriver.NamedValue) (sqldriver.Rows, error) {
	return c.Conn.(sqldriver.QueryerContext).QueryContext(ctx, q, args)
}

func (c lyingConn) BeginTx(ctx context.Context, opts sqldriver.TxOptions) (sqldriver.Tx, error) {
	return c.Conn.(sqldriver.ConnBeginTx).BeginTx(ctx, opts)
}

func (c lyingConn) CheckNamedValue(nv *sqldriver.NamedValue) error {
	if ch, ok := c.Conn.(sqldriver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return sqldriver.ErrSkip
}

// TestParkRetryCountsAttemptsOnce: a park whose commit went through while
// the client saw its deadline run out is retried; the retry must not park
// the message again, which would add its attempts a second time (a loaded
// CI run parked after 2 attempts recorded 4).
func TestParkRetryCountsAttemptsOnce(t *testing.T) {
	t.Parallel()
	c := ledgertest.NewDB(t, pgx)
	ctx := ledgertest.Context(t, 60*time.Second)
	var lies atomic.Int32
	lies.Store(1)
	db := sql.OpenDB(lyingConnector{dsn: c.Env.DSN, lies: &lies})
	t.Cleanup(func() { db.Close() })
	s := consume.Settings{Inbox: c.Inbox, DB: db, MaxAttempts: 2, Backoff: fastRetry, RequestInterval: -1, Logger: ledgertest.QuietLogger(),
		Handler: func(context.Context, *sql.Tx, inbox.Message) error { return errors.New("refused") }}.WithDefaults()
	e := consume.NewEngine(s, s.Logger, nil)
	p := e.NewPool(1, 8)
	t.Cleanup(p.Stop)
	acks := submit(t, p, msg("a", 1))
	testdb.Eventually(t, ctx, "the delivery acknowledged", func() bool { return acks.Load() == 1 })
	if lies.Load() >= 1 {
		t.Fatal("the park was never answered with the lie: the test tests nothing")
	}
	parked, err := c.Inbox.ListParked(ctx, c.DB, inbox.ParkedFilter{All: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(parked) != 1 || parked[0].Attempts != 2 {
		t.Fatalf("parked %+v, want a-1 once, after 2 attempts", parked)
	}
}
