package admin_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/sqloutbox/outbox/admin"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestPendingDeadLetterFlow: an event whose route does not exist stays
// pending (no attempts); the lookup page offers to dead-letter it, the
// confirmation lists the exact rows, and the apply acts on those rows
// only, if still pending: the dead letter then holds its aggregate (or,
// with skip, releases it), and a retry delivers it before what it held.
// Every apply is audited.
func TestPendingDeadLetterFlow(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		s := newSite(t, tg, nil)
		s.unroutable("P-1", "Q-1")
		s.emit(t, ev("P", 1, "p1"), ev("P", 2, "p2"), ev("Q", 1, "q1"), ev("Q", 2, "q2"), ev("R", 1, "r1"))
		testdb.Eventually(t, s.ctx, "P-1 and Q-1 refused, R-1 sent", func() bool {
			st, _ := s.status(t, "R-1")
			return s.refused.Load() >= 2 && st == 1
		})
		c := s.client(t)
		csrf := c.login()
		p1 := strconv.FormatInt(s.id(t, "P-1"), 10)
		r1 := strconv.FormatInt(s.id(t, "R-1"), 10)

		body := c.get("/lookup?message_id=P-1")
		if !strings.Contains(body, `name="id" value="`+p1+`"`) || !strings.Contains(body, `id="pending-dead"`) {
			t.Fatalf("lookup of pending P-1 offers no dead-lettering:\n%s", body)
		}
		if body := c.get("/lookup?message_id=R-1"); strings.Contains(body, `id="pending-dead"`) {
			t.Errorf("lookup of sent R-1 offers dead-lettering")
		}

		// Confirm P-1 and the sent R-1: only P-1 is listed.
		_, body, _ = c.post("/pending/confirm", url.Values{"csrf": {csrf}, "action": {"dead"}, "id": {p1, r1}})
		if ids := confirmIDs(t, body); fmt.Sprint(ids) != fmt.Sprint([]string{p1}) || !strings.Contains(body, "dead-letter 1 pending event") {
			t.Fatalf("confirmation lists %v:\n%s", ids, body)
		}
		// Apply with both ids (a forged form): the sent row stays sent.
		code, _, hdr := c.post("/pending/apply", url.Values{"csrf": {csrf}, "action": {"dead"}, "id": {p1, r1}})
		if flash := c.follow(hdr); code != http.StatusSeeOther || !strings.Contains(flash, "Dead-lettered 1 of the 2") {
			t.Fatalf("apply: %d, flash %q", code, flash)
		}
		if st, held := s.status(t, "P-1"); st != 2 || !held {
			t.Errorf("P-1: status %d held %v, want dead and holding", st, held)
		}
		if st, _ := s.status(t, "R-1"); st != 1 {
			t.Errorf("sent R-1 has status %d after the apply, want sent", st)
		}
		if a := s.audit.String(); !strings.Contains(a, `"action":"pending dead"`) || !strings.Contains(a, `"confirmed":2,"changed":1`) {
			t.Errorf("audit log lacks the apply:\n%s", a)
		}

		// By aggregate, skip: the confirmation lists; Q-2 is
		// published before the operator confirms, so only Q-1 changes.
		_, body, _ = c.post("/pending/confirm", url.Values{"csrf": {csrf}, "action": {"skip"}, "aggregate_type": {"acct"}, "aggregate_id": {"Q"}})
		ids := confirmIDs(t, body)
		if len(ids) != 2 || !strings.Contains(body, "release their aggregates") {
			t.Fatalf("confirmation of Q lists %v:\n%s", ids, body)
		}
		if _, err := s.e.RelayDB.ExecContext(s.ctx, "DELETE FROM "+s.e.Table+"_pending WHERE id = "+s.e.Placeholder(1), s.id(t, "Q-2")); err != nil {
			t.Fatal(err) // what a relay's mark-sent does
		}
		_, _, hdr = c.post("/pending/apply", url.Values{"csrf": {csrf}, "action": {"skip"}, "id": ids})
		if flash := c.follow(hdr); !strings.Contains(flash, "Dead-lettered 1 of the 2") || !strings.Contains(flash, "left alone") {
			t.Errorf("apply after Q-2 was sent: flash %q", flash)
		}
		if st, held := s.status(t, "Q-1"); st != 2 || held {
			t.Errorf("Q-1: status %d held %v, want dead and released", st, held)
		}
		if st, _ := s.status(t, "Q-2"); st != 1 {
			t.Errorf("Q-2, sent after the confirmation, has status %d", st)
		}

		// P-1 holds P-2; once the route exists, a retry delivers both in order.
		s.heal()
		dead := c.get("/dead")
		if !strings.Contains(dead, ">P-1<") || !strings.Contains(dead, "admin page") {
			t.Errorf("dead letters page lacks P-1 with its reason")
		}
		if got := delivered(s, "P"); len(got) != 0 {
			t.Fatalf("held aggregate P delivered %v", got)
		}
		_, body, _ = c.post("/dead/confirm", url.Values{"csrf": {csrf}, "action": {"retry"}, "id": {p1}})
		c.post("/dead/apply", url.Values{"csrf": {csrf}, "action": {"retry"}, "id": confirmIDs(t, body)})
		s.r.Notify()
		testdb.Eventually(t, s.ctx, "P delivered", func() bool { return len(delivered(s, "P")) == 2 })
		if got := fmt.Sprint(delivered(s, "P")); got != "[P-1 P-2]" {
			t.Errorf("P delivered as %s", got)
		}

		// Bad requests.
		for _, f := range []url.Values{
			{"action": {"retry"}, "id": {p1}},
			{"action": {"dead"}, "aggregate_type": {"acct"}},
		} {
			f.Set("csrf", csrf)
			if code, _, _ := c.post("/pending/confirm", f); code != http.StatusBadRequest {
				t.Errorf("confirm %v: %d, want 400", f, code)
			}
		}
		if code, _, _ := c.post("/pending/apply", url.Values{"csrf": {csrf}, "action": {"dead"}}); code != http.StatusBadRequest {
			t.Errorf("apply without ids: %d, want 400", code)
		}
		if code, _, _ := c.post("/pending/apply", url.Values{"csrf": {"wrong"}, "action": {"dead"}, "id": {p1}}); code != http.StatusForbidden {
			t.Errorf("apply with a wrong CSRF token: %d, want 403", code)
		}
	})
}

// TestPendingReadOnly: in read-only mode the lookup page offers no
// dead-lettering and both endpoints refuse.
func TestPendingReadOnly(t *testing.T) {
	t.Parallel()
	s := newSite(t, testdb.Target{Name: "sqlite", Dialect: driver.SQLite}, func(c *admin.Config) { c.ReadOnly = true })
	s.unroutable("A-1")
	s.emit(t, ev("A", 1, "a1"))
	testdb.Eventually(t, s.ctx, "A-1 refused", func() bool { return s.refused.Load() >= 1 })
	id := strconv.FormatInt(s.id(t, "A-1"), 10)
	c := s.client(t)
	csrf := c.login()
	if body := c.get("/lookup?message_id=A-1"); strings.Contains(body, "pending-dead") || strings.Contains(body, `name="id"`) {
		t.Error("read-only lookup offers dead-lettering")
	}
	for _, p := range []string{"/pending/confirm", "/pending/apply"} {
		if code, _, _ := c.post(p, url.Values{"action": {"dead"}, "id": {id}, "csrf": {csrf}}); code != http.StatusForbidden {
			t.Errorf("POST %s read-only: %d, want 403", p, code)
		}
	}
	if st, _ := s.status(t, "A-1"); st != 0 {
		t.Errorf("A-1 status %d after read-only refusals, want pending", st)
	}
}
