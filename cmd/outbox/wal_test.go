package main

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
)

// TestRelayCommandWALSource: `outbox relay --source wal` creates its slot
// and publication, publishes an event committed while it streams (the
// source counter shows it came from the stream), `outbox wal status`
// names the relay as the slot's reader, and `outbox wal drop` removes
// both once the relay stopped (and refuses while it runs).
func TestRelayCommandWALSource(t *testing.T) {
	t.Parallel()
	tg := serverTarget(t, driver.Postgres)
	testdb.RequireLogicalWAL(t, tg.plainDB(t))
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
	table := randomTable()
	tg.migrate(t, table)
	slot := "outbox_test_" + strings.ToLower(strings.TrimPrefix(table, "t_"))
	global := []string{"--dsn", tg.dsn, "--table", table}
	t.Cleanup(func() { cli(t, append(append([]string{}, global...), "wal", "drop", "--wal-slot", slot)...) })

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	addr := freeAddr(t)
	var stdout, stderr testdb.SyncBuffer
	exited := make(chan int, 1)
	go func() {
		exited <- run(runCtx, append(append([]string{}, global...), "relay", "--source", "wal", "--wal-slot", slot,
			"--brokers", strings.Join(broker.Addrs(), ","), "--http", addr, "--poll", "1h", "--lease-ttl", "2s"), &stdout, &stderr)
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		waitForRelay(t, ctx, exited, &stderr, what, cond)
	}
	streaming := regexp.MustCompile(`(?m)^outbox_relay_wal_streaming\{[^}]*\} 1$`)
	waitFor("outbox_relay_wal_streaming 1", func() bool {
		_, m := get(ctx, "http://"+addr+"/metrics")
		return streaming.MatchString(m)
	})
	// Once streaming, the relay's first claim from the table comes back
	// empty; an event committed after it comes from the stream.
	fromWAL := regexp.MustCompile(`(?m)^outbox_relay_source_messages_total\{[^}]*source="wal"[^}]*\} [1-9]`)
	db, _ := tg.wrappedDB(t, table)
	var ids []string
	waitFor("an event published from the stream", func() bool {
		if len(ids) == 0 || len(consumer.Records()) >= len(ids) {
			ids = append(ids, emit(t, db, "42")...)
		}
		_, m := get(ctx, "http://"+addr+"/metrics")
		return fromWAL.MatchString(m)
	})
	if code, _ := get(ctx, "http://"+addr+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz %d", code)
	}
	st := expect(t, cli(t, append(append([]string{}, global...), "wal", "status", "--json", "--wal-slot", slot)...), 0)
	var status map[string]any
	if err := json.Unmarshal([]byte(st.stdout), &status); err != nil {
		t.Fatalf("wal status --json: %v\n%s", err, st.stdout)
	}
	if status["slot_exists"] != true || status["publication_exists"] != true || status["active"] != true ||
		!strings.HasPrefix(status["reader"].(string), "outbox-relay ") {
		t.Errorf("wal status while the relay streams: %v", status)
	}
	busy := cli(t, append(append([]string{}, global...), "wal", "drop", "--wal-slot", slot)...)
	if busy.code == 0 || !strings.Contains(busy.stderr, "stop it first") {
		t.Errorf("wal drop while the relay reads the slot: %s", busy)
	}
	stop()
	if code := <-exited; code != 0 {
		t.Fatalf("relay exited %d; stderr:\n%s", code, stderr.String())
	}
	waitForDrop := func() bool {
		r := cli(t, append(append([]string{}, global...), "wal", "drop", "--wal-slot", slot)...)
		return r.code == 0 && strings.Contains(r.stdout, "dropped slot "+slot+" (existed)")
	}
	testdb.Eventually(t, ctx, "wal drop after the relay stopped", waitForDrop)
	after := expect(t, cli(t, append(append([]string{}, global...), "wal", "status", "--wal-slot", slot)...), 0)
	if !strings.Contains(after.stdout, "missing") {
		t.Errorf("wal status after drop:\n%s", after.stdout)
	}
}

// TestWALCommandsRefuseOtherDatabases: the WAL source is PostgreSQL's.
func TestWALCommandsRefuseOtherDatabases(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	for _, args := range [][]string{{"wal", "status"}, {"wal", "drop"}, {"wal", "create"}, {"wal", "ack-loss"}} {
		r := expect(t, cli(t, append([]string{"--dsn", tg.dsn}, args...)...), 2)
		if !strings.Contains(r.stderr, "needs PostgreSQL") {
			t.Errorf("%v: %s", args, r)
		}
	}
}

// TestWALCreateCommand: outbox wal create makes the publication and the
// slot (then says they existed), status shows the slot with no reader,
// and a publication of that name made for another table is refused with
// what to do.
func TestWALCreateCommand(t *testing.T) {
	t.Parallel()
	tg := serverTarget(t, driver.Postgres)
	testdb.RequireLogicalWAL(t, tg.plainDB(t))
	table := randomTable()
	tg.migrate(t, table)
	slot := "outbox_test_" + strings.ToLower(strings.TrimPrefix(table, "t_"))
	global := []string{"--dsn", tg.dsn, "--table", table}
	t.Cleanup(func() { cli(t, append(append([]string{}, global...), "wal", "drop", "--wal-slot", slot)...) })
	r := expect(t, cli(t, append(append([]string{}, global...), "wal", "create", "--wal-slot", slot)...), 0)
	if want := "publication " + table + "_outbox_pub created; slot " + slot + " created"; !strings.Contains(r.stdout, want) {
		t.Errorf("first create: %q, want %q", r.stdout, want)
	}
	r = expect(t, cli(t, append(append([]string{}, global...), "wal", "create", "--wal-slot", slot)...), 0)
	if !strings.Contains(r.stdout, "existed; slot "+slot+" existed") {
		t.Errorf("second create: %q", r.stdout)
	}
	st := expect(t, cli(t, append(append([]string{}, global...), "wal", "status", "--wal-slot", slot)...), 0)
	if !strings.Contains(st.stdout, "none (no relay reads it: it keeps WAL)") || strings.Contains(st.stdout, "LOSS") {
		t.Errorf("status after create:\n%s", st.stdout)
	}
	// The log-only mode's loss window: none yet; one recorded (as a
	// log-only relay records it when it finds its slot gone) is shown,
	// then acknowledged once.
	r = expect(t, cli(t, append(append([]string{}, global...), "wal", "ack-loss", "--wal-slot", slot)...), 0)
	if !strings.Contains(r.stdout, "no loss window recorded") {
		t.Errorf("ack-loss with none: %q", r.stdout)
	}
	if _, err := tg.plainDB(t).Exec("UPDATE "+table+"_wal_log SET loss_from = '0/10', loss_to = '0/20', loss_at = now(), loss_reason = 'missing (dropped)' WHERE slot_name = $1", slot); err != nil {
		t.Fatal(err)
	}
	st = expect(t, cli(t, append(append([]string{}, global...), "wal", "status", "--wal-slot", slot)...), 0)
	if !strings.Contains(st.stdout, "LOSS") || !strings.Contains(st.stdout, "between 0/10 and 0/20") {
		t.Errorf("status with a loss window:\n%s", st.stdout)
	}
	js := expect(t, cli(t, append(append([]string{}, global...), "wal", "status", "--json", "--wal-slot", slot)...), 0)
	if !strings.Contains(js.stdout, `"from_lsn": "0/10"`) {
		t.Errorf("status --json with a loss window:\n%s", js.stdout)
	}
	r = expect(t, cli(t, append(append([]string{}, global...), "wal", "ack-loss", "--wal-slot", slot)...), 0)
	if !strings.Contains(r.stdout, "acknowledged: slot "+slot+", events committed between 0/10 and 0/20") {
		t.Errorf("ack-loss: %q", r.stdout)
	}
	r = expect(t, cli(t, append(append([]string{}, global...), "wal", "ack-loss", "--wal-slot", slot)...), 0)
	if !strings.Contains(r.stdout, "no loss window recorded") {
		t.Errorf("second ack-loss: %q", r.stdout)
	}
	// A slot dropped by hand while recorded: create makes a new one and
	// says what may have been lost.
	if _, err := tg.plainDB(t).Exec("SELECT pg_drop_replication_slot($1)", slot); err != nil {
		t.Fatal(err)
	}
	r = expect(t, cli(t, append(append([]string{}, global...), "wal", "create", "--wal-slot", slot)...), 0)
	if !strings.Contains(r.stdout, "slot "+slot+" created") || !strings.Contains(r.stdout, "LOSS: events committed between") || !strings.Contains(r.stdout, "(missing (dropped))") {
		t.Errorf("create after the slot was dropped by hand: %q", r.stdout)
	}
	expect(t, cli(t, append(append([]string{}, global...), "wal", "ack-loss", "--wal-slot", slot)...), 0)

	other := randomTable()
	tg.migrate(t, other)
	pub := "outbox_test_pub_" + strings.ToLower(strings.TrimPrefix(other, "t_"))
	if _, err := tg.plainDB(t).Exec("CREATE PUBLICATION " + pub + " FOR TABLE " + other); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = tg.plainDB(t).Exec("DROP PUBLICATION IF EXISTS " + pub) })
	r = cli(t, append(append([]string{}, global...), "wal", "create", "--wal-slot", slot+"_x", "--wal-publication", pub)...)
	if r.code == 0 || !strings.Contains(r.stderr, "publication "+pub+" does not publish table "+table) || !strings.Contains(r.stderr, "ALTER PUBLICATION") {
		t.Errorf("create on another table's publication: %s", r)
	}
}
