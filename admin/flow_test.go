package admin_test

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sqloutbox/outbox/admin"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay"
)

var hiddenIDs = regexp.MustCompile(`<input type="hidden" name="id" value="(\d+)">`)

func confirmIDs(t *testing.T, body string) []string {
	t.Helper()
	var out []string
	for _, m := range hiddenIDs.FindAllStringSubmatch(body, -1) {
		out = append(out, m[1])
	}
	return out
}

func delivered(s *site, agg string) []string {
	var out []string
	for _, m := range s.pub.Messages() {
		if m.AggregateID == agg {
			out = append(out, m.MessageID)
		}
	}
	return out
}

// TestDeadLetterFlow: the page shows dead letters and what they hold,
// retries an aggregate (delivered in order), and acts on exactly the rows
// its confirmation listed: a row that changed after the confirmation is
// left alone, and one that appeared after it is not touched.
func TestDeadLetterFlow(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		s := newSite(t, tg, func(c *admin.Config) { c.PageSize = 2 })
		s.failing("A-1", "B-1", "C-1")
		s.emit(t, ev("A", 1, "a1"), ev("A", 2, "a2"), ev("A", 3, "a3"), ev("B", 1, "b1"), ev("C", 1, "c1"))
		s.waitDead(t, "A-1", "B-1", "C-1")
		c := s.client(t)
		csrf := c.login()

		over := c.get("/")
		for _, want := range []string{`id="dead"><a href="/dead">3</a>`, "3 holding their aggregate", `id="pending">2<`, "memory", "ready"} {
			if !strings.Contains(over, want) {
				t.Errorf("overview lacks %q", want)
			}
		}
		if parts := c.get("/partitions"); !strings.Contains(parts, "stuck: a dead letter holds an aggregate") {
			t.Errorf("partitions page marks no partition stuck")
		}

		// A filter that does not parse lists nothing (select-all must not
		// reach every dead letter), and a filtered list does not refresh.
		if bad := c.get("/dead?older_than=10"); !strings.Contains(bad, "want a duration") || strings.Contains(bad, ">A-1<") || strings.Contains(bad, "data-refresh") {
			t.Errorf("an unparsable filter still lists rows or refreshes")
		}
		if body := c.get("/lookup?aggregate_type=acct"); !strings.Contains(body, "Give both") {
			t.Errorf("a lookup by aggregate type alone does not ask for the ID")
		}

		// Keyset pages of 2: A-1 and B-1, then C-1.
		first := c.get("/dead")
		if !strings.Contains(first, ">A-1<") || !strings.Contains(first, ">B-1<") || strings.Contains(first, ">C-1<") {
			t.Fatalf("first page of 2 is not A-1, B-1")
		}
		next := regexp.MustCompile(`href="/(dead\?[^"]+)" id="next"`).FindStringSubmatch(first)
		if next == nil {
			t.Fatal("no next page link")
		}
		if second := c.get("/" + strings.ReplaceAll(next[1], "&amp;", "&")); !strings.Contains(second, ">C-1<") || strings.Contains(second, ">A-1<") {
			t.Errorf("second page is not C-1")
		}

		// Retry aggregate A: the confirmation names A-1 only.
		_, body, _ := c.post("/dead/confirm", url.Values{"csrf": {csrf}, "action": {"retry"}, "aggregate_type": {"acct"}, "aggregate_id": {"A"}})
		ids := confirmIDs(t, body)
		if len(ids) != 1 || ids[0] != strconv.FormatInt(s.id(t, "A-1"), 10) || !strings.Contains(body, "retry 1 dead letter") {
			t.Fatalf("confirmation of A lists ids %v:\n%s", ids, body)
		}
		s.heal()
		code, _, hdr := c.post("/dead/apply", url.Values{"csrf": {csrf}, "action": {"retry"}, "id": ids})
		if flash := c.follow(hdr); code != http.StatusSeeOther || !strings.Contains(flash, "Retried 1 of the 1") {
			t.Fatalf("apply: %d, flash %q", code, flash)
		}
		if again := c.get("/dead"); strings.Contains(again, `id="flash"`) {
			t.Errorf("the flash message shows twice")
		}
		s.r.Notify()
		testdb.Eventually(t, s.ctx, "A delivered", func() bool { return len(delivered(s, "A")) == 3 })
		if got := fmt.Sprint(delivered(s, "A")); got != "[A-1 A-2 A-3]" {
			t.Errorf("A delivered as %s", got)
		}

		// Confirm skipping B's dead letters; before the operator
		// confirms, someone else releases B-1 and B-2 dies behind it.
		_, body, _ = c.post("/dead/confirm", url.Values{"csrf": {csrf}, "action": {"skip"}, "aggregate_type": {"acct"}, "aggregate_id": {"B"}})
		ids = confirmIDs(t, body)
		if len(ids) != 1 {
			t.Fatalf("confirmation of B lists %v", ids)
		}
		dl, err := relay.NewDeadLetters(s.e.Outbox, s.e.RelayDB)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := dl.Skip(s.ctx, relay.Selector{MessageID: "B-1"}); err != nil || n != 1 {
			t.Fatalf("Skip B-1 = %d, %v", n, err)
		}
		s.failing("B-2")
		s.emit(t, ev("B", 2, "b2"))
		s.waitDead(t, "B-2")
		_, _, hdr = c.post("/dead/apply", url.Values{"csrf": {csrf}, "action": {"skip"}, "id": ids})
		if flash := c.follow(hdr); !strings.Contains(flash, "Released 0 of the 1") {
			t.Errorf("apply after the change: flash %q", flash)
		}
		if st, held := s.status(t, "B-2"); st != 2 || !held {
			t.Errorf("B-2 (dead after the confirmation) is status %d held %v: the apply touched a row it never listed", st, held)
		}
		if !strings.Contains(s.audit.String(), `"confirmed":1,"changed":0`) {
			t.Errorf("audit log lacks the no-op apply:\n%s", s.audit.String())
		}

		// A selection of two: B-2 and C-1 by their checkboxes.
		sel := []string{strconv.FormatInt(s.id(t, "C-1"), 10), strconv.FormatInt(s.id(t, "B-2"), 10)} // in id order
		_, body, _ = c.post("/dead/confirm", url.Values{"csrf": {csrf}, "action": {"skip"}, "id": sel})
		if got := confirmIDs(t, body); fmt.Sprint(got) != fmt.Sprint(sel) || !strings.Contains(body, "skip 2 dead letter") {
			t.Fatalf("confirmation of the selection lists %v", got)
		}
		s.heal()
		c.post("/dead/apply", url.Values{"csrf": {csrf}, "action": {"skip"}, "id": sel})
		testdb.Eventually(t, s.ctx, "nothing held", func() bool {
			_, b2 := s.status(t, "B-2")
			_, c1 := s.status(t, "C-1")
			return !b2 && !c1
		})

		// Lookup by message ID, then by aggregate (which needs the index).
		if body := c.get("/lookup?message_id=A-2"); !strings.Contains(body, ">sent<") {
			t.Errorf("lookup of A-2 does not show it sent")
		}
		body = c.get("/lookup?aggregate_type=acct&aggregate_id=A")
		if tg.Dialect != driver.MySQL {
			if !strings.Contains(body, "CREATE INDEX") {
				t.Fatalf("lookup by aggregate without the index does not print the CREATE INDEX")
			}
			d, err := dialect.New(dialect.Name(tg.Dialect), s.e.Table)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.e.RelayDB.ExecContext(s.ctx, d.Query("admin_aggregate_index_ddl")); err != nil {
				t.Fatalf("the printed DDL fails: %v", err)
			}
			body = c.get("/lookup?aggregate_type=acct&aggregate_id=A")
		}
		rows := regexp.MustCompile(`<td>(A-\d)</td>`).FindAllStringSubmatch(body, -1)
		if len(rows) != 2 || rows[0][1] != "A-1" || rows[1][1] != "A-2" || !strings.Contains(body, `href="/lookup?after=`) {
			t.Errorf("lookup of aggregate A, pages of 2: %v", rows)
		}
	})
}
