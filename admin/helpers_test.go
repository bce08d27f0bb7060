package admin_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/admin"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest"
	"github.com/sqloutbox/outbox/relay"
)

const token = "test-token-0123456789abcdef"

// The XSS payloads the issue names, in every field a row can carry.
const (
	xssScript = `<script>alert(1)</script>`
	xssAttr   = `"><img src=x onerror=alert(2)>`
)

func forEach(t *testing.T, fn func(t *testing.T, tg testdb.Target)) {
	for _, tg := range testdb.All { // pq, pgx, mysql (MariaDB), sqlite
		t.Run(tg.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, tg)
		})
	}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// site is one test's outbox table, a relay whose publisher fails the
// events the test chooses (dead-lettered at the first failure), and the
// admin page served over HTTP.
type site struct {
	e     *testdb.Env
	pub   *outboxtest.Publisher
	r     *relay.Relay
	h     *admin.Handler
	srv   *httptest.Server
	audit *testdb.SyncBuffer
	ctx   context.Context

	mu      sync.Mutex
	fail    map[string]bool
	noRoute map[string]bool // refused as unroutable (ErrUnavailable): stays pending
	refused atomic.Int64    // publishes refused as unroutable
}

func newSite(t *testing.T, tg testdb.Target, mod func(*admin.Config)) *site {
	t.Helper()
	e := testdb.New(t, tg, driver.Config{})
	s := &site{e: e, pub: outboxtest.NewPublisher(), audit: &testdb.SyncBuffer{}, ctx: testCtx(t), fail: map[string]bool{}, noRoute: map[string]bool{}}
	s.pub.FailWith(func(m relay.Message) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.fail[m.MessageID] {
			return fmt.Errorf("%w: broker says %s", relay.ErrPermanent, xssScript)
		}
		if s.noRoute[m.MessageID] {
			s.refused.Add(1)
			return fmt.Errorf("%w: no stream binds subject fu.nowhere", relay.ErrUnavailable)
		}
		return nil
	})
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{Publisher: s.pub, MaxAttempts: 1,
		PollInterval: 20 * time.Millisecond, RetryInitial: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	s.r = r
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := r.Stop(ctx); err != nil {
			t.Errorf("stopping the relay: %v", err)
		}
		<-done
	})
	cfg := admin.Config{Outbox: e.Outbox, DB: e.RelayDB, Token: token, Logger: quiet,
		Audit: slog.New(slog.NewJSONHandler(s.audit, nil)), CacheFor: time.Millisecond,
		Relays: func() []admin.RelayStatus {
			return []admin.RelayStatus{{Instance: "test", Broker: "memory", Ready: r.Ready()}}
		}}
	if mod != nil {
		mod(&cfg)
	}
	if s.h, err = admin.New(cfg); err != nil {
		t.Fatal(err)
	}
	s.srv = httptest.NewServer(s.h)
	t.Cleanup(s.srv.Close)
	return s
}

// emit commits events through the wrapped driver.
func (s *site) emit(t *testing.T, evs ...outbox.Event) {
	t.Helper()
	ctx := outbox.NewContext(s.ctx)
	tx, err := s.e.DB.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	for _, ev := range evs {
		if err := outbox.Emit(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	s.r.Notify()
}

func (s *site) failing(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		s.fail[id] = true
	}
}

func (s *site) heal() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = map[string]bool{}
	s.noRoute = map[string]bool{}
}

// unroutable makes the publisher refuse ids as unroutable
// (ErrUnavailable): they count no attempt and stay pending.
func (s *site) unroutable(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		s.noRoute[id] = true
	}
}

// status reads a row's status (0 pending, 1 sent, 2 dead) and whether it
// holds its aggregate.
func (s *site) status(t *testing.T, messageID string) (int, bool) {
	t.Helper()
	var st int
	var held bool
	q := "SELECT CASE WHEN status = 2 THEN 2 WHEN " + s.e.IsPending() + " THEN 0 ELSE 1 END, next_retry_at IS NOT NULL FROM " + s.e.Table +
		" WHERE message_id = " + s.e.Placeholder(1)
	if err := s.e.RelayDB.QueryRowContext(s.ctx, q, messageID).Scan(&st, &held); err != nil {
		t.Fatalf("status of %s: %v", messageID, err)
	}
	return st, held
}

func (s *site) id(t *testing.T, messageID string) int64 {
	t.Helper()
	var id int64
	if err := s.e.RelayDB.QueryRowContext(s.ctx, "SELECT id FROM "+s.e.Table+" WHERE message_id = "+s.e.Placeholder(1), messageID).Scan(&id); err != nil {
		t.Fatalf("id of %s: %v", messageID, err)
	}
	return id
}

func (s *site) waitDead(t *testing.T, ids ...string) {
	t.Helper()
	testdb.Eventually(t, s.ctx, fmt.Sprintf("%v dead", ids), func() bool {
		for _, id := range ids {
			var st int
			err := s.e.RelayDB.QueryRowContext(s.ctx, "SELECT status FROM "+s.e.Table+" WHERE message_id = "+s.e.Placeholder(1), id).Scan(&st)
			if err != nil || st != 2 {
				return false
			}
		}
		return true
	})
}

// browserless is an HTTP client with a cookie jar: what a browser sends,
// without the browser (the chromedp test drives the real one).
type browserless struct {
	t    *testing.T
	base string
	c    *http.Client
}

func (s *site) client(t *testing.T) *browserless {
	jar, _ := cookiejar.New(nil)
	return &browserless{t: t, base: s.srv.URL, c: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (b *browserless) do(method, path string, form url.Values, hdr map[string]string) (int, string, http.Header) {
	b.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	res, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	if err != nil {
		b.t.Fatal(err)
	}
	return res.StatusCode, string(out), res.Header
}

func (b *browserless) get(path string) string {
	b.t.Helper()
	code, body, _ := b.do("GET", path, nil, nil)
	if code != http.StatusOK {
		b.t.Fatalf("GET %s: %d %s", path, code, body)
	}
	return body
}

func (b *browserless) login() string {
	b.t.Helper()
	code, body, hdr := b.do("POST", "/login", url.Values{"name": {"alice"}, "token": {token}}, map[string]string{"Origin": b.base})
	if code != http.StatusSeeOther {
		b.t.Fatalf("login: %d %s", code, body)
	}
	if c := hdr.Get("Set-Cookie"); !strings.Contains(c, "HttpOnly") || !strings.Contains(c, "SameSite=Strict") {
		b.t.Fatalf("session cookie %q: want HttpOnly and SameSite=Strict", c)
	}
	return b.csrf()
}

var flashRE = regexp.MustCompile(`<p class="flash" id="flash">([^<]*)</p>`)

// follow GETs the redirect target in hdr and returns the page's flash
// message ("" if none).
func (b *browserless) follow(hdr http.Header) string {
	b.t.Helper()
	m := flashRE.FindStringSubmatch(b.get(hdr.Get("Location")))
	if m == nil {
		return ""
	}
	return m[1]
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func (b *browserless) csrf() string {
	b.t.Helper()
	m := csrfRE.FindStringSubmatch(b.get("/"))
	if m == nil {
		b.t.Fatal("no CSRF token on the overview")
	}
	return m[1]
}

// post sends a same-origin form, as the page's own forms do.
func (b *browserless) post(path string, form url.Values) (int, string, http.Header) {
	b.t.Helper()
	return b.do("POST", path, form, map[string]string{"Origin": b.base, "Sec-Fetch-Site": "same-origin"})
}
