package admin_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/admin"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/relay"
)

func ev(agg string, n int, payload string) outbox.Event {
	return outbox.Event{ID: fmt.Sprintf("%s-%d", agg, n), AggregateType: "acct", AggregateID: agg, Type: "acct.changed",
		Payload: []byte(payload), ContentType: "text/plain", Headers: map[string]string{"trace": xssAttr}}
}

// TestNewValidates: New refuses what it cannot serve safely.
func TestNewValidates(t *testing.T) {
	t.Parallel()
	e := testdb.New(t, testdb.Target{Name: "sqlite", Dialect: driver.SQLite}, driver.Config{})
	ok := admin.Config{Outbox: e.Outbox, DB: e.RelayDB, Token: token}
	for _, c := range []struct {
		name string
		mod  func(*admin.Config)
	}{
		{"no outbox", func(c *admin.Config) { c.Outbox = nil }},
		{"no db", func(c *admin.Config) { c.DB = nil }},
		{"short token", func(c *admin.Config) { c.Token = "short" }},
		{"prefix without slash", func(c *admin.Config) { c.Prefix = "admin" }},
		{"prefix with a quote", func(c *admin.Config) { c.Prefix = `/a"/` }},
		{"page too large", func(c *admin.Config) { c.PageSize = admin.MaxPageSize + 1 }},
		{"bad inbox table", func(c *admin.Config) { c.InboxTables = []string{"no such; table"} }},
		{"relay endpoint without a scheme", func(c *admin.Config) { c.RelayEndpoints = []string{"relay-1:9464"} }},
	} {
		cfg := ok
		c.mod(&cfg)
		if _, err := admin.New(cfg); err == nil || !strings.Contains(err.Error(), "invalid config") {
			t.Errorf("%s: New = %v, want ErrInvalidConfig", c.name, err)
		}
	}
	if _, err := admin.New(ok); err != nil {
		t.Fatalf("valid config: %v", err)
	}
}

// TestAuthentication: every page needs a session; a mutation needs the
// session, its CSRF token and a same-origin request. Each refused
// mutation leaves the dead letter as it was and is audited.
func TestAuthentication(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		s := newSite(t, tg, nil)
		s.failing("A-1")
		s.emit(t, ev("A", 1, "one"))
		s.waitDead(t, "A-1")
		id := strconv.FormatInt(s.id(t, "A-1"), 10)

		anon := s.client(t)
		for _, p := range []string{"/", "/partitions", "/dead", "/dead/" + id, "/lookup?message_id=A-1", "/inbox"} {
			if code, _, hdr := anon.do("GET", p, nil, nil); code != http.StatusSeeOther || hdr.Get("Location") != "/login" {
				t.Errorf("GET %s without a session: %d to %q, want 303 to /login", p, code, hdr.Get("Location"))
			}
		}
		if code, _, _ := anon.do("GET", "/?fragment=1", nil, nil); code != http.StatusUnauthorized {
			t.Errorf("fragment without a session: %d, want 401", code)
		}
		if _, body, _ := anon.do("GET", "/login?msg=The+token+was+rotated", nil, nil); strings.Contains(body, "rotated") {
			t.Errorf("a link puts its own text on the login page")
		}
		if code, _, hdr := anon.do("POST", "/login", url.Values{"name": {"mallory"}, "token": {"wrong-token-0123456789"}}, nil); code != http.StatusUnauthorized || hdr.Get("Set-Cookie") != "" {
			t.Errorf("wrong token: %d, cookie %q", code, hdr.Get("Set-Cookie"))
		}
		apply := url.Values{"action": {"retry"}, "id": {id}}
		if code, _, _ := anon.post("/dead/apply", apply); code != http.StatusForbidden {
			t.Errorf("mutation without a session: %d, want 403", code)
		}

		c := s.client(t)
		csrf := c.login()
		if code, _, _ := c.post("/dead/apply", apply); code != http.StatusForbidden {
			t.Errorf("mutation without the CSRF token: %d, want 403", code)
		}
		bad := url.Values{"action": {"retry"}, "id": {id}, "csrf": {csrf + "x"}}
		if code, _, _ := c.post("/dead/apply", bad); code != http.StatusForbidden {
			t.Errorf("mutation with a wrong CSRF token: %d, want 403", code)
		}
		good := url.Values{"action": {"retry"}, "id": {id}, "csrf": {csrf}}
		for name, hdr := range map[string]map[string]string{
			"cross-site Sec-Fetch-Site": {"Sec-Fetch-Site": "cross-site", "Origin": c.base},
			"foreign Origin":            {"Origin": "https://evil.example"},
		} {
			if code, _, _ := c.do("POST", "/dead/apply", good, hdr); code != http.StatusForbidden {
				t.Errorf("%s: %d, want 403", name, code)
			}
		}
		if st, held := s.status(t, "A-1"); st != 2 || !held {
			t.Fatalf("after the refused mutations A-1 is status %d held %v, want dead and held", st, held)
		}
		if got := s.audit.String(); strings.Count(got, "admin request refused") < 5 || !strings.Contains(got, "admin login refused") {
			t.Errorf("audit log lacks the refusals:\n%s", got)
		}
		_, _, hdr := c.do("GET", "/", nil, nil)
		if csp := hdr.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-inline") {
			t.Errorf("Content-Security-Policy %q", csp)
		}

		// The same request with everything right goes through.
		s.heal()
		if code, body, _ := c.post("/dead/apply", good); code != http.StatusSeeOther {
			t.Fatalf("mutation: %d %s", code, body)
		}
		testdb.Eventually(t, s.ctx, "A-1 sent", func() bool { st, _ := s.status(t, "A-1"); return st == 1 })
		if got := s.audit.String(); !strings.Contains(got, `"who":"alice"`) || !strings.Contains(got, `"action":"dead retry"`) || !strings.Contains(got, `"changed":1`) {
			t.Errorf("audit log lacks the mutation:\n%s", got)
		}

		// Logged out: the cookie no longer works.
		if code, _, _ := c.post("/logout", url.Values{"csrf": {csrf}}); code != http.StatusSeeOther {
			t.Errorf("logout: %d", code)
		}
		if code, _, _ := c.do("GET", "/", nil, nil); code != http.StatusSeeOther {
			t.Errorf("GET / after logout: %d, want 303", code)
		}
	})
}

// TestReadOnly: no mutation form is shown and every mutation is refused.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	s := newSite(t, testdb.Target{Name: "sqlite", Dialect: driver.SQLite}, func(c *admin.Config) { c.ReadOnly = true; c.HidePayloads = true })
	s.failing("A-1")
	s.emit(t, ev("A", 1, "secret payload"))
	s.waitDead(t, "A-1")
	id := strconv.FormatInt(s.id(t, "A-1"), 10)
	c := s.client(t)
	csrf := c.login()
	if body := c.get("/dead"); strings.Contains(body, "retry-selected") {
		t.Error("read-only dead letter page shows the retry button")
	}
	body := c.get("/dead/" + id)
	if strings.Contains(body, "retry-one") || strings.Contains(body, "secret payload") || !strings.Contains(body, "not shown") {
		t.Errorf("read-only detail with hidden payloads:\n%s", body)
	}
	for _, p := range []string{"/dead/confirm", "/dead/apply"} {
		if code, _, _ := c.post(p, url.Values{"action": {"retry"}, "id": {id}, "csrf": {csrf}}); code != http.StatusForbidden {
			t.Errorf("POST %s read-only: %d, want 403", p, code)
		}
	}
	if st, _ := s.status(t, "A-1"); st != 2 {
		t.Errorf("A-1 status %d after read-only refusals, want 2", st)
	}
}

// TestEscaping: the XSS payloads in a payload, an aggregate ID, a header
// and an error text show as text on every page.
func TestEscaping(t *testing.T) {
	t.Parallel()
	forEach(t, func(t *testing.T, tg testdb.Target) {
		s := newSite(t, tg, nil)
		e := outbox.Event{ID: "X-1", AggregateType: "acct", AggregateID: xssAttr, Type: "acct.changed",
			Payload: []byte(`{"note":"` + strings.ReplaceAll(xssScript, "/", `\/`) + `","html":"<b>bold</b>"}`), Headers: map[string]string{"h": xssScript}}
		e2 := outbox.Event{ID: "X-2", AggregateType: "acct", AggregateID: "plain", Type: "acct.changed", ContentType: "text/html", Payload: []byte(xssScript + xssAttr)}
		s.failing("X-1", "X-2")
		s.emit(t, e, e2)
		s.waitDead(t, "X-1", "X-2")
		c := s.client(t)
		c.login()
		pages := map[string]string{
			"list":     c.get("/dead"),
			"detail 1": c.get("/dead/" + strconv.FormatInt(s.id(t, "X-1"), 10)),
			"detail 2": c.get("/dead/" + strconv.FormatInt(s.id(t, "X-2"), 10)),
			"lookup":   c.get("/lookup?message_id=X-1"),
			"filter":   c.get("/dead?error=" + url.QueryEscape(xssScript) + "&aggregate_id=" + url.QueryEscape(xssAttr)),
		}
		for name, body := range pages {
			for _, raw := range []string{"<script>alert", "<img src=x", "<b>bold"} {
				if strings.Contains(body, raw) {
					t.Errorf("%s page holds %q unescaped", name, raw)
				}
			}
		}
		for name, want := range map[string]string{
			"list":     "&#34;&gt;&lt;img src=x onerror=alert(2)&gt;",
			"detail 1": "&lt;script&gt;alert(1)&lt;/script&gt;",
			"detail 2": "&lt;script&gt;alert(1)&lt;/script&gt;&#34;&gt;&lt;img src=x onerror=alert(2)&gt;",
			"filter":   "&lt;script&gt;alert(1)&lt;/script&gt;",
		} {
			if !strings.Contains(pages[name], want) {
				t.Errorf("%s page lacks the escaped text %q", name, want)
			}
		}
		if !strings.Contains(pages["filter"], "X-1") {
			t.Errorf("filtering by the error text and the aggregate ID did not find X-1")
		}
	})
}

// TestRelayEndpoints: the overview shows each configured relay's broker
// (its metrics' label) and its /readyz verdict, escaped, and an endpoint
// that does not answer as unreachable.
func TestRelayEndpoints(t *testing.T) {
	t.Parallel()
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			if u, p, ok := r.BasicAuth(); !ok || u != "ops" || p != "s3cret-pw" {
				http.Error(w, "no credentials", http.StatusUnauthorized)
				return
			}
			http.Error(w, "not ready: relay unhealthy: "+xssScript, http.StatusServiceUnavailable)
		case "/metrics":
			fmt.Fprint(w, "# HELP outbox_relay_up 1 while relaying\n# TYPE outbox_relay_up gauge\noutbox_relay_up{broker=\"nats\"} 0\n")
		default:
			http.NotFound(w, r)
		}
	}))
	defer fake.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	// A password in an endpoint's URL is sent (basic authentication),
	// never shown: the page shows the URL redacted.
	withPassword := strings.Replace(fake.URL, "http://", "http://ops:s3cret-pw@", 1)
	redacted := strings.Replace(fake.URL, "http://", "http://ops:xxxxx@", 1)
	s := newSite(t, testdb.Target{Name: "sqlite", Dialect: driver.SQLite}, func(c *admin.Config) {
		c.RelayEndpoints = []string{withPassword + "/", dead.URL, strings.Replace(dead.URL, "http://", "http://ops:s3cret-pw@", 1)}
	})
	c := s.client(t)
	c.login()
	body := c.get("/")
	if strings.Contains(body, "s3cret-pw") {
		t.Errorf("the overview shows an endpoint's password:\n%s", body)
	}
	for _, want := range []string{
		"<td>" + redacted + "</td><td>nats</td>",
		"not ready: relay unhealthy: &lt;script&gt;alert(1)&lt;/script&gt;",
		"<td>" + dead.URL + "</td><td></td><td><span class=\"bad\">unreachable: ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %q", want)
		}
	}
}

// TestOutdatedSchemaRefused: below the latest schema version (the dead
// letters' index missing) the page reads nothing and says what to run;
// after Migrate it serves.
func TestOutdatedSchemaRefused(t *testing.T) {
	t.Parallel()
	for _, tg := range []testdb.Target{{Name: "pgx", Dialect: driver.Postgres}, {Name: "sqlite", Dialect: driver.SQLite}} {
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			s := newSite(t, tg, nil)
			latest, err := driver.LatestSchemaVersion(tg.Dialect)
			if err != nil {
				t.Fatal(err)
			}
			drop := "DROP INDEX " + s.e.Table + "_dead_held_idx" // the latest migration's index
			if tg.Dialect == driver.SQLite {
				drop = "DROP INDEX outbox_message_dead_idx"
			}
			for _, q := range []string{drop, "DELETE FROM " + s.e.Table + "_migrations WHERE version = " + strconv.Itoa(latest)} {
				if _, err := s.e.RelayDB.ExecContext(s.ctx, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			c := s.client(t)
			if code, _, _ := c.do("POST", "/login", url.Values{"name": {"alice"}, "token": {token}}, nil); code != http.StatusSeeOther {
				t.Fatalf("login: %d", code)
			}
			for _, p := range []string{"/", "/dead", "/partitions"} {
				if code, body, _ := c.do("GET", p, nil, nil); code != http.StatusServiceUnavailable || !strings.Contains(body, "outbox migrate apply") {
					t.Errorf("GET %s below the latest schema: %d %q", p, code, body)
				}
			}
			if err := s.e.Outbox.Migrate(s.ctx, s.e.RelayDB); err != nil {
				t.Fatal(err)
			}
			c.get("/dead")
		})
	}
}

// TestHostsAndThrottling: with AllowedHosts, a request naming another
// host (a DNS-rebinding page) gets 421; after 10 wrong tokens from one
// address its logins get 429 for a minute, even with the right token,
// and the audit log records the throttling once.
func TestHostsAndThrottling(t *testing.T) {
	t.Parallel()
	s := newSite(t, testdb.Target{Name: "sqlite", Dialect: driver.SQLite}, func(c *admin.Config) {
		c.AllowedHosts = []string{"127.0.0.1", "localhost"}
		c.CookieName = "outbox_admin_test"
	})
	c := s.client(t)
	if code, _, _ := c.do("GET", "/login", nil, map[string]string{"Host": "rebound.example:8090"}); code != http.StatusMisdirectedRequest {
		t.Errorf("foreign Host: %d, want 421", code)
	}
	if code, _, hdr := c.do("POST", "/login", url.Values{"name": {"alice"}, "token": {token}}, nil); code != http.StatusSeeOther || !strings.HasPrefix(hdr.Get("Set-Cookie"), "outbox_admin_test=") {
		t.Fatalf("login: %d, cookie %q", code, hdr.Get("Set-Cookie"))
	}
	for i := 0; i < 10; i++ {
		if code, _, _ := c.do("POST", "/login", url.Values{"name": {"mallory"}, "token": {"wrong-token-0123456789"}}, nil); code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d, want 401", i, code)
		}
	}
	for i := 0; i < 3; i++ {
		if code, _, _ := c.do("POST", "/login", url.Values{"name": {"alice"}, "token": {token}}, nil); code != http.StatusTooManyRequests {
			t.Errorf("login after 10 failures: %d, want 429", code)
		}
	}
	if n := strings.Count(s.audit.String(), "admin logins throttled"); n != 1 {
		t.Errorf("the throttling is audited %d times, want once:\n%s", n, s.audit.String())
	}
}

// TestOriginScheme: the same-origin check compares the scheme too: an
// https page at the page's host and port is another origin, refused on a
// plain-HTTP page; https is accepted over TLS, from a trusted proxy that
// says so (X-Forwarded-Proto) and with SecureCookie (a TLS-terminating
// proxy declared in front).
func TestOriginScheme(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		mod    func(*admin.Config)
		scheme string
		hdr    map[string]string
		want   int
	}{
		{"http origin on http", nil, "http", nil, http.StatusSeeOther},
		{"https origin on http", nil, "https", nil, http.StatusForbidden},
		{"https origin, X-Forwarded-Proto from an untrusted peer", nil, "https", map[string]string{"X-Forwarded-Proto": "https"}, http.StatusForbidden},
		{"https origin, X-Forwarded-Proto from a trusted proxy", func(c *admin.Config) { c.TrustedProxies = []string{"127.0.0.0/8", "::1"} }, "https",
			map[string]string{"X-Forwarded-Proto": "https"}, http.StatusSeeOther},
		{"http origin, trusted proxy says https", func(c *admin.Config) { c.TrustedProxies = []string{"127.0.0.1"} }, "http",
			map[string]string{"X-Forwarded-Proto": "https"}, http.StatusForbidden},
		{"https origin with SecureCookie", func(c *admin.Config) { c.SecureCookie = true }, "https", nil, http.StatusSeeOther},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newSite(t, testdb.Target{Name: "sqlite", Dialect: driver.SQLite}, c.mod)
			cl := s.client(t)
			hdr := map[string]string{"Origin": c.scheme + "://" + strings.TrimPrefix(s.srv.URL, "http://")}
			for k, v := range c.hdr {
				hdr[k] = v
			}
			if code, body, _ := cl.do("POST", "/login", url.Values{"name": {"alice"}, "token": {token}}, hdr); code != c.want {
				t.Errorf("login with Origin %s: %d %s, want %d", hdr["Origin"], code, body, c.want)
			}
		})
	}
}

// TestTrustedProxies: behind a trusted proxy the login throttle counts
// per client (X-Forwarded-For's right-most untrusted address), so ten
// wrong tokens from one client do not lock out another, and the audit
// log names the client; from an untrusted peer the header is ignored.
func TestTrustedProxies(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name         string
		trusted      []string
		otherBlocked bool
	}{
		{"no trusted proxy: one throttle for all", nil, true},
		{"trusted proxy: a throttle per client", []string{"127.0.0.1/32", "10.0.0.0/8"}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := newSite(t, testdb.Target{Name: "sqlite", Dialect: driver.SQLite}, func(cfg *admin.Config) { cfg.TrustedProxies = c.trusted })
			cl := s.client(t)
			// The attacker forges a left-most entry; the proxies
			// (10.0.0.7 and the peer) append the address they saw.
			attacker := map[string]string{"X-Forwarded-For": "192.0.2.99, 198.51.100.7, 10.0.0.7"}
			for i := 0; i < 10; i++ {
				if code, _, _ := cl.do("POST", "/login", url.Values{"name": {"mallory"}, "token": {"wrong-token-0123456789"}}, attacker); code != http.StatusUnauthorized {
					t.Fatalf("wrong token %d: %d, want 401", i, code)
				}
			}
			if code, _, _ := cl.do("POST", "/login", url.Values{"name": {"mallory"}, "token": {token}}, attacker); code != http.StatusTooManyRequests {
				t.Errorf("the attacker after 10 failures: %d, want 429", code)
			}
			want := http.StatusSeeOther
			if c.otherBlocked {
				want = http.StatusTooManyRequests
			}
			other := map[string]string{"X-Forwarded-For": "203.0.113.5"}
			if code, _, _ := s.client(t).do("POST", "/login", url.Values{"name": {"alice"}, "token": {token}}, other); code != want {
				t.Errorf("another operator's login: %d, want %d", code, want)
			}
			if audit := s.audit.String(); c.trusted != nil && (!strings.Contains(audit, `"remote":"198.51.100.7"`) || strings.Contains(audit, "192.0.2.99")) {
				t.Errorf("audit log does not name the client 198.51.100.7 (or believes the forged entry):\n%s", audit)
			}
		})
	}
	e := testdb.New(t, testdb.Target{Name: "sqlite", Dialect: driver.SQLite}, driver.Config{})
	if _, err := admin.New(admin.Config{Outbox: e.Outbox, DB: e.RelayDB, Token: token, TrustedProxies: []string{"10.0.0.0/33"}}); !errors.Is(err, admin.ErrInvalidConfig) {
		t.Errorf("a bad trusted proxy: New = %v, want ErrInvalidConfig", err)
	}
}

// TestExpiredRelayMarked: the overview marks a relay heartbeat row that
// expired (a killed relay's) as expired, with how long ago, and says
// that relays delete it.
func TestExpiredRelayMarked(t *testing.T) {
	t.Parallel()
	s := newSite(t, testdb.Target{Name: "sqlite", Dialect: driver.SQLite}, nil)
	// Expired 30 s ago: within 10 lease TTLs (100 s), so the test's
	// relay does not prune it.
	if _, err := s.e.RelayDB.ExecContext(s.ctx, "INSERT INTO "+s.e.Table+"_relay (instance_id, expires_at, mode) VALUES ('killed-relay', CAST(unixepoch('subsec') * 1000 AS INTEGER) - 30000, 'at-least-once')"); err != nil {
		t.Fatal(err)
	}
	c := s.client(t)
	c.login()
	body := c.get("/")
	re := regexp.MustCompile(`<td>killed-relay</td><td>at-least-once</td><td><span class="bad">expired</span> [0-9hms]+ ago: killed, or lost the database; a live relay deletes the row after 10 lease TTLs</td>`)
	if !re.MatchString(body) {
		t.Errorf("overview does not mark killed-relay expired:\n%s", body)
	}
}

// TestOverviewShowsTheWALSlot: on PostgreSQL the overview shows the WAL
// source's slot and publication when they exist (here made by the test,
// with no reader: the page says the slot keeps WAL), and no WAL section
// when neither exists.
func TestOverviewShowsTheWALSlot(t *testing.T) {
	t.Parallel()
	tg := testdb.Target{Name: "pgx", Dialect: driver.Postgres}
	slot := strings.ToLower(testdb.RandomName("outbox_test_"))
	wal := relay.WALConfig{Slot: slot, Publication: slot + "_pub"}
	s := newSite(t, tg, func(c *admin.Config) { c.WAL = wal })
	testdb.RequireLogicalWAL(t, s.e.RelayDB)
	c := s.client(t)
	c.login()
	if body := c.get("/"); strings.Contains(body, `id="wal"`) || strings.Contains(body, "wal-error") {
		t.Fatalf("a WAL section without a slot or a publication:\n%s", body)
	}
	t.Cleanup(func() {
		_, _ = s.e.RelayDB.Exec("SELECT pg_drop_replication_slot($1)", slot)
		_, _ = s.e.RelayDB.Exec("DROP PUBLICATION IF EXISTS " + wal.Publication)
	})
	if _, err := s.e.RelayDB.ExecContext(s.ctx, "CREATE PUBLICATION "+wal.Publication+" FOR TABLE "+s.e.Table+" WITH (publish = 'insert')"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.e.RelayDB.ExecContext(s.ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot); err != nil {
		t.Fatal(err)
	}
	body := c.get("/")
	for _, want := range []string{`<table id="wal">`, "<td>" + slot + "</td>", "none: the slot keeps WAL until a relay reads it", "<td>reserved</td>", "<td>" + wal.Publication + "</td>"} {
		if !strings.Contains(body, want) {
			t.Errorf("overview lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, `id="wal-loss"`) {
		t.Errorf("a loss window shown with none recorded:\n%s", body)
	}
	// A loss window of the log-only mode, as a relay records it.
	if _, err := relay.CreateWAL(s.ctx, s.e.Outbox, s.e.RelayDB, wal); err != nil {
		t.Fatal(err)
	}
	if _, err := s.e.RelayDB.ExecContext(s.ctx, "UPDATE "+s.e.Table+"_wal_log SET loss_from = '0/10', loss_to = '0/20', loss_at = now(), loss_reason = 'missing (dropped)' WHERE slot_name = $1", slot); err != nil {
		t.Fatal(err)
	}
	body = c.get("/")
	if !strings.Contains(body, `id="wal-loss"`) || !strings.Contains(body, "between 0/10 and 0/20") || !strings.Contains(body, "outbox wal ack-loss") {
		t.Errorf("overview does not show the loss window:\n%s", body)
	}
}
