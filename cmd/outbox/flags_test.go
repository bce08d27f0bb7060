package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

// TestBadFlagValues: a flag value a subcommand cannot use is a usage
// error (exit 2, one line naming the flag), never a panic, a silent
// substitute or a connection attempt.
func TestBadFlagValues(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	broker := freeAddr(t)
	relay := func(extra ...string) []string {
		return append([]string{"--dsn", tg.dsn, "relay", "--brokers", broker, "--http", ""}, extra...)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--dsn", tg.dsn, "migrate", "apply", "--partitions", "-1"}, "artition"},
		{[]string{"migrate", "print", "--dialect", "sqlite", "--partitions", "-3"}, "artition"},
		{[]string{"--dsn", tg.dsn, "--timeout", "0s", "stats"}, "--timeout must be positive"},
		{[]string{"--dsn", tg.dsn, "stats", "--all=maybe"}, "invalid argument"},
		{[]string{"--dsn", tg.dsn, "dead", "list", "--all", "--limit", "-1"}, "--limit must be at least 1"},
		{[]string{"--dsn", tg.dsn, "dead", "retry", "--all", "--dry-run", "--limit", "-1"}, "--limit must be at least 1"},
		{[]string{"--dsn", tg.dsn, "dead", "skip", "--all", "--dry-run", "--limit", "0"}, "--limit must be at least 1"},
		{relay("--batch-size", "0"), "--batch-size must be at least 1"},
		{relay("--batch-size", "-5"), "--batch-size must be at least 1"},
		{relay("--max-batch-size", "-1"), "--max-batch-size must be at least"},
		{relay("--partitions", "-1"), "--partitions must be"},
		{relay("--poll", "0s"), "must be positive"},
		{relay("--lease-ttl", "-1s"), "must be positive"},
		{relay("--drain-timeout", "0s"), "must be positive"},
		{relay("--partition-check", "0s"), "must be positive"},
		{relay("--retention", "-1h"), "--retention must be positive"},
		{relay("--lease-ttl", "1ms"), "LeaseTTL"},
		{[]string{"--dsn", tg.dsn, "relay", "--brokers", " , ", "--http", ""}, "no Kafka brokers given"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			r := cli(t, tc.args...)
			if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) || strings.Count(r.stderr, "\n") != 1 {
				t.Errorf("want exit 2 with one line containing %q, got %v", tc.want, r)
			}
		})
	}
}

// TestVersion: outbox --version prints one line starting with the module
// version; describeBuild shows the VCS facts the toolchain recorded.
func TestVersion(t *testing.T) {
	t.Parallel()
	r := expect(t, cli(t, "--version"), 0)
	if !strings.HasPrefix(r.stdout, "outbox ") || strings.Count(r.stdout, "\n") != 1 || !strings.Contains(r.stdout, "go1.") {
		t.Errorf("--version: %v", r)
	}
	got := describeBuild(&debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/sqloutbox/outbox", Version: "v1.4.0"},
		Settings: []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "f8a12ea10f38"},
			{Key: "vcs.time", Value: "2026-11-30T10:00:00Z"}, {Key: "vcs.modified", Value: "true"}}})
	if want := "v1.4.0, revision f8a12ea10f38, time 2026-11-30T10:00:00Z, modified true, go1.26.0"; got != want {
		t.Errorf("describeBuild: %q, want %q", got, want)
	}
	if got := describeBuild(&debug.BuildInfo{}); got != "(devel)" {
		t.Errorf("describeBuild of nothing: %q", got)
	}
}
