package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// cliIn runs the command line args in-process with stdin as its input.
func cliIn(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ctx = context.WithValue(ctx, stdinKey{}, strings.NewReader(stdin))
	var out, errb testdb.SyncBuffer
	code := run(ctx, args, &out, &errb)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

type pendingOut struct {
	Action  string `json:"action"`
	DryRun  bool   `json:"dry_run"`
	Listed  int    `json:"listed"`
	Count   int    `json:"count"`
	Pending []struct {
		ID        int64  `json:"id"`
		MessageID string `json:"message_id"`
	} `json:"pending"`
}

// TestPendingDeadLetter: `outbox pending dead|skip` lists the exact pending
// events it would change, acts only when confirmed (stdin or --yes), on
// those rows only, holds (dead) or releases (skip) the aggregate, and
// writes an audit record; sent rows are never touched.
func TestPendingDeadLetter(t *testing.T) {
	forEachTarget(t, func(t *testing.T, tg dbTarget) {
		table := randomTable()
		tg.migrate(t, table)
		base := []string{"--dsn", tg.dsn, "--table", table}
		db, _ := tg.wrappedDB(t, table)
		ids := emit(t, db, "p", "p", "q")

		r := expect(t, cli(t, append(base, "pending", "list", "--aggregate", "order/p")...), 0)
		if !strings.Contains(r.stdout, ids[0]) || !strings.Contains(r.stdout, ids[1]) || strings.Contains(r.stdout, ids[2]) {
			t.Errorf("pending list --aggregate order/p: %v", r)
		}
		// No selector lists every pending event, oldest first, at most --limit.
		var all pendingOut
		r = expect(t, cli(t, append(base, "pending", "list", "--limit", "2", "--json")...), 0)
		if err := json.Unmarshal([]byte(r.stdout), &all); err != nil || all.Count != 2 || len(all.Pending) != 2 ||
			all.Pending[0].MessageID != ids[0] || all.Pending[1].MessageID != ids[1] {
			t.Errorf("pending list --limit 2: %v (%v), want %s, %s", r, err, ids[0], ids[1])
		}
		r = expect(t, cli(t, append(base, "pending", "list")...), 0)
		if !strings.Contains(r.stdout, ids[0]) || !strings.Contains(r.stdout, ids[2]) {
			t.Errorf("pending list with no selector: %v, want all three", r)
		}

		// Not confirmed, or a dry run: listed, nothing changed.
		for _, c := range []struct {
			stdin string
			args  []string
			code  int
		}{
			{"no\n", []string{"pending", "dead", "--id", ids[0]}, exitRuntime},
			{"", []string{"pending", "dead", "--id", ids[0]}, exitRuntime},
			{"", []string{"pending", "skip", "--aggregate", "order/p", "--dry-run"}, 0},
		} {
			r := expect(t, cliIn(t, c.stdin, append(base, c.args...)...), c.code)
			if !strings.Contains(r.stdout, ids[0]) || !strings.Contains(r.stdout, "ATTEMPTS") {
				t.Errorf("%v: the rows are not listed: %v", c.args, r)
			}
			if c.code != 0 && !strings.Contains(r.stderr, "not confirmed; nothing was changed") {
				t.Errorf("%v: %v", c.args, r)
			}
		}
		if s := readStats(t, base); s.Pending != 3 || s.Dead != 0 {
			t.Fatalf("an unconfirmed action changed the table: %+v", s)
		}

		// Confirmed on stdin: exactly the listed row, dead and holding.
		r = expect(t, cliIn(t, "yes\n", append(base, "pending", "dead", "--id", ids[0])...), 0)
		if !strings.Contains(r.stdout, "dead-lettered 1 of the 1 pending event(s) listed") || !strings.Contains(r.stdout, "outbox dead retry --id "+ids[0]) {
			t.Errorf("pending dead: %v", r)
		}
		var audit map[string]any
		if err := json.Unmarshal([]byte(r.stderr), &audit); err != nil || audit["component"] != "outbox.audit" ||
			audit["action"] != "pending dead" || audit["changed"] != float64(1) || !strings.Contains(r.stderr, ids[0]) {
			t.Errorf("audit record: %v (%v)", r.stderr, err)
		}
		d := deadJSON(t, base, "list", "--id", ids[0])
		if d.Count != 1 || !d.DeadLetters[0].Held || d.DeadLetters[0].Attempts != 0 || !strings.Contains(d.DeadLetters[0].LastError, "operator") {
			t.Errorf("after pending dead: %+v", d)
		}

		// skip with --yes --json: the aggregate's other row, released.
		r = expect(t, cli(t, append(base, "pending", "skip", "--aggregate", "order/p", "--yes", "--json")...), 0)
		var p pendingOut
		if err := json.Unmarshal([]byte(r.stdout), &p); err != nil || p.Count != 1 || p.Listed != 1 || p.DryRun || len(p.Pending) != 1 || p.Pending[0].MessageID != ids[1] {
			t.Errorf("pending skip --json: %+v (%v)\n%v", p, err, r)
		}
		if d := deadJSON(t, base, "list", "--id", ids[1]); d.Count != 1 || d.DeadLetters[0].Held {
			t.Errorf("after pending skip: %+v", d)
		}
		if s := readStats(t, base); s.Pending != 1 || s.Dead != 2 {
			t.Errorf("stats: %+v", s)
		}

		// Nothing pending matches: an error, nothing changed.
		for _, args := range [][]string{
			{"pending", "dead", "--id", ids[0], "--yes"}, // dead already
			{"pending", "skip", "--aggregate", "order/nosuch", "--yes"},
		} {
			r := expect(t, cli(t, append(base, args...)...), exitRuntime)
			if !strings.Contains(r.stderr, "no pending event matched") || strings.Count(r.stderr, "\n") != 1 {
				t.Errorf("%v: %v", args, r)
			}
		}
		// Selector mistakes are usage errors.
		for _, args := range [][]string{
			{"pending", "list", "--id", ids[2], "--aggregate", "order/q"},
			{"pending", "dead", "--yes"},
			{"pending", "dead", "--id", ids[2], "--aggregate", "order/q", "--yes"},
			{"pending", "skip", "--aggregate", "order", "--yes"},
			{"pending", "dead", "--id", ids[2], "--json"},
			{"pending", "dead", "--all"},
		} {
			r := expect(t, cli(t, append(base, args...)...), exitUsage)
			if strings.Count(r.stderr, "\n") != 1 || !strings.HasPrefix(r.stderr, "outbox: ") {
				t.Errorf("%v: want one error line, got %q", args, r.stderr)
			}
		}
		if s := readStats(t, base); s.Pending != 1 || s.Dead != 2 {
			t.Errorf("refused commands changed the table: %+v", s)
		}
	})
}

// TestPendingHelpGolden: the help texts of the pending commands, against
// testdata/*.golden (go test -run TestPendingHelpGolden -update rewrites).
func TestPendingHelpGolden(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"pending"}, {"pending", "list"}, {"pending", "dead"}, {"pending", "skip"}} {
		name := strings.Join(args, "-") + ".help.golden"
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := expect(t, cli(t, append(args, "--help")...), 0)
			path := filepath.Join("testdata", name)
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(r.stdout), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if r.stdout != string(want) {
				t.Errorf("%s differs from %s:\n%s", strings.Join(args, " "), path, r.stdout)
			}
		})
	}
	// The root's help lists the group next to dead.
	r := expect(t, cli(t, "--help"), 0)
	if !regexp.MustCompile(`(?m)^\s+pending\s+List pending events, or dead-letter`).MatchString(r.stdout) {
		t.Errorf("root help does not list pending:\n%s", r.stdout)
	}
}
