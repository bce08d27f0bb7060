package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
)

type parkedOut struct {
	Count  int          `json:"count"`
	Parked []parkedJSON `json:"parked"`
}

func parkedList(t *testing.T, args ...string) parkedOut {
	t.Helper()
	r := expect(t, cli(t, append(args, "--json")...), 0)
	var out parkedOut
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	return out
}

// TestInboxParked: `outbox inbox parked list|skip|retry` on a consumer's
// inbox with two parked messages, one held behind the first; the retry
// request is served by the consumer (inbox.ServeRequests).
func TestInboxParked(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg dbTarget) {
		table := randomTable()
		db := tg.plainDB(t)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		in, err := inbox.New(inbox.Config{Dialect: tg.dialect, Table: table, Consumer: "billing"})
		if err != nil {
			t.Fatal(err)
		}
		if err := in.Migrate(ctx, db); err != nil {
			t.Fatal(err)
		}
		if tg.dialect != driver.SQLite {
			t.Cleanup(func() {
				for _, s := range []string{"", "_migrations", "_requests"} {
					_, _ = db.Exec("DROP TABLE IF EXISTS " + table + s)
				}
			})
		}
		msg := func(id, agg string) inbox.Message {
			return inbox.Message{ID: id, AggregateType: "order", AggregateID: agg, Topic: "outbox.event.order", Payload: []byte(`{}`)}
		}
		if err := in.ParkAfter(ctx, db, msg("m1", "1"), errors.New("boom\nsecond line"), 5); err != nil {
			t.Fatal(err)
		}
		if out, err := in.Handle(ctx, db, msg("m2", "1"), func(context.Context, *sql.Tx) error { return nil }); err != nil || out != inbox.Held {
			t.Fatalf("Handle behind a parked message: %v, %v", out, err)
		}
		if err := in.Park(ctx, db, msg("m3", "2"), errors.New("bad")); err != nil {
			t.Fatal(err)
		}
		base := []string{"--dsn", tg.dsn, "inbox", "parked"}

		l := parkedList(t, append(base, "list", "--consumer", "billing", "--inbox-table", table)...)
		if l.Count != 3 || l.Parked[0].MessageID != "m1" || l.Parked[0].Attempts != 5 || l.Parked[0].Held || !l.Parked[1].Held || l.Parked[2].MessageID != "m3" {
			t.Fatalf("list: %+v", l)
		}
		if l := parkedList(t, append(base, "list", "--consumer", "other", "--inbox-table", table)...); l.Count != 0 {
			t.Fatalf("another consumer's list: %+v", l)
		}
		r := expect(t, cli(t, append(base, "list", "--consumer", "billing", "--inbox-table", table, "--aggregate", "order/1")...), 0)
		if !strings.Contains(r.stdout, "m1") || !strings.Contains(r.stdout, "held") || strings.Contains(r.stdout, "m3") || !strings.Contains(r.stdout, "boom second line") {
			t.Fatalf("list --aggregate:\n%s", r.stdout)
		}

		r = expect(t, cli(t, append(base, "skip", "--consumer", "billing", "--inbox-table", table, "--all", "--dry-run")...), 0)
		if !strings.Contains(r.stdout, "would change 2 parked") {
			t.Fatalf("skip --dry-run:\n%s", r.stdout)
		}
		expect(t, cli(t, append(base, "skip", "--consumer", "billing", "--inbox-table", table, "--id", "m3")...), 0)
		expect(t, cli(t, append(base, "skip", "--consumer", "billing", "--inbox-table", table, "--id", "m3")...), exitRuntime)
		if l := parkedList(t, append(base, "list", "--consumer", "billing", "--inbox-table", table)...); l.Count != 2 {
			t.Fatalf("after skipping m3: %+v", l)
		}
		if out, err := in.Handle(ctx, db, msg("m3", "2"), func(context.Context, *sql.Tx) error { return nil }); err != nil || out != inbox.Duplicate {
			t.Fatalf("a skipped message redelivered: %v, %v", out, err)
		}

		// retry: a request the consumer serves with its handler.
		r = expect(t, cli(t, append(base, "retry", "--consumer", "billing", "--inbox-table", table, "--aggregate", "order/1", "--json")...), 0)
		if !strings.Contains(r.stdout, `"count":1`) && !strings.Contains(r.stdout, `"count": 1`) {
			t.Fatalf("retry --json:\n%s", r.stdout)
		}
		expect(t, cli(t, append(base, "retry", "--consumer", "billing", "--inbox-table", table, "--id", "nope")...), exitRuntime)
		expect(t, cli(t, append(base, "retry", "--consumer", "billing", "--inbox-table", table)...), exitUsage)
		var ran []string
		n, err := in.ServeRequests(ctx, db, func(_ context.Context, _ *sql.Tx, m inbox.Message) error {
			ran = append(ran, m.ID)
			return nil
		})
		if err != nil || n != 2 || strings.Join(ran, ",") != "m1,m2" {
			t.Fatalf("the consumer serving the request: %d, %v, ran %v; want m1, m2", n, err, ran)
		}
		if l := parkedList(t, append(base, "list", "--consumer", "billing", "--inbox-table", table)...); l.Count != 0 {
			t.Fatalf("after the retry: %+v", l)
		}

		// Usage errors and a missing table.
		expect(t, cli(t, append(base, "skip", "--consumer", "billing", "--inbox-table", table)...), exitUsage)
		expect(t, cli(t, append(base, "list", "--inbox-table", table)...), exitUsage)
		expect(t, cli(t, append(base, "list", "--consumer", "billing", "--inbox-table", table, "--aggregate", "order")...), exitUsage)
		expect(t, cli(t, append(base, "list", "--consumer", "billing", "--inbox-table", "bad-name")...), exitUsage)
		expect(t, cli(t, append(base, "list", "--consumer", "billing", "--inbox-table", randomTable())...), exitRuntime)
	})
}
