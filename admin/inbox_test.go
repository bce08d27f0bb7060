package admin_test

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/sqloutbox/outbox/admin"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// inboxTableBeside names an inbox table in the outbox table's schema.
func inboxTableBeside(outboxTable string) string {
	if i := strings.LastIndex(outboxTable, "."); i >= 0 {
		return outboxTable[:i] + ".billing_inbox"
	}
	return "billing_inbox"
}

func msg(id, agg string) inbox.Message {
	return inbox.Message{ID: id, AggregateType: "acct", AggregateID: agg, Topic: "t", Payload: []byte(xssScript)}
}

// TestInboxPage: the Consumers page lists the consumers with parked and
// held messages, skips exactly the parked messages its confirmation
// listed (held ones wait for the runner), and records a retry request
// that shows pending until the consumer serves it, then applied.
func TestInboxPage(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		var table string
		s := newSite(t, tg, func(c *admin.Config) {
			table = inboxTableBeside(c.Outbox.Config().Table)
			c.InboxTables = []string{table}
		})
		in, err := inbox.New(inbox.Config{Dialect: tg.Dialect, Table: table, Consumer: "billing"})
		if err != nil {
			t.Fatal(err)
		}
		db := s.e.RelayDB
		if err := in.Migrate(s.ctx, db); err != nil {
			t.Fatal(err)
		}
		// Q-1 parked, Q-2 held behind it; R-1 parked.
		for _, m := range []inbox.Message{msg("Q-1", "Q"), msg("R-1", "R")} {
			if err := in.ParkAfter(s.ctx, db, m, errors.New("billing refuses "+xssAttr), 3); err != nil {
				t.Fatal(err)
			}
		}
		if out, err := in.Handle(s.ctx, db, msg("Q-2", "Q"), func(context.Context, *sql.Tx) error { return nil }); err != nil || out != inbox.Held {
			t.Fatalf("Q-2: %v, %v; want held", out, err)
		}
		cs, err := inbox.Consumers(s.ctx, db, inbox.Config{Dialect: tg.Dialect, Table: table})
		if err != nil || len(cs) != 1 || cs[0] != (inbox.ConsumerParked{Consumer: "billing", Parked: 2, Held: 1}) {
			t.Fatalf("Consumers = %+v, %v", cs, err)
		}

		c := s.client(t)
		csrf := c.login()
		if body := c.get("/inbox"); !strings.Contains(body, ">billing</a></td><td>2</td><td>1</td>") {
			t.Errorf("consumers table lacks billing with 2 parked and 1 held:\n%s", body)
		}
		page := "/inbox?" + url.Values{"table": {table}, "consumer": {"billing"}}.Encode()
		body := c.get(page)
		for _, want := range []string{">Q-1<", ">Q-2<", ">R-1<", "held", "&lt;script&gt;alert(1)&lt;/script&gt;", "billing refuses &#34;&gt;&lt;img"} {
			if !strings.Contains(body, want) {
				t.Errorf("consumer page lacks %q", want)
			}
		}

		// Skip aggregate Q: the confirmation lists Q-1 only.
		_, body, _ = c.post("/inbox/confirm", url.Values{"csrf": {csrf}, "action": {"skip"}, "table": {table}, "consumer": {"billing"},
			"aggregate_type": {"acct"}, "aggregate_id": {"Q"}})
		if !strings.Contains(body, `name="skip_id" value="Q-1"`) || strings.Contains(body, `name="skip_id" value="Q-2"`) || !strings.Contains(body, "1 held message(s) are not skipped") {
			t.Fatalf("skip confirmation:\n%s", body)
		}
		code, _, hdr := c.post("/inbox/apply", url.Values{"csrf": {csrf}, "action": {"skip"}, "table": {table}, "consumer": {"billing"},
			"aggregate_type": {"acct"}, "aggregate_id": {"Q"}, "skip_id": {"Q-1"}})
		if flash := c.follow(hdr); code != http.StatusSeeOther || !strings.Contains(flash, "Skipped 1 of the 1") {
			t.Fatalf("skip apply: %d, flash %q", code, flash)
		}
		left, err := in.ListParked(s.ctx, db, inbox.ParkedFilter{})
		if err != nil || len(left) != 2 || left[0].ID != "R-1" || left[0].Held || left[1].ID != "Q-2" || !left[1].Held {
			t.Fatalf("after skipping Q-1: %+v, %v; want Q-2 held and R-1 parked", left, err)
		}

		// A retry request for R: pending, then applied once served.
		c.post("/inbox/apply", url.Values{"csrf": {csrf}, "action": {"retry"}, "table": {table}, "consumer": {"billing"},
			"aggregate_type": {"acct"}, "aggregate_id": {"R"}})
		if body := c.get(page); !strings.Contains(body, "aggregate acct/R</td>") || !strings.Contains(body, "pending: the runner serves it") {
			t.Errorf("the request does not show pending")
		}
		var applied []string
		if _, err := in.ServeRequests(s.ctx, db, func(_ context.Context, _ *sql.Tx, m inbox.Message) error {
			applied = append(applied, m.ID)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if strings.Join(applied, ",") != "Q-2,R-1" {
			t.Errorf("served %v, want Q-2 (released by the skip) and R-1", applied)
		}
		if body := c.get(page); !strings.Contains(body, "applied (seen served at") {
			t.Errorf("the request does not show applied")
		}
		if !strings.Contains(s.audit.String(), `"action":"inbox skip"`) || !strings.Contains(s.audit.String(), `"message_ids":["Q-1"]`) {
			t.Errorf("audit log lacks the skip:\n%s", s.audit.String())
		}

		// A table the page was not given is refused.
		if code, _, _ := c.post("/inbox/confirm", url.Values{"csrf": {csrf}, "action": {"skip"}, "table": {"other"}, "consumer": {"billing"}, "message_id": {"R-1"}}); code != http.StatusBadRequest {
			t.Errorf("unknown inbox table: %d, want 400", code)
		}
	})
}

// TestInboxOnly: on a database with inbox tables and no outbox table (a
// consumer service's own), InboxOnly serves the Consumers page alone: the
// overview sends to it, the outbox pages are not served and not in the
// menu, and skipping a parked message works; without InboxOnly the page
// cannot serve that database.
func TestInboxOnly(t *testing.T) {
	t.Parallel()
	for _, tg := range []testdb.Target{{Name: "pgx", Dialect: driver.Postgres}, {Name: "sqlite", Dialect: driver.SQLite}} {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			ctx := testCtx(t)
			e := testdb.New(t, tg, driver.Config{})
			table := inboxTableBeside(e.Table)
			missing := strings.TrimSuffix(table, "billing_inbox") + "no_outbox_here"
			ob, err := driver.New(driver.Config{Dialect: tg.Dialect, Table: missing})
			if err != nil {
				t.Fatal(err)
			}
			in, err := inbox.New(inbox.Config{Dialect: tg.Dialect, Table: table, Consumer: "billing"})
			if err != nil {
				t.Fatal(err)
			}
			if err := in.Migrate(ctx, e.RelayDB); err != nil {
				t.Fatal(err)
			}
			if err := in.ParkAfter(ctx, e.RelayDB, msg("Q-1", "Q"), errors.New("billing refuses"), 3); err != nil {
				t.Fatal(err)
			}
			serve := func(inboxOnly bool) *browserless {
				h, err := admin.New(admin.Config{Outbox: ob, DB: e.RelayDB, Token: token, InboxTables: []string{table}, InboxOnly: inboxOnly})
				if err != nil {
					t.Fatal(err)
				}
				srv := httptest.NewServer(h)
				t.Cleanup(srv.Close)
				jar, _ := cookiejar.New(nil)
				return &browserless{t: t, base: srv.URL, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
			}
			c := serve(false)
			if code, _, _ := c.do("POST", "/login", url.Values{"name": {"alice"}, "token": {token}}, nil); code != http.StatusSeeOther {
				t.Fatalf("login: %d", code)
			}
			if code, _, _ := c.do("GET", "/inbox", nil, nil); code == http.StatusOK {
				t.Errorf("without InboxOnly, the consumers page of a database without an outbox table: %d", code)
			}

			c = serve(true)
			if code, _, _ := c.do("POST", "/login", url.Values{"name": {"alice"}, "token": {token}}, nil); code != http.StatusSeeOther {
				t.Fatalf("login: %d", code)
			}
			if code, _, hdr := c.do("GET", "/", nil, nil); code != http.StatusSeeOther || hdr.Get("Location") != "/inbox" {
				t.Errorf("GET /: %d to %q, want 303 to /inbox", code, hdr.Get("Location"))
			}
			for _, p := range []string{"/partitions", "/dead", "/lookup?message_id=x"} {
				if code, _, _ := c.do("GET", p, nil, nil); code != http.StatusNotFound {
					t.Errorf("GET %s: %d, want 404", p, code)
				}
			}
			body := c.get("/inbox?table=" + url.QueryEscape(table) + "&consumer=billing")
			if !strings.Contains(body, "Q-1") || strings.Contains(body, ">Dead letters<") || strings.Contains(body, ">Overview<") {
				t.Errorf("consumers page lacks Q-1 or shows the outbox pages:\n%s", body)
			}
			csrf := csrfRE.FindStringSubmatch(body)
			if csrf == nil {
				t.Fatal("no CSRF token")
			}
			code, _, hdr := c.post("/inbox/apply", url.Values{"csrf": {csrf[1]}, "action": {"skip"}, "table": {table}, "consumer": {"billing"},
				"aggregate_type": {"acct"}, "aggregate_id": {"Q"}, "skip_id": {"Q-1"}})
			if flash := c.follow(hdr); code != http.StatusSeeOther || !strings.Contains(flash, "Skipped 1 of the 1") {
				t.Fatalf("skip apply: %d, flash %q", code, flash)
			}
			parked, err := in.ListParked(ctx, e.RelayDB, inbox.ParkedFilter{Limit: 10})
			if err != nil || len(parked) != 0 {
				t.Errorf("after the skip: parked %+v, %v; want none", parked, err)
			}
		})
	}
}
