package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sqloutbox/outbox/driver"
)

func TestMigrate(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg dbTarget) {
		table := randomTable()
		tg.dropAfter(t, table)
		base := []string{"--dsn", tg.dsn, "--table", table}

		r := expect(t, cli(t, append(base, "migrate", "status")...), exitOutdated)
		if !strings.Contains(r.stdout, "not migrated") || r.stderr != "" {
			t.Errorf("status before apply: %v", r)
		}
		r = expect(t, cli(t, append(base, "migrate", "apply")...), 0)
		if !strings.Contains(r.stdout, "from schema version 0 to") {
			t.Errorf("first apply: %v", r)
		}
		r = expect(t, cli(t, append(base, "--json", "migrate", "apply")...), 0)
		var applied struct {
			Previous, Current, Latest int
			Table                     string
		}
		if err := json.Unmarshal([]byte(r.stdout), &applied); err != nil {
			t.Fatalf("apply --json: %v\n%v", err, r)
		}
		if applied.Previous != applied.Current || applied.Current != applied.Latest || applied.Latest < 1 || applied.Table != table {
			t.Errorf("second apply should change nothing: %+v", applied)
		}

		r = expect(t, cli(t, append(base, "migrate", "status")...), 0)
		if !strings.Contains(r.stdout, "up to date") {
			t.Errorf("status: %v", r)
		}
		r = expect(t, cli(t, append(base, "migrate", "status", "--json")...), 0)
		var st struct {
			Current, Latest int
			UpToDate        bool `json:"up_to_date"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || !st.UpToDate || st.Current != st.Latest {
			t.Errorf("status --json: %+v, %v\n%v", st, err, r)
		}

		// A table never migrated: exit 3, also in JSON.
		fresh := randomTable()
		r = expect(t, cli(t, "--dsn", tg.dsn, "--table", fresh, "--json", "migrate", "status"), exitOutdated)
		st.UpToDate = true
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.UpToDate || st.Current != 0 {
			t.Errorf("status --json of a fresh table: %+v, %v\n%v", st, err, r)
		}

		// print needs no database.
		r = expect(t, cli(t, "--table", table, "migrate", "print", "--dialect", string(tg.dialect)), 0)
		if !strings.Contains(r.stdout, "CREATE TABLE") || !strings.Contains(r.stdout, table) {
			t.Errorf("print: %v", r)
		}
		// ... and infers the dialect from --dsn without connecting.
		expect(t, cli(t, append(base, "migrate", "print")...), 0)
	})
}

type statsOut struct {
	Table         string  `json:"table"`
	Dialect       string  `json:"dialect"`
	Pending       int64   `json:"pending"`
	Sent          int64   `json:"sent"`
	Dead          int64   `json:"dead"`
	OldestPending float64 `json:"oldest_pending_seconds"`
	Partitions    []struct {
		Partition int    `json:"partition"`
		Pending   int64  `json:"pending"`
		Owner     string `json:"owner"`
		Epoch     int64  `json:"epoch"`
	} `json:"partitions"`
}

func readStats(t *testing.T, base []string) statsOut {
	t.Helper()
	r := expect(t, cli(t, append(base, "stats", "--json")...), 0)
	var s statsOut
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		t.Fatalf("stats --json: %v\n%v", err, r)
	}
	return s
}

type deadOut struct {
	Action      string `json:"action"`
	DryRun      bool   `json:"dry_run"`
	Count       int    `json:"count"`
	DeadLetters []struct {
		MessageID     string `json:"message_id"`
		AggregateType string `json:"aggregate_type"`
		AggregateID   string `json:"aggregate_id"`
		Held          bool   `json:"held"`
		LastError     string `json:"last_error"`
		Attempts      int    `json:"attempts"`
	} `json:"dead_letters"`
}

func deadJSON(t *testing.T, base []string, args ...string) deadOut {
	t.Helper()
	r := expect(t, cli(t, append(append(base, "--json", "dead"), args...)...), 0)
	var d deadOut
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil {
		t.Fatalf("dead %v --json: %v\n%v", args, err, r)
	}
	return d
}

// TestStatsAndDeadLetters emits events, relays some (one dead-lettered
// by a permanent failure), then checks stats and every dead-letter action.
func TestStatsAndDeadLetters(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg dbTarget) {
		table := randomTable()
		tg.migrate(t, table)
		base := []string{"--dsn", tg.dsn, "--table", table}

		s := readStats(t, base)
		if s.Pending != 0 || s.Sent != 0 || s.Dead != 0 || s.Table != table || s.Dialect != string(tg.dialect) {
			t.Fatalf("stats of an empty table: %+v", s)
		}
		db, _ := tg.wrappedDB(t, table)
		ids := emit(t, db, "1", "1", "bad")
		relayUntil(t, tg, table, 2, 1)
		emit(t, db, "3") // stays pending
		badID := ids[2]

		s = readStats(t, base)
		if s.Pending != 1 || s.Sent != 2 || s.Dead != 1 || s.OldestPending <= 0 {
			t.Errorf("stats: want 1 pending, 2 sent, 1 dead, an oldest age; got %+v", s)
		}
		pendingParts := 0
		for _, p := range s.Partitions {
			if p.Pending > 0 {
				pendingParts++
			}
		}
		if pendingParts != 1 {
			t.Errorf("want one partition with pending rows: %+v", s.Partitions)
		}
		r := expect(t, cli(t, append(base, "stats")...), 0)
		for _, re := range []string{`(?m)^pending:\s+1$`, `(?m)^sent:\s+2$`, `(?m)^dead:\s+1$`, `(?m)^oldest pending:\s+\S*\d`, `PARTITION\s+PENDING\s+OLDEST PENDING\s+OWNER\s+EPOCH`} {
			if !regexp.MustCompile(re).MatchString(r.stdout) {
				t.Errorf("stats output does not match %s:\n%s", re, r.stdout)
			}
		}

		// list
		d := deadJSON(t, base, "list", "--all")
		if d.Count != 1 || len(d.DeadLetters) != 1 || d.DeadLetters[0].MessageID != badID || !d.DeadLetters[0].Held ||
			!strings.Contains(d.DeadLetters[0].LastError, "refused by the test") {
			t.Fatalf("dead list --all: %+v", d)
		}
		r = expect(t, cli(t, append(base, "dead", "list", "--aggregate", "order/bad")...), 0)
		if !strings.Contains(r.stdout, badID) || !strings.Contains(r.stdout, "order/bad") || !strings.Contains(r.stdout, "MESSAGE ID") {
			t.Errorf("dead list --aggregate: %v", r)
		}
		r = expect(t, cli(t, append(base, "dead", "list", "--aggregate", "order/1")...), 0)
		if !strings.Contains(r.stdout, "no dead letters match") {
			t.Errorf("dead list of a healthy aggregate: %v", r)
		}
		// No selector lists them all (listing changes nothing).
		r = expect(t, cli(t, append(base, "dead", "list")...), 0)
		if !strings.Contains(r.stdout, badID) || !strings.Contains(r.stdout, "MESSAGE ID") {
			t.Errorf("dead list with no selector: %v, want the dead letter %s listed", r, badID)
		}

		// Dry runs report and change nothing.
		d = deadJSON(t, base, "retry", "--all", "--dry-run")
		if !d.DryRun || d.Count != 1 || len(d.DeadLetters) != 1 || d.DeadLetters[0].MessageID != badID {
			t.Errorf("retry --dry-run: %+v", d)
		}
		r = expect(t, cli(t, append(base, "dead", "skip", "--id", badID, "--dry-run")...), 0)
		if !strings.Contains(r.stdout, "dry run: skip would change 1 dead letter") || !strings.Contains(r.stdout, badID) {
			t.Errorf("skip --dry-run: %v", r)
		}
		if s2 := readStats(t, base); s2.Dead != 1 || s2.Pending != 1 {
			t.Errorf("a dry run changed the table: %+v", s2)
		}
		if d = deadJSON(t, base, "list", "--id", badID); d.Count != 1 || !d.DeadLetters[0].Held {
			t.Errorf("a dry run released the aggregate: %+v", d)
		}

		// skip releases the aggregate; a second skip finds nothing to do.
		if d = deadJSON(t, base, "skip", "--id", badID); d.DryRun || d.Count != 1 {
			t.Errorf("skip: %+v", d)
		}
		if d = deadJSON(t, base, "list", "--id", badID); d.Count != 1 || d.DeadLetters[0].Held {
			t.Errorf("after skip the dead letter should stay, released: %+v", d)
		}
		if d = deadJSON(t, base, "skip", "--all", "--dry-run"); d.Count != 0 {
			t.Errorf("skip --dry-run after skip: %+v", d)
		}
		r = expect(t, cli(t, append(base, "dead", "skip", "--all")...), 0)
		if !strings.Contains(r.stdout, "skipped 0 dead letter") {
			t.Errorf("second skip: %v", r)
		}

		// A selector that matches nothing is an error, not a silent success.
		for _, args := range [][]string{
			{"dead", "retry", "--id", "nosuch"},
			{"dead", "retry", "--id", "nosuch", "--dry-run"},
			{"dead", "retry", "--aggregate", "order/nosuch", "--json"},
			{"dead", "skip", "--id", "nosuch"},
		} {
			r := expect(t, cli(t, append(base, args...)...), exitRuntime)
			if !strings.Contains(r.stderr, "matched --") || !strings.Contains(r.stderr, "nothing was changed") || strings.Count(r.stderr, "\n") != 1 {
				t.Errorf("%v: want one 'nothing matched' line, got %v", args, r)
			}
		}

		// retry puts it back to pending.
		r = expect(t, cli(t, append(base, "dead", "retry", "--aggregate", "order/bad")...), 0)
		if !strings.Contains(r.stdout, "retried 1 dead letter") {
			t.Errorf("retry: %v", r)
		}
		if s = readStats(t, base); s.Dead != 0 || s.Pending != 2 || s.Sent != 2 {
			t.Errorf("after retry: %+v", s)
		}
		r = expect(t, cli(t, append(base, "dead", "list", "--all")...), 0)
		if !strings.Contains(r.stdout, "no dead letters match") {
			t.Errorf("list after retry: %v", r)
		}
		// dead list without a selector lists them all (as --all).
		r = expect(t, cli(t, append(base, "dead", "list")...), 0)
		if !strings.Contains(r.stdout, "no dead letters match") {
			t.Errorf("list without a selector: %v", r)
		}

		// Selector mistakes are usage errors.
		for _, args := range [][]string{
			{"dead", "list", "--all", "--id", badID},
			{"dead", "retry", "--aggregate", "order"},
			{"dead", "skip", "--aggregate", "/x"},
			{"dead", "list", "--all", "--limit", "0"},
		} {
			r := expect(t, cli(t, append(base, args...)...), exitUsage)
			if strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "outbox: ") {
				t.Errorf("%v: want one error line, got %q", args, r.stderr)
			}
		}
	})
}

// TestMissingTable: commands other than migrate say how to fix a table
// that was never migrated.
func TestMissingTable(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg dbTarget) {
		if tg.dialect == driver.SQLite {
			tg.migrate(t, "other_table") // the file exists, the table does not
		}
		table := randomTable()
		for _, args := range [][]string{{"stats"}, {"dead", "list", "--all"}, {"dead", "retry", "--all"}} {
			r := expect(t, cli(t, append([]string{"--dsn", tg.dsn, "--table", table}, args...)...), exitRuntime)
			if !strings.Contains(r.stderr, "run `outbox migrate apply`") || strings.Count(r.stderr, "\n") != 1 {
				t.Errorf("%v on a missing table: %v", args, r)
			}
		}
	})
}

func TestMissingSQLiteFile(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	r := expect(t, cli(t, "--dsn", tg.dsn, "stats"), exitRuntime)
	if !strings.Contains(r.stderr, "does not exist: run `outbox migrate apply`") {
		t.Errorf("stats on a missing file: %v", r)
	}
	if _, err := os.Stat(tg.path); err == nil {
		t.Error("stats created the SQLite file")
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	for _, args := range [][]string{
		{},
		{"nonsense"},
		{"--bogus", "stats"},
		{"stats", "extra-arg"},
		{"migrate"},
		{"migrate", "frobnicate"},
		{"migrate", "print"}, // neither --dialect nor --dsn
		{"migrate", "print", "--dialect", "oracle"},
		{"stats"}, // no DSN
		{"--dsn", "oracle://scott:tiger@db/orcl", "stats"},
		{"--dsn", tg.dsn, "--timeout", "soon", "stats"},
		{"--dsn", tg.dsn, "--timeout", "-1s", "stats"},
		{"--dsn", tg.dsn, "--table", "bad;name", "stats"},
		{"--dsn", tg.dsn, "dead"},
		{"--dsn", tg.dsn, "relay"}, // no brokers
		{"--dsn", tg.dsn, "relay", "--brokers", "127.0.0.1:9", "--lease-ttl", "1ms"},
		{"--dsn", tg.dsn, "relay", "--brokers", "127.0.0.1:9", "--batch-size", "0"},
		{"--dsn", tg.dsn, "relay", "--brokers", "127.0.0.1:9", "--batch-size", "100", "--max-batch-size", "50"},
		{"--dsn", tg.dsn, "relay", "--brokers", "127.0.0.1:9", "--partitions", "x"},
		{"--dsn", tg.dsn, "relay", "--brokers", "127.0.0.1:9", "--partitions", "-1"},
		{"--dsn", tg.dsn, "relay", "--brokers", "127.0.0.1:9", "--partition-check", "0s"},
		{"--dsn", tg.dsn, "migrate", "apply", "--partitions", "0x"},
	} {
		r := cli(t, args...)
		if r.code != exitUsage {
			t.Errorf("%q: want exit 2, got %v", args, r)
			continue
		}
		if lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n"); !strings.HasPrefix(lines[len(lines)-1], "outbox: ") {
			t.Errorf("%q: want an error line last on stderr, got %q", args, r.stderr)
		}
		if strings.Contains(r.stderr, "tiger") {
			t.Errorf("%q: password leaked: %q", args, r.stderr)
		}
	}
	// Help is not an error.
	r := expect(t, cli(t, "dead", "retry", "--help"), 0)
	if !strings.Contains(r.stdout, "--dry-run") || !strings.Contains(r.stdout, "--aggregate") {
		t.Errorf("help: %v", r)
	}
}

func TestBadDSNIsRedacted(t *testing.T) {
	t.Parallel()
	for _, dsn := range []string{
		"postgres://bob:Sup3rSecret@127.0.0.1:1/app?sslmode=disable",
		"postgresql://bob:Sup3rSecret@127.0.0.1:1/app?sslmode=disable&password=Sup3rSecret",
		"mysql://bob:Sup3rSecret@127.0.0.1:1/app",
		"bob:Sup3rSecret@tcp(127.0.0.1:1)/app",
	} {
		r := expect(t, cli(t, "--dsn", dsn, "--timeout", "5s", "stats"), exitRuntime)
		if strings.Contains(r.stderr, "Sup3rSecret") {
			t.Errorf("%s: password in the error: %q", redactDSN(dsn), r.stderr)
		}
		if strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "outbox: cannot connect to ") || !strings.Contains(r.stderr, "127.0.0.1:1") {
			t.Errorf("%s: want one line naming the server, got %q", redactDSN(dsn), r.stderr)
		}
	}
}

func TestEnvironment(t *testing.T) { // not parallel: t.Setenv
	tg := sqliteTarget(t)
	t.Setenv("OUTBOX_DSN", tg.dsn)
	t.Setenv("OUTBOX_TABLE", "from_env")
	expect(t, cli(t, "migrate", "apply"), 0)
	r := expect(t, cli(t, "--json", "stats"), 0)
	if !strings.Contains(r.stdout, `"table": "from_env"`) {
		t.Errorf("OUTBOX_TABLE ignored: %v", r)
	}
	// A flag beats the environment.
	expect(t, cli(t, "--table", "other", "migrate", "status"), exitOutdated)
	t.Setenv("OUTBOX_TIMEOUT", "forever")
	r = expect(t, cli(t, "stats"), exitUsage)
	if !strings.Contains(r.stderr, "OUTBOX_TIMEOUT") {
		t.Errorf("bad env value: %v", r)
	}
}

// TestStatusDoesNotCreateSQLiteFile is the regression test for `migrate
// status` creating an empty database file as a side effect.
func TestStatusDoesNotCreateSQLiteFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "absent.db")
	r := expect(t, cli(t, "--dsn", "sqlite:"+path, "migrate", "status"), exitOutdated)
	if !strings.Contains(r.stdout, "not migrated") {
		t.Errorf("status of a missing file: %v", r)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("migrate status created %s (stat: %v)", path, err)
	}
}

// TestOneLine: the command prints "outbox: " once before a message: the
// library's own "outbox: " prefixes go, and a package's prefix keeps only
// its name (issue 36, item 8: "outbox: outbox/nats: ...").
func TestOneLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"outbox: outbox: no rows", "no rows"},
		{"outbox/nats: no stream OUTBOX:\n create it", "nats: no stream OUTBOX: create it"},
		{"outbox/kafka: state topic missing", "kafka: state topic missing"},
		{"cannot use NATS at nats://h:4222: outbox/nats: no stream", "cannot use NATS at nats://h:4222: outbox/nats: no stream"},
		{"relay: outbox: stopped", "relay: stopped"},
		{"outbox/ is a path, not a package: x", "outbox/ is a path, not a package: x"},
	} {
		if got := oneLine(tc.in); got != tc.want {
			t.Errorf("oneLine(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
