package main

import (
	"context"
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

	"github.com/sqloutbox/outbox/internal/testdb"
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
