package main

import (
	"context"
	"database/sql"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// freeAddr returns a local address nothing listens on at the moment.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// get fetches url and returns its status and body (0 if unreachable).
func get(ctx context.Context, url string) (int, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, ""
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestRelayCommand runs `outbox relay` against each database and an
// in-process Kafka broker: it becomes ready, publishes an event emitted by
// another connection, exports metrics, and exits 0 when its context ends.
func TestRelayCommand(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg dbTarget) {
		broker, err := kafkatest.Start(kafkatest.Topics(8, "outbox.event.order"))
		if err != nil {
			t.Fatal(err)
		}
		defer broker.Close()
		consumer, err := kafkatest.NewConsumer(broker.Addrs(), []string{"outbox.event.order"})
		if err != nil {
			t.Fatal(err)
		}
		defer consumer.Close()

		table := randomTable()
		tg.migrate(t, table)
		addr := freeAddr(t)
		secret := withPassword(t, &tg)
		base := "http://" + addr

		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		runCtx, stop := context.WithCancel(ctx)
		defer stop()
		poll := "100ms"
		if tg.dialect == driver.Postgres {
			poll = "1h" // delivery rests on LISTEN/NOTIFY (and the adaptive poll's first short waits)
		}
		var stdout, stderr testdb.SyncBuffer
		exited := make(chan int, 1)
		go func() {
			exited <- run(runCtx, []string{"--dsn", tg.dsn, "--table", table, "relay",
				"--brokers", strings.Join(broker.Addrs(), ","), "--http", addr, "--poll", poll,
				"--lease-ttl", "2s", "--drain-timeout", "10s"}, &stdout, &stderr)
		}()

		waitFor := func(what string, cond func() bool) {
			t.Helper()
			waitForRelay(t, ctx, exited, &stderr, what, cond)
		}
		waitFor("/readyz 200", func() bool { code, _ := get(ctx, base+"/readyz"); return code == http.StatusOK })
		if code, _ := get(ctx, base+"/healthz"); code != http.StatusOK {
			t.Errorf("/healthz: %d", code)
		}

		db, _ := tg.wrappedDB(t, table)
		ids := emit(t, db, "42")
		recs, err := consumer.WaitForCount(ctx, 1)
		if err != nil {
			t.Fatalf("no record reached Kafka: %v; stderr:\n%s", err, stderr.String())
		}
		if recs[0].Headers["outbox-message-id"] != ids[0] || string(recs[0].Key) != "42" {
			t.Errorf("record: key %q headers %v, want message %s", recs[0].Key, recs[0].Headers, ids[0])
		}

		published := regexp.MustCompile(`(?m)^outbox_published_total\{[^}]*table="` + table + `"[^}]*\} 1$`)
		var metrics string
		waitFor("outbox_published_total 1", func() bool {
			_, metrics = get(ctx, base+"/metrics")
			return published.MatchString(metrics)
		})
		for _, re := range []string{
			`(?m)^outbox_relay_up\{[^}]*\} 1$`,
			`(?m)^outbox_pending_events\{[^}]*\} \d`, // the stats collector
			`(?m)^go_goroutines `,
		} {
			if !regexp.MustCompile(re).MatchString(metrics) {
				t.Errorf("/metrics does not match %s:\n%s", re, metrics)
			}
		}

		stop() // as SIGTERM would
		select {
		case code := <-exited:
			if code != 0 {
				t.Errorf("relay exited %d after cancel; stderr:\n%s", code, stderr.String())
			}
		case <-ctx.Done():
			t.Fatal("relay did not stop")
		}
		logs := stderr.String()
		for _, want := range []string{`"msg":"relay started"`, `"msg":"shutting down"`, `"msg":"relay stopped cleanly"`} {
			if !strings.Contains(logs, want) {
				t.Errorf("logs lack %s:\n%s", want, logs)
			}
		}
		if secret != "" && strings.Contains(logs, secret) {
			t.Errorf("the DSN's password is in the logs:\n%s", logs)
		}
		if !strings.Contains(logs, `"dsn":"`+redactDSN(tg.dsn)+`"`) {
			t.Errorf("logs lack the redacted DSN %s:\n%s", redactDSN(tg.dsn), logs)
		}
		if code, _ := get(ctx, base+"/healthz"); code != 0 {
			t.Errorf("HTTP server still up after exit: %d", code)
		}
		if s := readStats(t, []string{"--dsn", tg.dsn, "--table", table}); s.Sent != 1 || s.Pending != 0 {
			t.Errorf("after the relay: %+v", s)
		}
	})
}

// withPassword returns the password of tg's DSN, first giving a
// PostgreSQL DSN without one a password the server ignores (trust
// authentication), if it connects with it, so that the relay's logs can be
// checked for leaks.
func withPassword(t *testing.T, tg *dbTarget) string {
	t.Helper()
	if pw := dsnPassword(tg.dsn); pw != "" || tg.dialect != driver.Postgres {
		return pw
	}
	u, err := url.Parse(tg.dsn)
	if err != nil || u.User == nil {
		return ""
	}
	const pw = "Sup3rSecret-ignored"
	u.User = url.UserPassword(u.User.Username(), pw)
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		return ""
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if db.PingContext(ctx) != nil {
		return "" // the server checks passwords: keep the DSN as given
	}
	tg.dsn = u.String()
	return pw
}

// TestRelayUnreachableBroker: the relay refuses to start, exit 1, one line.
func TestRelayUnreachableBroker(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	r := expect(t, cli(t, "--dsn", tg.dsn, "relay", "--brokers", freeAddr(t), "--http", ""), exitRuntime)
	if !strings.HasPrefix(r.stderr, "outbox: cannot connect to Kafka brokers ") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("unreachable broker: %v", r)
	}
}

// TestRelayMissingSchema: the relay refuses an unmigrated table before
// contacting the brokers.
func TestRelayMissingSchema(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	tg.migrate(t, "other")
	r := expect(t, cli(t, "--dsn", tg.dsn, "relay", "--brokers", freeAddr(t), "--http", ""), exitRuntime)
	if !strings.Contains(r.stderr, "run `outbox migrate apply`") {
		t.Errorf("missing schema: %v", r)
	}
}

// TestRelayCommandExactlyOnce: `outbox relay --kafka-transactional-id-prefix`
// publishes in the exactly-once mode: a read_committed consumer receives
// the event, the manifest records its row, and the start-up line says so;
// a relay beside it at least once, or under another prefix, is refused
// (relay.ErrModeMismatch).
func TestRelayCommandExactlyOnce(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	table := randomTable()
	tg.migrate(t, table)
	broker, err := kafkatest.Start(kafkatest.Topics(4, "outbox.event.order"))
	if err != nil {
		t.Fatal(err)
	}
	defer broker.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := kafkatest.CreateTopic(ctx, broker.Addrs(), kafka.StateTopic("svc.", table), 1); err != nil {
		t.Fatal(err)
	}
	consumer, err := kafkatest.NewConsumer(broker.Addrs(), []string{"outbox.event.order"}, kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var stdout, stderr testdb.SyncBuffer
	exited := make(chan int, 1)
	go func() {
		exited <- run(runCtx, []string{"--dsn", tg.dsn, "--table", table, "relay", "--brokers", strings.Join(broker.Addrs(), ","),
			"--http", "", "--poll", "100ms", "--lease-ttl", "2s", "--kafka-transactional-id-prefix", "svc."}, &stdout, &stderr)
	}()
	db, _ := tg.wrappedDB(t, table)
	ids := emit(t, db, "42")
	recs, err := consumer.WaitForCount(ctx, 1)
	if err != nil {
		t.Fatalf("no record reached read_committed: %v; stderr:\n%s", err, stderr.String())
	}
	if recs[0].Headers["outbox-message-id"] != ids[0] {
		t.Errorf("record headers %v, want message %s", recs[0].Headers, ids[0])
	}
	// Beside it, a relay at least once, or exactly once under another
	// prefix, is refused at start and says why.
	for _, c := range []struct {
		name  string
		extra []string
		mode  string
	}{
		{"at least once", nil, `"at-least-once"`},
		{"another prefix", []string{"--kafka-transactional-id-prefix", "other."}, `"exactly-once other.` + table + `.outbox-txn"`},
	} {
		var out, errOut testdb.SyncBuffer
		args := append([]string{"--dsn", tg.dsn, "--table", table, "relay", "--brokers", strings.Join(broker.Addrs(), ","),
			"--http", "", "--poll", "100ms", "--lease-ttl", "2s"}, c.extra...)
		if code := run(ctx, args, &out, &errOut); code != exitRuntime {
			t.Errorf("%s: second relay exited %d, want %d; stderr:\n%s", c.name, code, exitRuntime, errOut.String())
		}
		for _, want := range []string{"another delivery mode", "runs " + c.mode, "(exactly-once svc." + table + ".outbox-txn)"} {
			if !strings.Contains(errOut.String(), want) {
				t.Errorf("%s: stderr lacks %s:\n%s", c.name, want, errOut.String())
			}
		}
	}
	stop()
	if code := <-exited; code != 0 {
		t.Errorf("relay exited %d; stderr:\n%s", code, stderr.String())
	}
	logs := stderr.String()
	for _, want := range []string{`"exactly_once":true`, `"transactional_id_prefix":"svc."`, `"state_topic":"svc.` + table + `.outbox-txn"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s:\n%s", want, logs)
		}
	}
}
