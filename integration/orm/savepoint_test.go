package orm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/integration/containers"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

// TestMain starts PostgreSQL and MariaDB containers when no server answers
// and a Docker engine does (integration/containers).
func TestMain(m *testing.M) { os.Exit(containers.Main(m)) }

// txn is one level of an ORM's transaction: the outer transaction or a
// nested one (a savepoint).
type txn interface {
	// Insert writes a business row with the given id into the items table.
	Insert(ctx context.Context, id string) error
	// Nested runs fn in the ORM's nested transaction: a savepoint that is
	// rolled back to when fn returns an error and kept otherwise. fn's ctx
	// is the one the ORM hands out.
	Nested(ctx context.Context, fn func(ctx context.Context, tx txn) error) error
}

// orm runs fn in an outer transaction begun with ctx (which carries the
// emit scope), committed when fn returns nil.
type orm interface {
	Outer(ctx context.Context, fn func(ctx context.Context, tx txn) error) error
}

// node is one transaction level: it inserts a row and emits an event,
// both named name, runs its children (nested transactions) in order, emits
// and inserts name+"-after" if after is set, then fails (returns
// errRollback) or not. The outer transaction is the root node, named
// "outer"; when it fails the whole transaction rolls back.
type node struct {
	name     string
	fail     bool
	after    bool
	children []node
}

// errRollback is what a failing transaction level returns; the parent of a
// failing nested one carries on, as application code handling an inner
// failure does.
var errRollback = errors.New("inner failure")

type savepointCase struct {
	name string
	tree node // the outer transaction
	// want names the rows and events that must be committed and published.
	want []string
}

var savepointCases = []savepointCase{
	{
		name: "InnerFails",
		tree: node{name: "outer", children: []node{{name: "inner", fail: true}}},
		want: []string{"outer"},
	},
	{
		name: "InnerSucceeds",
		tree: node{name: "outer", children: []node{{name: "inner"}}},
		want: []string{"outer", "inner"},
	},
	{
		name: "MiddleFailsAfterInnermostSucceeded",
		tree: node{name: "outer", children: []node{{name: "middle", fail: true, children: []node{{name: "innermost"}}}}},
		want: []string{"outer"},
	},
	{
		name: "InnermostFailsMiddleSucceeds",
		tree: node{name: "outer", children: []node{{name: "middle", children: []node{{name: "innermost", fail: true}}}}},
		want: []string{"outer", "middle"},
	},
	{
		name: "FailedSiblingThenSucceededSibling",
		tree: node{name: "outer", children: []node{{name: "first", fail: true}, {name: "second"}}},
		want: []string{"outer", "second"},
	},
	{
		// Events emitted after a rollback to a savepoint, at the levels
		// around it, are kept.
		name: "EmitsAfterRollbackToSavepoint",
		tree: node{name: "outer", after: true, children: []node{{name: "middle", after: true, children: []node{{name: "innermost", fail: true}}}}},
		want: []string{"outer", "outer-after", "middle", "middle-after"},
	},
	{
		// A nested transaction that succeeded is rolled back with the
		// outer one.
		name: "OuterFailsAfterInnerSucceeded",
		tree: node{name: "outer", fail: true, children: []node{{name: "inner"}}},
		want: nil,
	},
}

// testSavepoints runs every savepoint case against one ORM on one target:
// open makes the ORM over e.DB, the wrapped *sql.DB.
func testSavepoints(t *testing.T, tg testdb.Target, open func(t *testing.T, e *testdb.Env, items string) orm) {
	e := testdb.New(t, tg, driver.Config{})
	items := e.Q("items")
	if _, err := e.RelayDB.Exec("CREATE TABLE " + items + " (id VARCHAR(100) PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	o := open(t, e, items)
	pub := outboxtest.NewPublisher()
	startRelay(t, e, pub)
	for _, c := range savepointCases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			agg := tg.Name + "-" + c.name // this case's aggregate and row-id prefix
			ids := map[string]string{}    // step name -> message ID
			step := func(ctx context.Context, tx txn, name string) error {
				if err := tx.Insert(ctx, agg+"/"+name); err != nil {
					return fmt.Errorf("insert %s: %w", name, err)
				}
				id, err := outbox.NewMessageID()
				if err != nil {
					return err
				}
				ids[name] = id
				return outbox.Emit(ctx, outbox.Event{
					ID: id, AggregateType: "orm", AggregateID: agg, Type: "orm." + name,
					Payload: []byte(`{"step":"` + name + `"}`),
				})
			}
			// body runs level n in tx: its row and event, its children, its
			// "-after" row and event, then its outcome.
			var body func(ctx context.Context, tx txn, n node) error
			body = func(ctx context.Context, tx txn, n node) error {
				if err := step(ctx, tx, n.name); err != nil {
					return err
				}
				for _, child := range n.children {
					err := tx.Nested(ctx, func(ctx context.Context, tx txn) error { return body(ctx, tx, child) })
					if err != nil && !(child.fail && errors.Is(err, errRollback)) {
						return err
					}
				}
				if n.after {
					if err := step(ctx, tx, n.name+"-after"); err != nil {
						return err
					}
				}
				if n.fail {
					return errRollback
				}
				return nil
			}
			err := o.Outer(outbox.NewContext(ctx), func(ctx context.Context, tx txn) error { return body(ctx, tx, c.tree) })
			if c.tree.fail && errors.Is(err, errRollback) {
				err = nil
			}
			if err != nil {
				t.Fatalf("outer transaction: %v", err)
			}

			var wantRows, wantIDs []string
			for _, name := range c.want {
				wantRows = append(wantRows, agg+"/"+name)
				wantIDs = append(wantIDs, ids[name])
			}
			slices.Sort(wantRows)
			slices.Sort(wantIDs)
			name := names(ids)

			// The business rows: the savepoints did what the ORM says.
			rows := column(t, e, "SELECT id FROM "+items+" WHERE id LIKE "+e.Placeholder(1), agg+"/%")
			if !slices.Equal(rows, wantRows) {
				t.Fatalf("business rows %v, want %v (the ORM's savepoints did not behave as expected)", rows, wantRows)
			}
			// The outbox table: what the relay publishes.
			inTable := column(t, e, "SELECT message_id FROM "+e.Table+" WHERE aggregate_id = "+e.Placeholder(1), agg)
			if !slices.Equal(inTable, wantIDs) {
				t.Errorf("outbox rows %v, want %v", name(inTable), name(wantIDs))
			}
			// Publication: wait until everything in the table was published
			// (ghosts included, so the wait ends either way), then compare.
			msgs, err := pub.WaitForIDs(ctx, inTable...)
			if err != nil {
				t.Fatal(err)
			}
			var published []string
			for _, m := range msgs {
				if m.AggregateID == agg && !slices.Contains(published, m.MessageID) {
					published = append(published, m.MessageID)
				}
			}
			slices.Sort(published)
			if !slices.Equal(published, wantIDs) {
				t.Errorf("published %v, want %v", name(published), name(wantIDs))
			}
		})
	}
}

// names returns a function that renders message IDs as the step names
// that emitted them.
func names(ids map[string]string) func([]string) []string {
	byID := map[string]string{}
	for n, id := range ids {
		byID[id] = n
	}
	return func(list []string) []string {
		out := make([]string, len(list))
		for i, id := range list {
			if n, ok := byID[id]; ok {
				out[i] = n
			} else {
				out[i] = id
			}
		}
		slices.Sort(out)
		return out
	}
}

// column returns the sorted, trimmed values of a one-column query on
// e.RelayDB (unwrapped, outside any transaction).
func column(t *testing.T, e *testdb.Env, q string, args ...any) []string {
	t.Helper()
	out := testdb.Column(t, context.Background(), e.RelayDB, q, args...)
	for i := range out {
		out[i] = strings.TrimSpace(out[i])
	}
	slices.Sort(out)
	return out
}

// startRelay runs a relay on e's table publishing to pub until cleanup.
func startRelay(t *testing.T, e *testdb.Env, pub relay.Publisher) {
	t.Helper()
	r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{
		Publisher: pub, PollInterval: 50 * time.Millisecond, Observer: outboxtest.WatchOrder(t, nil),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			t.Errorf("relay stop: %v", err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("relay run: %v", err)
			}
		case <-ctx.Done():
			t.Errorf("relay did not return")
		}
	})
}
