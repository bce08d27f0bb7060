package adminui

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/admin"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	inboxkafka "github.com/sqloutbox/outbox/inbox/kafka"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

const (
	token     = "browser-token-0123456789abcdef"
	topic     = "outbox.event.acct"
	xssScript = `<script>alert(1)</script>`
	xssAttr   = `"><img src=x onerror=alert(2)>`
)

// chromium is Debian's browser, which .ci/run installs.
const chromium = "/usr/bin/chromium"

// failingPublisher publishes through Kafka, except the messages the test
// makes fail: those fail permanently (dead-lettered at once), and later
// messages of their aggregate in the same batch are held back, as every
// publisher of this repository does.
type failingPublisher struct {
	inner   relay.Publisher
	mu      sync.Mutex
	fail    map[string]bool
	noRoute map[string]bool // refused as unroutable (ErrUnavailable): stays pending
	refused int
}

// unroutable makes the publisher refuse id as unroutable: it counts no
// attempt and stays pending, holding its aggregate.
func (p *failingPublisher) unroutable(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.noRoute[id] = true
}

func (p *failingPublisher) refusals() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

func (p *failingPublisher) set(id string, fail bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fail[id] = fail
}

func (p *failingPublisher) Publish(ctx context.Context, msgs []relay.Message) error {
	p.mu.Lock()
	errs := make(relay.PublishErrors, len(msgs))
	var pass []relay.Message
	var at []int
	held := map[string]bool{}
	for i, m := range msgs {
		key := m.AggregateType + "/" + m.AggregateID
		switch {
		case p.fail[m.MessageID]:
			errs[i], held[key] = fmt.Errorf("%w: the test refuses %s (%s)", relay.ErrPermanent, m.MessageID, xssScript), true
		case p.noRoute[m.MessageID]:
			errs[i], held[key] = fmt.Errorf("%w: no topic fu.nowhere", relay.ErrUnavailable), true
			p.refused++
		case held[key]:
			errs[i] = relay.ErrHeldBack
		default:
			pass, at = append(pass, m), append(at, i)
		}
	}
	p.mu.Unlock()
	if len(pass) > 0 {
		err := p.inner.Publish(ctx, pass)
		var pe relay.PublishErrors
		switch {
		case errors.As(err, &pe):
			for k, e := range pe {
				errs[at[k]] = e
			}
		case err != nil:
			for _, i := range at {
				errs[i] = err
			}
		}
	}
	for _, e := range errs {
		if e != nil {
			return errs
		}
	}
	return nil
}

// consumer is the inbox runner's handler: it fails the messages the test
// makes fail (parked at once) and records the rest in order.
type consumer struct {
	mu      sync.Mutex
	fail    map[string]bool
	applied []string
}

func (c *consumer) handle(_ context.Context, _ *sql.Tx, m inbox.Message) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fail[m.ID] {
		return fmt.Errorf("billing refuses %s: %s", m.ID, xssAttr)
	}
	c.applied = append(c.applied, m.ID)
	return nil
}

func (c *consumer) set(id string, fail bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fail[id] = fail
}

func (c *consumer) got(agg string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, id := range c.applied {
		if strings.HasPrefix(id, agg+"-") {
			out = append(out, id)
		}
	}
	return out
}

func ev(agg string, n int, payload string) outbox.Event {
	return outbox.Event{ID: fmt.Sprintf("%s-%d", agg, n), AggregateType: "acct", AggregateID: agg, Type: "acct.changed",
		ContentType: "text/plain", Payload: []byte(payload), Headers: map[string]string{"trace": xssAttr}}
}

// TestAdminInBrowser drives the admin page in headless Chromium: log in,
// read the overview, find a dead letter the test made, retry it and see
// the consumer receive it (before the event it held), see the overview
// update without a reload, skip an aggregate, request a retry of a
// consumer's parked message and see it applied; and check that the XSS
// payloads render as text, and that a mutation without the CSRF token,
// without a session, or from another origin is refused.
func TestAdminInBrowser(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(chromium); err != nil {
		if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
			t.Fatalf("%s required (OUTBOX_TEST_REQUIRE is set): %v; .ci/run installs Debian's chromium", chromium, err)
		}
		t.Skipf("SKIP: no %s (apt-get install chromium)", chromium)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))

	e := testdb.New(t, testdb.Target{Name: "pgx", Dialect: driver.Postgres}, driver.Config{})
	broker, err := kafkatest.Start(kafkatest.Topics(4, topic))
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	kpub, err := kafka.NewPublisher(kafka.Config{Brokers: broker.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	defer kpub.Close()
	pub := &failingPublisher{inner: kpub, fail: map[string]bool{}, noRoute: map[string]bool{}}
	r, err := relay.New(e.Outbox, e.RelayDB, relay.Config{Publisher: pub, MaxAttempts: 1, Logger: quiet,
		PollInterval: 50 * time.Millisecond, RetryInitial: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(context.Background()) }()
	defer func() {
		sctx, c := context.WithTimeout(context.Background(), 10*time.Second)
		defer c()
		_ = r.Stop(sctx)
		<-relayDone
	}()

	// The consumer: an inbox in the same database, fed by the runner.
	inboxTable := e.Schema + ".billing_inbox"
	cdb, err := sql.Open("pgx", e.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer cdb.Close()
	in, err := inbox.New(inbox.Config{Dialect: driver.Postgres, Table: inboxTable, Consumer: "billing", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Migrate(ctx, cdb); err != nil {
		t.Fatal(err)
	}
	cons := &consumer{fail: map[string]bool{}}
	runner, err := inboxkafka.NewRunner(inboxkafka.Config{Brokers: broker.Addrs(), Group: "billing", Topics: []string{topic},
		Inbox: in, DB: cdb, Handler: cons.handle, MaxAttempts: 1, RequestInterval: 200 * time.Millisecond, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRunner := context.WithCancel(ctx)
	runnerDone := make(chan error, 1)
	go func() { runnerDone <- runner.Run(rctx) }()
	defer func() { stopRunner(); <-runnerDone }()

	// The page, mounted under /ops/ as an application would.
	var audit testdb.SyncBuffer
	h, err := admin.New(admin.Config{Outbox: e.Outbox, DB: e.RelayDB, Token: token, Prefix: "/ops/", InboxTables: []string{inboxTable},
		Logger: quiet, CacheFor: 500 * time.Millisecond,
		Audit: slog.New(slog.NewJSONHandler(&audit, nil)),
		Relays: func() []admin.RelayStatus {
			return []admin.RelayStatus{{Instance: r.InstanceID(), Broker: "kafka", Ready: r.Ready()}}
		}})
	if err != nil {
		t.Fatal(err)
	}
	// A consumer service's own page: its database has inbox tables and
	// no outbox table (this schema has no table no_outbox).
	noOutbox, err := driver.New(driver.Config{Dialect: driver.Postgres, Table: e.Schema + ".no_outbox"})
	if err != nil {
		t.Fatal(err)
	}
	ih, err := admin.New(admin.Config{Outbox: noOutbox, DB: cdb, Token: token, Prefix: "/consumers/", InboxTables: []string{inboxTable},
		InboxOnly: true, CookieName: "outbox_admin_consumers", Logger: quiet, Audit: quiet})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/", h)
	mux.Handle("/consumers/", ih)
	site := httptest.NewServer(mux)
	defer site.Close()
	go func() { _ = h.Run(ctx, time.Second) }()

	// What the page will show: A-1 dead holding A-2; C-1 dead holding
	// C-2; X-1 dead with the XSS payloads; B-1 parked by the consumer.
	pub.set("A-1", true)
	pub.set("C-1", true)
	pub.set("X-1", true)
	cons.set("B-1", true)
	emit(t, ctx, e.DB, r, ev("A", 1, xssScript), ev("A", 2, "a2"), ev("C", 1, "c1"), ev("C", 2, "c2"), ev("B", 1, "b1"), ev("B", 2, "b2"))
	x := ev("X", 1, xssScript+xssAttr)
	x.AggregateID = xssAttr
	emit(t, ctx, e.DB, r, x)
	status := func(id string) (st int, held bool) {
		if err := e.RelayDB.QueryRowContext(ctx, "SELECT status, next_retry_at IS NOT NULL FROM "+e.Table+" WHERE message_id = $1", id).Scan(&st, &held); err != nil {
			t.Fatalf("status of %s: %v", id, err)
		}
		return st, held
	}
	testdb.Eventually(t, ctx, "A-1, C-1, X-1 dead and B-1 parked", func() bool {
		a, _ := status("A-1")
		c, _ := status("C-1")
		xs, _ := status("X-1")
		ps, err := in.ListParked(ctx, cdb, inbox.ParkedFilter{ID: "B-1"})
		return a == 2 && c == 2 && xs == 2 && err == nil && len(ps) == 1
	})
	rowID := func(id string) string {
		var n int64
		if err := e.RelayDB.QueryRowContext(ctx, "SELECT id FROM "+e.Table+" WHERE message_id = $1", id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return strconv.FormatInt(n, 10)
	}

	// Traffic beside the operator's work: a writer commits a few events
	// every 100 ms, as the application would.
	wctx, stopWriter := context.WithCancel(ctx)
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for i := 0; wctx.Err() == nil; i++ {
			cx := outbox.NewContext(wctx)
			if tx, err := e.DB.BeginTx(cx, nil); err == nil {
				for k := 0; k < 1+i%4; k++ {
					_ = outbox.Emit(cx, ev(fmt.Sprintf("W%d", i%50), i*10+k, "w"))
				}
				_ = tx.Commit()
			}
			select {
			case <-wctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	defer func() { stopWriter(); <-writerDone }()

	// The browser: Debian's Chromium, headless, with the flags this
	// machine's closed network needs.
	opts := append(slices.Clone(chromedp.DefaultExecAllocatorOptions[:]), chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	var dialogs atomic.Int32
	if err := chromedp.Listen(bctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialogs.Add(1) // an alert: an XSS payload ran
			go func() {
				_, _ = chromedp.Call(bctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
			}()
		}
	}); err != nil {
		t.Fatal(err)
	}
	do := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, cancel := context.WithTimeout(bctx, time.Minute)
		defer cancel()
		if err := chromedp.Do(sctx, actions...); err != nil {
			loc, _ := chromedp.Run(bctx, chromedp.Location())
			body, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
			t.Fatalf("%s: %v (at %s, showing:\n%s)", what, err, loc, body)
		}
	}
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return v
	}
	eval := func(js string) int {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[int](js, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		return v
	}
	shots := t.TempDir()
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		for _, dir := range []string{shots, os.Getenv("OUTBOX_SCREENSHOTS")} {
			if dir == "" {
				continue
			}
			if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	base := site.URL + "/ops/"
	postNoCSRF := fmt.Sprintf(`fetch("/ops/dead/apply", {method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "action=retry&id=%s"}).then(r => r.status)`, rowID("X-1"))
	const elements = `document.querySelectorAll("main img, main script").length`

	// Log in: the page sends an anonymous visitor to the login form.
	do("open", chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS("#login")))
	if loc, err := chromedp.Run(bctx, chromedp.Location()); err != nil || !strings.HasSuffix(loc, "/ops/login") {
		t.Errorf("anonymous visit went to %s (%v), want the login form", loc, err)
	}
	do("login", chromedp.SendKeys(chromedp.CSS(`input[name=name]`), "alice"), chromedp.SendKeys(chromedp.CSS(`input[name=token]`), token),
		chromedp.Click(chromedp.CSS("#login")), chromedp.WaitVisible(chromedp.CSS("#overview")))
	if dead := text("#dead"); dead != "3" {
		t.Errorf("overview shows %q dead letters, want 3", dead)
	}

	// The dead letters, with the XSS payloads rendered as text.
	do("dead letters", chromedp.Navigate(base+"dead"), chromedp.WaitVisible(chromedp.CSS("#deadform")))
	if list := text("#deadform"); !strings.Contains(list, xssAttr) || !strings.Contains(list, xssScript) {
		t.Errorf("dead letter list lacks the payloads as text:\n%s", list)
	}
	if n := eval(elements); n != 0 {
		t.Errorf("%d img or script elements in the dead letter list", n)
	}
	shot("admin-dead-letters.png")
	do("detail of X-1", chromedp.Navigate(base+"dead/"+rowID("X-1")), chromedp.WaitVisible(chromedp.CSS("#payload-text")))
	if p := text("#payload-text"); p != xssScript+xssAttr {
		t.Errorf("payload shown as %q", p)
	}
	if n := eval(elements); n != 0 {
		t.Errorf("%d img or script elements in the detail view", n)
	}

	// A mutation the browser sends with its session cookie but without
	// the CSRF token is refused.
	if code := eval(postNoCSRF); code != http.StatusForbidden {
		t.Errorf("POST without the CSRF token: %d, want 403", code)
	}
	// A form on another origin posting to the page: refused although the
	// browser holds the session (127.0.0.1 and localhost differ in origin).
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><form id="f" method="post" action="%sdead/apply"><input name="action" value="retry"><input name="id" value="%s"></form><script>document.getElementById("f").submit()</script>`, base, rowID("X-1"))
	}))
	defer attacker.Close()
	do("cross-site POST", chromedp.Navigate(strings.Replace(attacker.URL, "127.0.0.1", "localhost", 1)))
	var refused string
	testdb.Eventually(t, ctx, "the cross-site POST answered", func() bool {
		loc, _ := chromedp.Run(bctx, chromedp.Location())
		if !strings.HasSuffix(loc, "/ops/dead/apply") {
			return false
		}
		refused, _ = chromedp.Run(bctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
		return refused != ""
	})
	if !strings.Contains(refused, "forbidden") {
		t.Errorf("the cross-site POST answered %q, want forbidden", refused)
	}
	if st, held := status("X-1"); st != 2 || !held {
		t.Fatalf("after the refused POSTs X-1 is status %d held %v", st, held)
	}

	// Retry A-1 from its detail view: confirm, then the consumer gets
	// A-1 before A-2, which it held.
	pub.set("A-1", false)
	do("retry A-1", chromedp.Navigate(base+"dead/"+rowID("A-1")), chromedp.Click(chromedp.CSS("#retry-one")), chromedp.WaitVisible(chromedp.CSS("#confirm")))
	if c := text("#confirm-count"); !strings.Contains(c, "these 1 rows") {
		t.Errorf("confirmation says %q", c)
	}
	do("confirm", chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if f := text("#flash"); !strings.Contains(f, "Retried 1 of the 1") {
		t.Errorf("flash %q", f)
	}
	testdb.Eventually(t, ctx, "the consumer receives A-1 and A-2", func() bool { return len(cons.got("A")) == 2 })
	if got := cons.got("A"); got[0] != "A-1" || got[1] != "A-2" {
		t.Errorf("the consumer received A as %v", got)
	}

	// The overview refreshes itself: a new dead letter shows up without
	// a reload (the marker set on the loaded page survives).
	do("overview again", chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS("#overview")))
	eval(`window.notReloaded = 1`)
	pub.set("D-1", true)
	emit(t, ctx, e.DB, r, ev("D", 1, "d1"))
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`document.getElementById("dead").innerText === "3" && window.notReloaded === 1`,
		chromedp.WithPollingTimeout(60*time.Second))); err != nil {
		t.Errorf("the overview did not show the new dead letter without a reload: %v", err)
	}
	shot("admin-overview.png")

	// Skip aggregate C from C-1's detail view: C-2 goes on, C-1 stays dead.
	do("skip C", chromedp.Navigate(base+"dead/"+rowID("C-1")), chromedp.Click(chromedp.CSS("#skip-aggregate")), chromedp.WaitVisible(chromedp.CSS("#confirm")),
		chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if f := text("#flash"); !strings.Contains(f, "Released 1 of the 1") {
		t.Errorf("flash after the skip: %q", f)
	}
	testdb.Eventually(t, ctx, "the consumer receives C-2", func() bool { return slices.Equal(cons.got("C"), []string{"C-2"}) })
	if st, held := status("C-1"); st != 2 || held {
		t.Errorf("skipped C-1: status %d held %v, want dead and released", st, held)
	}

	// The consumer side: B-1 parked; a retry request that the runner
	// serves with its own handler, now healed.
	cons.set("B-1", false)
	do("consumers", chromedp.Navigate(base+"inbox?table="+inboxTable+"&consumer=billing"), chromedp.WaitVisible(chromedp.CSS("#parked")))
	if p := text("#parked"); !strings.Contains(p, "B-1") || !strings.Contains(p, "parked") || !strings.Contains(p, xssAttr) {
		t.Errorf("parked messages: %q", p)
	}
	do("request a retry", chromedp.Click(chromedp.CSS(`#parked button[value=retry]`)), chromedp.WaitVisible(chromedp.CSS("#confirm")),
		chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	testdb.Eventually(t, ctx, "the runner applies B-1 then B-2", func() bool { return slices.Equal(cons.got("B"), []string{"B-1", "B-2"}) })
	// The runner deletes the request after it applied the messages: the
	// page shows it applied once it no longer finds it.
	testdb.Eventually(t, ctx, "the request shows applied", func() bool {
		do("the consumer's page", chromedp.Navigate(base+"inbox?table="+inboxTable+"&consumer=billing"), chromedp.WaitVisible(chromedp.CSS("#requests")))
		return strings.Contains(text("#requests"), "applied")
	})

	// An event whose route does not exist stays pending: the lookup page
	// dead-letters it after a confirmation listing exactly that row.
	pub.unroutable("U-1")
	emit(t, ctx, e.DB, r, ev("U", 1, "u1"))
	testdb.Eventually(t, ctx, "U-1 refused as unroutable", func() bool { return pub.refusals() > 0 })
	do("look up U-1", chromedp.Navigate(base+"lookup?message_id=U-1"), chromedp.WaitVisible(chromedp.CSS("#pending-dead")),
		chromedp.Click(chromedp.CSS(`#lookup input[name=id]`)), chromedp.Click(chromedp.CSS("#pending-dead")), chromedp.WaitVisible(chromedp.CSS("#confirm")))
	if c := text("#confirm-count"); !strings.Contains(c, "these 1 pending events") {
		t.Errorf("pending confirmation says %q", c)
	}
	do("confirm the dead-lettering", chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if f := text("#flash"); !strings.Contains(f, "Dead-lettered 1 of the 1") {
		t.Errorf("flash after dead-lettering U-1: %q", f)
	}
	if st, held := status("U-1"); st != 2 || !held {
		t.Errorf("dead-lettered U-1: status %d held %v, want dead and holding", st, held)
	}

	// The consumer service's page: after the login, the consumers, and
	// only them in the menu.
	do("consumers only: login", chromedp.Navigate(site.URL+"/consumers/"), chromedp.WaitVisible(chromedp.CSS("#login")),
		chromedp.SendKeys(chromedp.CSS(`input[name=name]`), "bob"), chromedp.SendKeys(chromedp.CSS(`input[name=token]`), token),
		chromedp.Click(chromedp.CSS("#login")), chromedp.WaitVisible(chromedp.CSS("header nav")))
	if loc, err := chromedp.Run(bctx, chromedp.Location()); err != nil || !strings.HasSuffix(loc, "/consumers/inbox") {
		t.Errorf("the consumers-only page landed on %s (%v), want /consumers/inbox", loc, err)
	}
	if nav := text("header nav"); strings.TrimSpace(nav) != "Consumers" {
		t.Errorf("the consumers-only page's menu is %q, want Consumers only", nav)
	}
	if h1 := text("main"); !strings.Contains(h1, "Table "+inboxTable) {
		t.Errorf("the consumers-only page lacks the inbox table:\n%s", h1)
	}
	shot("admin-consumers-only.png")

	// Logged out, the browser's request is refused.
	do("log out", chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS("#overview")), chromedp.Click(chromedp.CSS(`header button`)),
		chromedp.WaitVisible(chromedp.CSS("#login")))
	if code := eval(postNoCSRF); code != http.StatusForbidden {
		t.Errorf("POST after logout: %d, want 403", code)
	}
	if n := dialogs.Load(); n != 0 {
		t.Errorf("%d JavaScript dialogs opened: an XSS payload ran", n)
	}
	log := audit.String()
	for _, want := range []string{`"action":"dead retry"`, `"action":"dead skip"`, `"action":"pending dead"`, `"action":"inbox retry"`, `"why":"cross-site request"`, `"why":"missing or wrong CSRF token"`, `"who":"alice"`} {
		if !strings.Contains(log, want) {
			t.Errorf("audit log lacks %s:\n%s", want, log)
		}
	}
	t.Logf("screenshots in %s", shots)
}

func emit(t *testing.T, ctx context.Context, db *sql.DB, r *relay.Relay, evs ...outbox.Event) {
	t.Helper()
	cx := outbox.NewContext(ctx)
	tx, err := db.BeginTx(cx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	for _, e := range evs {
		if err := outbox.Emit(cx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r.Notify()
}
