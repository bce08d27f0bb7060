package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
)

// advertised is a listener that reports another address, so that kfake
// advertises a proxy in front of it: every client connection, also those
// opened after the bootstrap's metadata, goes through the proxy.
type advertised struct {
	net.Listener
	addr net.Addr
}

func (a advertised) Addr() net.Addr { return a.addr }

// startProxiedBroker starts kfake behind a faultproxy and returns the
// bootstrap address (the proxy's) and the proxy.
func startProxiedBroker(t *testing.T) (string, *faultproxy.Proxy) {
	t.Helper()
	var proxy *faultproxy.Proxy
	listen := func(network, _ string) (net.Listener, error) {
		ln, err := net.Listen(network, "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		if proxy, err = faultproxy.Start(ln.Addr().String()); err != nil {
			ln.Close()
			return nil, err
		}
		pa, err := net.ResolveTCPAddr("tcp", proxy.Addr())
		if err != nil {
			ln.Close()
			return nil, err
		}
		return advertised{Listener: ln, addr: pa}, nil
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.ListenFn(listen), kfake.SeedTopics(4, "outbox.event.order"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); proxy.Close() })
	return proxy.Addr(), proxy
}

// metric returns the value line of name in /metrics ("" if absent).
func (r *runningRelay) metric(name string) string {
	_, body := get(r.ctx, r.base+"/metrics")
	m := regexp.MustCompile(`(?m)^` + name + `\{[^}]*\} (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return ""
	}
	return m[1]
}

// TestRelayHealthBrokerOutage: with the broker cut off (a proxy between
// relay and broker refusing connections) /readyz turns 503 after the
// --unhealthy-after grace and within a bound, outbox_relay_up goes to 0,
// /livez stays 200 throughout; once the broker is back /readyz is 200
// again, outbox_relay_up 1, and the event emitted during the outage is
// delivered. Every duration in the relay's JSON log is a duration string,
// and no password appears in it.
func TestRelayHealthBrokerOutage(t *testing.T) {
	t.Parallel()
	tg := serverTarget(t, driver.Postgres)
	secret := withPassword(t, &tg)
	table := randomTable()
	tg.migrate(t, table)
	bootstrap, proxy := startProxiedBroker(t)
	consumer, err := kafkatest.NewConsumer([]string{bootstrap}, []string{"outbox.event.order"})
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()

	const grace = time.Second
	r := startRelay(t, nil, "--dsn", tg.dsn, "--table", table, "relay", "--brokers", bootstrap,
		"--http", freeAddr(t), "--lease-ttl", "2s", "--unhealthy-after", grace.String(), "--progress", "200ms")
	r.waitFor(t, "/readyz 200", func() bool { return r.status("/readyz") == http.StatusOK })
	if v := r.metric("outbox_relay_up"); v != "1" {
		t.Errorf("outbox_relay_up %q while ready", v)
	}
	db, _ := tg.wrappedDB(t, table)
	before := emit(t, db, "before")
	if _, err := consumer.WaitForCount(r.ctx, 1); err != nil {
		t.Fatalf("%v (first record %v)", err, before)
	}

	cut := time.Now()
	proxy.Refuse(true)
	during := emit(t, db, "during")
	r.waitFor(t, "/readyz 503", func() bool {
		if code := r.status("/livez"); code != http.StatusOK {
			t.Fatalf("/livez %d while the broker is down", code)
		}
		return r.status("/readyz") == http.StatusServiceUnavailable
	})
	took := time.Since(cut)
	// The bound: the grace, plus one health interval (2 s) for the first
	// failed check and one to see the verdict, plus the check's own
	// timeout (5 s) should the refusal not be seen at once.
	if bound := grace + 2*2*time.Second + 5*time.Second; took < grace || took > bound {
		t.Errorf("/readyz turned 503 after %v; want between %v and %v", took, grace, bound)
	}
	t.Logf("not ready %v after the broker was cut (grace %v)", took.Round(time.Millisecond), grace)
	_, body := get(r.ctx, r.base+"/readyz")
	// Whichever failed first: the broker check, or the cycle publishing
	// the event emitted during the outage.
	if !strings.Contains(body, "the broker failing") && !strings.Contains(body, "relay cycles failing") {
		t.Errorf("/readyz body does not say what fails: %q", body)
	}
	r.waitFor(t, "outbox_relay_up 0", func() bool { return r.metric("outbox_relay_up") == "0" })
	if code := r.status("/livez"); code != http.StatusOK {
		t.Errorf("/livez %d while the broker is down", code)
	}
	if code := r.status("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz %d while the broker is down", code)
	}

	back := time.Now()
	proxy.Refuse(false)
	r.waitFor(t, "/readyz 200 again", func() bool { return r.status("/readyz") == http.StatusOK })
	t.Logf("ready again %v after the broker came back", time.Since(back).Round(time.Millisecond))
	r.waitFor(t, "outbox_relay_up 1 again", func() bool { return r.metric("outbox_relay_up") == "1" })
	recs, err := consumer.Wait(r.ctx, func(recs []kafkatest.Record) bool {
		for _, rec := range recs {
			if rec.Headers["outbox-message-id"] == during[0] {
				return true
			}
		}
		return false
	})
	if err != nil {
		t.Fatalf("the event emitted during the outage was not delivered: %v (%d records); stderr:\n%s", err, len(recs), r.stderr.String())
	}
	if code := r.shutdown(t); code != 0 {
		t.Errorf("exit %d; stderr:\n%s", code, r.stderr.String())
	}

	logs := r.stderr.String()
	if secret != "" && strings.Contains(logs, secret) {
		t.Errorf("the DSN's password is in the logs")
	}
	for _, want := range []string{`"msg":"relay not ready"`, `"msg":"relay ready again"`, `"msg":"relay progress"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s:\n%s", want, logs)
		}
	}
	if n := checkLogDurations(t, logs); n < 5 {
		t.Errorf("only %d duration attributes in the log:\n%s", n, logs)
	}
}

// durationKeys are the log attributes, of the relay and the command,
// that hold a duration.
var durationKeys = []string{"retry_in", "poll_interval", "lease_ttl", "interval", "oldest_pending_age",
	"drain_timeout", "retention", "timeout", "unhealthy_after", "stall_timeout", "retry_initial", "retry_max"}

// checkLogDurations fails t for a duration attribute of a JSON log that
// is not a string in time.Duration.String's form, and for any value that
// looks like integer nanoseconds under a duration-like key; it returns
// how many duration attributes it saw.
func checkLogDurations(t *testing.T, logs string) (seen int) {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		for k, v := range m {
			known := false
			for _, dk := range durationKeys {
				known = known || k == dk
			}
			if !known && !strings.HasSuffix(k, "_in") && !strings.HasSuffix(k, "_timeout") && !strings.HasSuffix(k, "_interval") && !strings.HasSuffix(k, "_age") {
				continue
			}
			seen++
			s, ok := v.(string)
			d, err := time.ParseDuration(s)
			if !ok || err != nil || d.String() != s {
				t.Errorf("log attribute %q = %v (%T) is not a duration string; line: %s", k, v, v, sc.Text())
			}
		}
	}
	return seen
}

// TestRelayDurationsAsText: the command's handler turns any duration a
// library logs as a time.Duration into its string form.
func TestRelayDurationsAsText(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	log := newJSONLog(&b, nil)
	log.Info("x", "retry_in", 80681412*time.Nanosecond, "poll_interval", time.Second)
	if got := b.String(); !strings.Contains(got, `"retry_in":"80.681412ms"`) || !strings.Contains(got, `"poll_interval":"1s"`) {
		t.Errorf("log: %s", got)
	}
	if n := checkLogDurations(t, b.String()); n != 2 {
		t.Errorf("saw %d durations", n)
	}
}

// TestRelayBusyHTTPPort: a second relay on a port in use fails at once
// with an error that names --http and says what to do.
func TestRelayBusyHTTPPort(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	r := expect(t, cli(t, "--dsn", tg.dsn, "relay", "--brokers", freeAddr(t), "--http", ln.Addr().String()), exitRuntime)
	if !strings.Contains(r.stderr, "cannot serve HTTP on "+ln.Addr().String()) || !strings.Contains(r.stderr, "--http") ||
		!strings.Contains(r.stderr, "address already in use") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("busy port: %v", r)
	}
	if took := time.Since(start); took > 10*time.Second || ctx.Err() != nil {
		t.Errorf("took %v to report a busy port", took)
	}
}

// TestHTTPEndpoints: /livez and /healthz report liveness, /readyz
// readiness, each 503 with the reason.
func TestHTTPEndpoints(t *testing.T) {
	t.Parallel()
	var liveErr, readyErr error
	h := httpHandler(prometheus.NewRegistry(), func() error { return readyErr }, func() error { return liveErr })
	check := func(path string, want int, body string) {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != want || !strings.Contains(rec.Body.String(), body) {
			t.Errorf("%s: %d %q, want %d %q", path, rec.Code, rec.Body.String(), want, body)
		}
	}
	check("/livez", 200, "ok")
	check("/healthz", 200, "ok")
	check("/readyz", 200, "ready")
	readyErr = errTest("outbox: relay unhealthy: the broker failing for 3s")
	check("/readyz", 503, "not ready: relay unhealthy: the broker failing")
	check("/livez", 200, "ok")
	liveErr = errTest("outbox: relay loop stalled: one cycle has been running for 4m")
	check("/livez", 503, "not live: relay loop stalled")
	check("/healthz", 503, "not live")
}

type errTest string

func (e errTest) Error() string { return string(e) }

// TestRelayHealthDatabaseOutage: with the database cut off (a proxy
// between relay and PostgreSQL or MariaDB refusing connections) /readyz
// turns 503 after the grace and names the database, /livez stays 200,
// and both recover when the database is back; an event committed
// meanwhile is delivered.
func TestRelayHealthDatabaseOutage(t *testing.T) {
	t.Parallel()
	for _, d := range []driver.Dialect{driver.Postgres, driver.MySQL} {
		t.Run(string(d), func(t *testing.T) {
			t.Parallel()
			relayHealthDatabaseOutage(t, serverTarget(t, d))
		})
	}
}

// proxiedDSN returns tg's DSN with its server address replaced by addr,
// and the server address it had.
func proxiedDSN(t *testing.T, tg dbTarget, addr string) (dsn, server string) {
	t.Helper()
	if tg.dialect == driver.MySQL {
		cfg, err := mysql.ParseDSN(tg.dsn)
		if err != nil {
			t.Fatal(err)
		}
		server, cfg.Addr = cfg.Addr, addr
		return cfg.FormatDSN(), server
	}
	u, err := url.Parse(tg.dsn)
	if err != nil {
		t.Fatal(err)
	}
	server, u.Host = u.Host, addr
	return u.String(), server
}

func relayHealthDatabaseOutage(t *testing.T, tg dbTarget) {
	table := randomTable()
	tg.migrate(t, table)
	_, server := proxiedDSN(t, tg, "")
	proxy, err := faultproxy.Start(server)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	dsn, _ := proxiedDSN(t, tg, proxy.Addr())
	broker, err := kafkatest.Start(kafkatest.Topics(4, "outbox.event.order"))
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	consumer, err := kafkatest.NewConsumer(broker.Addrs(), []string{"outbox.event.order"})
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()

	const grace = time.Second
	r := startRelay(t, nil, "--dsn", dsn, "--table", table, "relay", "--brokers", strings.Join(broker.Addrs(), ","),
		"--http", freeAddr(t), "--lease-ttl", "2s", "--poll", "100ms", "--unhealthy-after", grace.String())
	r.waitFor(t, "/readyz 200", func() bool { return r.status("/readyz") == http.StatusOK })

	cut := time.Now()
	proxy.Refuse(true)
	r.waitFor(t, "/readyz 503", func() bool {
		if code := r.status("/livez"); code != http.StatusOK {
			t.Fatalf("/livez %d while the database is down", code)
		}
		return r.status("/readyz") == http.StatusServiceUnavailable
	})
	took := time.Since(cut)
	if took < grace || took > grace+2*2*time.Second+10*time.Second {
		t.Errorf("/readyz turned 503 after %v (grace %v)", took, grace)
	}
	t.Logf("not ready %v after the database was cut (grace %v)", took.Round(time.Millisecond), grace)
	_, body := get(r.ctx, r.base+"/readyz")
	if !strings.Contains(body, "the database failing") && !strings.Contains(body, "relay cycles failing") {
		t.Errorf("/readyz body does not say what fails: %q", body)
	}
	r.waitFor(t, "outbox_relay_up 0", func() bool { return r.metric("outbox_relay_up") == "0" })
	if code := r.status("/livez"); code != http.StatusOK {
		t.Errorf("/livez %d while the database is down", code)
	}

	db, _ := tg.wrappedDB(t, table) // the application reaches the database directly
	ids := emit(t, db, "during")
	back := time.Now()
	proxy.Refuse(false)
	r.waitFor(t, "/readyz 200 again", func() bool { return r.status("/readyz") == http.StatusOK })
	t.Logf("ready again %v after the database came back", time.Since(back).Round(time.Millisecond))
	if _, err := consumer.Wait(r.ctx, func(recs []kafkatest.Record) bool {
		for _, rec := range recs {
			if rec.Headers["outbox-message-id"] == ids[0] {
				return true
			}
		}
		return false
	}); err != nil {
		t.Fatalf("not delivered after the outage: %v; stderr:\n%s", err, r.stderr.String())
	}
	if code := r.shutdown(t); code != 0 {
		t.Errorf("exit %d; stderr:\n%s", code, r.stderr.String())
	}
}

// TestMySQLDriverLogIsJSON: what go-sql-driver/mysql logs itself (here:
// a server that hangs up during the handshake) reaches the relay's JSON
// log, not plain text on the process's stderr. REGRESSION: it went to
// os.Stderr as "[mysql] 2026/12/01 ... packets.go:58 unexpected EOF".
func TestMySQLDriverLogIsJSON(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close() // hang up before the handshake
		}
	}()
	var buf testdb.SyncBuffer
	routeMySQLLog(newJSONLog(&buf, func(s string) string { return s }))
	cfg := mysql.NewConfig() // after routeMySQLLog, as in runRelay: a config takes the logger when made
	cfg.Net, cfg.Addr, cfg.User = "tcp", ln.Addr().String(), "root"
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err == nil {
		t.Fatal("Ping succeeded against a server that hangs up")
	}
	out := buf.String()
	if !strings.Contains(out, `"component":"go-sql-driver/mysql"`) {
		t.Fatalf("the driver's log line is not in the relay's log: %q", out)
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("not a JSON line: %q", line)
		}
	}
}
