package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
)

const testAdminToken = "admin-token-0123456789abcdef"

// TestAdminTokenRules: the page never starts without a token of at least
// 16 bytes, from a file or the environment (one of them); a busy port is
// a runtime error that names the address.
func TestAdminTokenRules(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	dir := t.TempDir()
	long, short := filepath.Join(dir, "long"), filepath.Join(dir, "short")
	if err := os.WriteFile(long, []byte(testAdminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(short, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, c := range []struct {
		name string
		args []string
		env  map[string]string
		code int
		want string
	}{
		{"no token", nil, nil, exitUsage, "needs a login token"},
		{"file and env", []string{"--token-file", long}, map[string]string{envAdminToken: testAdminToken}, exitUsage, "not both"},
		{"short file", []string{"--token-file", short}, nil, exitUsage, "at least 16"},
		{"short env", nil, map[string]string{envAdminToken: "short"}, exitUsage, "at least 16"},
		{"missing file", []string{"--token-file", filepath.Join(dir, "none")}, nil, exitRuntime, "no such file"},
		{"busy port", []string{"--token-file", long, "--listen", busy.Addr().String()}, nil, exitRuntime, "cannot serve the admin page on " + busy.Addr().String() + " (--listen)"},
		{"missing inbox table", []string{"--token-file", long, "--listen", "127.0.0.1:0", "--inbox-table", "no_such_inbox"}, nil, exitRuntime, "--inbox-table no_such_inbox"},
		{"listen without a port", []string{"--token-file", long, "--listen", "127.0.0.1"}, nil, exitUsage, "want host:port"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var out, errb testdb.SyncBuffer
			args := append([]string{"--dsn", tg.dsn, "admin"}, c.args...)
			code := runEnv(ctx, args, &out, &errb, func(k string) string { return c.env[k] })
			if code != c.code || !strings.Contains(errb.String(), c.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, errb.String(), c.code, c.want)
			}
		})
	}
}

// TestRelayAdminFlagsNeedListen: the relay's admin flags without
// --admin-listen are a usage error, not silently ignored.
func TestRelayAdminFlagsNeedListen(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	r := expect(t, cli(t, "--dsn", tg.dsn, "relay", "--brokers", freeAddr(t), "--http", "", "--admin-read-only"), exitUsage)
	if !strings.Contains(r.stderr, "--admin-read-only configures the admin page, which only --admin-listen serves") {
		t.Errorf("stderr: %s", r.stderr)
	}
}

// adminLogin logs in to the page at base and returns a client holding the
// session cookie.
func adminLogin(t *testing.T, ctx context.Context, base string) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	testdb.Eventually(t, ctx, "the admin page serves", func() bool {
		res, err := c.PostForm(base+"/login", url.Values{"name": {"ops"}, "token": {testAdminToken}})
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK && res.Request.URL.Path == "/"
	})
	return c
}

func getBody(t *testing.T, c *http.Client, u string) string {
	t.Helper()
	res, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", u, res.StatusCode, b)
	}
	return string(b)
}

// TestAdminCommand: `outbox admin` serves the page on loopback with the
// token from the environment, logs where without the DSN's password, and
// `outbox relay --admin-listen` mounts it beside the relay, showing the
// relay's broker and readiness.
func TestAdminCommand(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	env := func(k string) string {
		if k == envAdminToken {
			return testAdminToken
		}
		return ""
	}

	addr := freeAddr(t)
	r := startRelay(t, env, "--dsn", tg.dsn, "admin", "--listen", addr)
	c := adminLogin(t, r.ctx, "http://"+addr)
	if body := getBody(t, c, "http://"+addr+"/"); !strings.Contains(body, "Schema version") {
		t.Errorf("overview:\n%s", body)
	}
	if logs := r.stderr.String(); !strings.Contains(logs, `"msg":"serving the admin page"`) || !strings.Contains(logs, `"who":"ops"`) || strings.Contains(logs, testAdminToken) {
		t.Errorf("logs lack the start or the login, or hold the token:\n%s", logs)
	}

	broker, err := kafkatest.Start(kafkatest.Topics(4, "outbox.event.order"))
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	tg2 := sqliteTarget(t)
	tg2.migrate(t, "outbox_message")
	aaddr := freeAddr(t)
	rr := startRelay(t, env, "--dsn", tg2.dsn, "relay", "--brokers", strings.Join(broker.Addrs(), ","), "--http", freeAddr(t), "--admin-listen", aaddr)
	c2 := adminLogin(t, rr.ctx, "http://"+aaddr)
	testdb.Eventually(t, rr.ctx, "the overview shows the relay ready on kafka", func() bool {
		body := getBody(t, c2, "http://"+aaddr+"/")
		return strings.Contains(body, "<td>kafka</td>") && strings.Contains(body, `class="ok">ready`)
	})

	// `outbox admin --relay-endpoint` asks another process's relay.
	haddr, eaddr := freeAddr(t), freeAddr(t)
	rr2 := startRelay(t, env, "--dsn", tg2.dsn, "relay", "--brokers", strings.Join(broker.Addrs(), ","), "--http", haddr)
	startRelay(t, env, "--dsn", tg2.dsn, "admin", "--listen", eaddr, "--relay-endpoint", "http://"+haddr)
	c3 := adminLogin(t, rr2.ctx, "http://"+eaddr)
	testdb.Eventually(t, rr2.ctx, "the overview shows the other relay's endpoint ready on kafka", func() bool {
		body := getBody(t, c3, "http://"+eaddr+"/")
		return strings.Contains(body, "<td>http://"+haddr+"</td><td>kafka</td><td><span class=\"ok\">ready")
	})
}

// TestAdminListensOnLoopback: the page's own listener defaults to
// loopback, and the relay serves no page unless --admin-listen is given.
func TestAdminListensOnLoopback(t *testing.T) {
	t.Parallel()
	root := newRootCmd(io.Discard, io.Discard, func(string) string { return "" })
	for path, want := range map[string]string{"admin listen": "127.0.0.1:8090", "relay admin-listen": ""} {
		parts := strings.Fields(path)
		cmd, _, err := root.Find(parts[:1])
		if err != nil {
			t.Fatal(err)
		}
		if got := cmd.Flags().Lookup(parts[1]).DefValue; got != want {
			t.Errorf("%s defaults to %q, want %q", path, got, want)
		}
	}
}

// TestAdminAnswersItsListenAddress: on a loopback address other than
// 127.0.0.1 (--listen 127.0.0.2:P) the page answers to that address, and
// still refuses a foreign Host (421).
func TestAdminAnswersItsListenAddress(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatalf("127.0.0.2 is loopback on Linux: %v", err)
	}
	addr := ln.Addr().String()
	ln.Close()
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	env := func(k string) string {
		if k == envAdminToken {
			return testAdminToken
		}
		return ""
	}
	r := startRelay(t, env, "--dsn", tg.dsn, "admin", "--listen", addr)
	var code int
	testdb.Eventually(t, r.ctx, "the admin page answers", func() bool {
		code, _ = get(r.ctx, "http://"+addr+"/login")
		return code != 0
	})
	if code != http.StatusOK {
		t.Errorf("GET http://%s/login: %d, want 200", addr, code)
	}
	req, _ := http.NewRequestWithContext(r.ctx, http.MethodGet, "http://"+addr+"/login", nil)
	req.Host = "rebound.example"
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("foreign Host: %d, want 421", res.StatusCode)
	}
}

// TestAdminTrustedProxyFlag: `outbox admin --help` and `outbox relay
// --help` list the trusted-proxy flag with its text (golden lines), and
// the relay refuses it without --admin-listen.
func TestAdminTrustedProxyFlag(t *testing.T) {
	t.Parallel()
	const text = "address or CIDR prefix of a reverse proxy in front of the admin page, comma-separated or repeated: from it, the client's address is taken from X-Forwarded-For (login throttle, audit log) and the scheme from X-Forwarded-Proto"
	for cmd, want := range map[string]string{
		"admin": "      --trusted-proxy strings    " + text,
		"relay": "      --admin-trusted-proxy strings",
	} {
		r := expect(t, cli(t, cmd, "--help"), 0)
		if !strings.Contains(r.stdout, want) {
			t.Errorf("outbox %s --help lacks %q:\n%s", cmd, want, r.stdout)
		}
	}
	r := cli(t, "--dsn", "sqlite:///nonexistent.db", "relay", "--broker", "nats://127.0.0.1:1", "--admin-trusted-proxy", "10.0.0.1")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--admin-trusted-proxy configures the admin page") {
		t.Errorf("--admin-trusted-proxy without --admin-listen: %v", r)
	}
}

// TestAdminInboxOnly: `outbox admin --inbox-table` on a database with
// inbox tables and no outbox table serves the consumers page (help says
// so); without --inbox-table it still asks for the outbox table.
func TestAdminInboxOnly(t *testing.T) {
	t.Parallel()
	if r := expect(t, cli(t, "admin", "--help"), 0); !strings.Contains(r.stdout, "On a database with no outbox table (a consumer\nservice's own), --inbox-table serves the consumers page alone.") {
		t.Errorf("help lacks the inbox-only sentence:\n%s", r.stdout)
	}
	tg := sqliteTarget(t)
	db := tg.plainDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	in, err := inbox.New(inbox.Config{Dialect: tg.dialect, Table: "billing_inbox", Consumer: "billing"})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Migrate(ctx, db); err != nil {
		t.Fatal(err)
	}
	env := func(k string) string {
		if k == envAdminToken {
			return testAdminToken
		}
		return ""
	}
	var out, errb testdb.SyncBuffer
	if code := runEnv(ctx, []string{"--dsn", tg.dsn, "admin", "--listen", freeAddr(t)}, &out, &errb, env); code == 0 || !strings.Contains(errb.String(), "outbox_message does not exist") {
		t.Errorf("without --inbox-table: exit %d, %s; want the missing outbox table", code, errb.String())
	}
	addr := freeAddr(t)
	r := startRelay(t, env, "--dsn", tg.dsn, "admin", "--listen", addr, "--inbox-table", "billing_inbox")
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	var landed string
	testdb.Eventually(t, r.ctx, "the admin page serves, or the command ends", func() bool {
		select {
		case code := <-r.exited:
			r.exited <- code // for the cleanup
			t.Fatalf("outbox admin exited %d:\n%s", code, r.stderr.String())
		default:
		}
		res, err := c.PostForm("http://"+addr+"/login", url.Values{"name": {"ops"}, "token": {testAdminToken}})
		if err != nil {
			return false
		}
		res.Body.Close()
		landed = fmt.Sprint(res.StatusCode, " ", res.Request.URL.Path)
		return true
	})
	if landed != "200 /inbox" {
		t.Errorf("after login: %s, want 200 /inbox", landed)
	}
	if body := getBody(t, c, "http://"+addr+"/inbox"); !strings.Contains(body, "billing_inbox") {
		t.Errorf("consumers page:\n%s", body)
	}
	if !strings.Contains(r.stderr.String(), "no outbox table: serving the consumers page only") {
		t.Errorf("logs do not say the page serves the consumers only:\n%s", r.stderr.String())
	}
}
