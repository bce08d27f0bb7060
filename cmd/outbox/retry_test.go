package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
	"github.com/sqloutbox/outbox/relay"
)

// TestRelayRetryFlagErrors: a retry or dead-letter setting the relay
// cannot use, from a flag or its variable, is a usage error (exit 2, one
// line naming the flag or variable) before anything is contacted.
func TestRelayRetryFlagErrors(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	broker := freeAddr(t) // nothing listens: a connection attempt would exit 1
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"MaxAttemptsZero", []string{"--max-attempts", "0"}, nil, "--max-attempts must be at least 1, got 0"},
		{"MaxAttemptsNegative", []string{"--max-attempts", "-3"}, nil, "--max-attempts must be at least 1, got -3"},
		{"MaxAttemptsNotANumber", []string{"--max-attempts", "many"}, nil, `invalid argument "many" for "--max-attempts"`},
		{"RetryInitialZero", []string{"--retry-initial", "0s"}, nil, "--retry-initial and --retry-max must be positive"},
		{"RetryInitialNegative", []string{"--retry-initial", "-1s"}, nil, "--retry-initial and --retry-max must be positive"},
		{"RetryMaxZero", []string{"--retry-max", "0s"}, nil, "--retry-initial and --retry-max must be positive"},
		{"RetryMaxBelowInitial", []string{"--retry-initial", "2s", "--retry-max", "1s"}, nil, "--retry-max (1s) must be at least --retry-initial (2s)"},
		{"RetryInitialAboveDefaultMax", []string{"--retry-initial", "10m"}, nil, "--retry-max (5m0s, the default) must be at least --retry-initial (10m0s)"},
		{"RetryNotADuration", []string{"--retry-max", "soon"}, nil, `invalid argument "soon" for "--retry-max"`},
		{"UnknownPolicy", []string{"--dead-letter-policy", "drop"}, nil, `invalid --dead-letter-policy "drop": want hold or skip`},
		{"RelayPolicyName", []string{"--dead-letter-policy", "SkipDead"}, nil, `invalid --dead-letter-policy "SkipDead": want hold or skip`},
		{"EmptyPolicy", []string{"--dead-letter-policy", ""}, nil, `invalid --dead-letter-policy "": want hold or skip`},
		{"EnvMaxAttemptsZero", nil, map[string]string{"OUTBOX_MAX_ATTEMPTS": "0"}, "--max-attempts must be at least 1, got 0"},
		{"EnvMaxAttemptsNotANumber", nil, map[string]string{"OUTBOX_MAX_ATTEMPTS": "many"}, `invalid OUTBOX_MAX_ATTEMPTS="many"`},
		{"EnvRetryInitialNotADuration", nil, map[string]string{"OUTBOX_RETRY_INITIAL": "2"}, `invalid OUTBOX_RETRY_INITIAL="2"`},
		{"EnvRetryMaxBelowInitial", nil, map[string]string{"OUTBOX_RETRY_INITIAL": "1m", "OUTBOX_RETRY_MAX": "30s"}, "--retry-max (30s) must be at least --retry-initial (1m0s)"},
		{"EnvUnknownPolicy", nil, map[string]string{"OUTBOX_DEAD_LETTER_POLICY": "drop"}, `invalid --dead-letter-policy "drop"`},
		{"FlagBeatsValidEnv", []string{"--max-attempts", "0"}, map[string]string{"OUTBOX_MAX_ATTEMPTS": "3"}, "--max-attempts must be at least 1, got 0"},
		{"UnroutableAfterNegative", []string{"--dead-letter-unroutable-after", "-1m"}, nil, "--dead-letter-unroutable-after must be positive, or 0"},
		{"EnvUnroutableAfterNotADuration", nil, map[string]string{"OUTBOX_DEAD_LETTER_UNROUTABLE_AFTER": "10"}, `invalid OUTBOX_DEAD_LETTER_UNROUTABLE_AFTER="10"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out, errb testdb.SyncBuffer
			args := append([]string{"--dsn", tg.dsn, "relay", "--brokers", broker, "--http", ""}, tc.args...)
			code := runEnv(t.Context(), args, &out, &errb, func(k string) string { return tc.env[k] })
			stderr := errb.String()
			if code != exitUsage || !strings.HasPrefix(stderr, "outbox: ") || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("exit %d, want 2 with one line containing %q; stderr:\n%s", code, tc.want, stderr)
			}
		})
	}
}

// startingRelayLine returns the attributes of the command's "starting
// relay" log line in logs, or nil.
func startingRelayLine(logs string) map[string]any {
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == "starting relay" {
			return m
		}
	}
	return nil
}

// TestRelayRetryFlagValues: the relay runs with the retry and
// dead-letter settings of its flags, else of their OUTBOX_* variables,
// else relay's defaults, and logs them at start; --help names each flag
// with its variable and default.
func TestRelayRetryFlagValues(t *testing.T) {
	t.Parallel()
	broker, err := kafkatest.Start(kafkatest.Topics(1, "outbox.event.order"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	type want struct {
		attempts   float64 // as JSON decodes it
		initial    string
		max        string
		deadLetter string
		unroutable string
	}
	defaults := want{relay.DefaultMaxAttempts, relay.DefaultRetryInitial.String(), relay.DefaultRetryMax.String(), "hold", "0s"}
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want want
	}{
		{"Defaults", nil, nil, defaults},
		{"Flags", []string{"--max-attempts", "3", "--retry-initial", "250ms", "--retry-max", "1m", "--dead-letter-policy", "skip", "--dead-letter-unroutable-after", "15m"}, nil,
			want{3, "250ms", "1m0s", "skip", "15m0s"}},
		{"Variables", nil, map[string]string{"OUTBOX_MAX_ATTEMPTS": "9", "OUTBOX_RETRY_INITIAL": "1s", "OUTBOX_RETRY_MAX": "30s", "OUTBOX_DEAD_LETTER_POLICY": "skip", "OUTBOX_DEAD_LETTER_UNROUTABLE_AFTER": "1h"},
			want{9, "1s", "30s", "skip", "1h0m0s"}},
		{"FlagsBeatVariables", []string{"--max-attempts", "2", "--retry-max", "2s", "--dead-letter-policy", "hold"},
			map[string]string{"OUTBOX_MAX_ATTEMPTS": "9", "OUTBOX_RETRY_INITIAL": "1s", "OUTBOX_RETRY_MAX": "30s", "OUTBOX_DEAD_LETTER_POLICY": "skip"},
			want{2, "1s", "2s", "hold", "0s"}},
		{"PolicyAnyCase", []string{"--dead-letter-policy", "SKIP"}, nil, want{relay.DefaultMaxAttempts, defaults.initial, defaults.max, "skip", "0s"}},
		{"EmptyVariablesAreUnset", nil, map[string]string{"OUTBOX_MAX_ATTEMPTS": "", "OUTBOX_DEAD_LETTER_POLICY": ""}, defaults},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tg := sqliteTarget(t)
			tg.migrate(t, "outbox_message")
			args := append([]string{"--dsn", tg.dsn, "relay", "--brokers", broker.Addrs()[0], "--http", ""}, tc.args...)
			r := startRelay(t, func(k string) string { return tc.env[k] }, args...)
			var line map[string]any
			r.waitFor(t, "the starting relay line", func() bool { line = startingRelayLine(r.stderr.String()); return line != nil })
			got := want{}
			got.attempts, _ = line["max_attempts"].(float64)
			got.initial, _ = line["retry_initial"].(string)
			got.max, _ = line["retry_max"].(string)
			got.deadLetter, _ = line["dead_letter_policy"].(string)
			got.unroutable, _ = line["dead_letter_unroutable_after"].(string)
			if got != tc.want {
				t.Errorf("logged %+v, want %+v; line %v", got, tc.want, line)
			}
			if code := r.shutdown(t); code != 0 {
				t.Errorf("exit %d; stderr:\n%s", code, r.stderr.String())
			}
		})
	}

	help := expect(t, cli(t, "relay", "--help"), 0).stdout
	for _, want := range []string{
		"--max-attempts int", "(default 6)", "(env OUTBOX_MAX_ATTEMPTS)",
		"--retry-initial duration", "(default 2s)", "(env OUTBOX_RETRY_INITIAL)",
		"--retry-max duration", "(default 5m0s)", "(env OUTBOX_RETRY_MAX)",
		"--dead-letter-policy string", `(default "hold")`, "(env OUTBOX_DEAD_LETTER_POLICY)",
	} {
		if !strings.Contains(help, want) {
			t.Errorf("relay --help lacks %q:\n%s", want, help)
		}
	}
}

// emitEvents commits evs in one transaction and returns their message IDs.
func emitEvents(t *testing.T, db *sql.DB, evs ...outbox.Event) []string {
	t.Helper()
	ctx := outbox.NewContext(context.Background())
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	var ids []string
	for _, ev := range evs {
		if ev.ID, err = outbox.NewMessageID(); err != nil {
			t.Fatal(err)
		}
		if err := outbox.Emit(ctx, ev); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, ev.ID)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// logLines returns the JSON log lines of logs whose msg is msg.
func logLines(logs, msg string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// TestRelayRetryPolicyTakesEffect runs `outbox relay` against Redis with
// a stream of the test's own that refuses every XADD (its last ID set to
// the largest: "ERR The stream has exhausted the last possible ID", an
// error of the message, so each try counts one attempt). Event order/p's
// first event names that stream as its topic; the aggregate's second
// event goes to the ordinary stream. Each case checks the attempts the
// dead letter took and the retry delays logged, then, once a later
// marker event was published, whether the second event went past the
// dead letter (skip) or is still held (hold). With relay's defaults (6
// attempts, 2 s doubling) the first event would not be dead for a minute.
func TestRelayRetryPolicyTakesEffect(t *testing.T) {
	t.Parallel()
	c := redisClient(t)
	for _, tc := range []struct {
		name     string
		args     []string
		env      map[string]string
		attempts int
		maxDelay time.Duration // of every "will retry" line
		skip     bool
	}{
		{name: "MaxAttemptsOne", args: []string{"--max-attempts", "1"}, attempts: 1},
		{name: "ThreeShortRetries", args: []string{"--max-attempts", "3", "--retry-initial", "10ms", "--retry-max", "10ms"},
			attempts: 3, maxDelay: 12 * time.Millisecond}, // 10 ms + 20 % jitter; uncapped, the second would be 16..24 ms
		{name: "Variables", env: map[string]string{"OUTBOX_MAX_ATTEMPTS": "3", "OUTBOX_RETRY_INITIAL": "10ms", "OUTBOX_RETRY_MAX": "10ms", "OUTBOX_DEAD_LETTER_POLICY": "skip"},
			attempts: 3, maxDelay: 12 * time.Millisecond, skip: true},
		{name: "Skip", args: []string{"--max-attempts", "1", "--dead-letter-policy", "skip"}, attempts: 1, skip: true},
		{name: "HoldExplicit", args: []string{"--max-attempts", "1", "--dead-letter-policy", "hold"}, attempts: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			prefix := "outboxcmd-" + uniqueID() + "."
			stream, refusing := prefix+"order", prefix+"refusing"
			t.Cleanup(func() { _ = c.Del(context.Background(), stream, refusing).Err() })
			if err := c.XAdd(ctx, &redis.XAddArgs{Stream: refusing, Values: []string{"f", "v"}}).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.Do(ctx, "XSETID", refusing, "18446744073709551615-18446744073709551615").Err(); err != nil {
				t.Fatal(err)
			}
			inStream := func(id string) bool {
				xs, err := c.XRange(ctx, stream, "-", "+").Result()
				if err != nil {
					t.Logf("XRANGE %s: %v", stream, err)
				}
				for _, x := range xs {
					if x.Values["outbox-message-id"] == id {
						return true
					}
				}
				return false
			}

			tg := sqliteTarget(t)
			table := randomTable()
			tg.migrate(t, table)
			base := []string{"--dsn", tg.dsn, "--table", table}
			args := append(append([]string{}, base...), "relay", "--broker", redisURL(), "--topic-prefix", prefix,
				"--http", "", "--poll", "50ms", "--lease-ttl", "2s")
			r := startRelay(t, func(k string) string { return tc.env[k] }, append(args, tc.args...)...)
			db, _ := tg.wrappedDB(t, table)
			ids := emitEvents(t, db,
				outbox.Event{AggregateType: "order", AggregateID: "p", Type: "order.placed", Payload: []byte(`{"n":1}`), Topic: refusing},
				outbox.Event{AggregateType: "order", AggregateID: "p", Type: "order.paid", Payload: []byte(`{"n":2}`)})
			r.waitFor(t, "the dead letter", func() bool { return len(logLines(r.stderr.String(), "message dead-lettered")) > 0 })

			d := deadJSON(t, base, "list", "--all")
			if d.Count != 1 || d.DeadLetters[0].MessageID != ids[0] || d.DeadLetters[0].Attempts != tc.attempts ||
				d.DeadLetters[0].Held == tc.skip || !strings.Contains(d.DeadLetters[0].LastError, "exhausted") {
				t.Errorf("dead letters: %+v, want %s after %d attempts, held %v", d, ids[0], tc.attempts, !tc.skip)
			}
			retries := 0
			for _, l := range logLines(r.stderr.String(), "publish failed; will retry") {
				if l["message_id"] != ids[0] {
					continue
				}
				retries++
				s, _ := l["retry_in"].(string)
				if d, err := time.ParseDuration(s); err != nil || d <= 0 || d > tc.maxDelay {
					t.Errorf("retry_in %q, want at most %s: %v", s, tc.maxDelay, l)
				}
			}
			if retries != tc.attempts-1 {
				t.Errorf("%d retries of %s logged, want %d", retries, ids[0], tc.attempts-1)
			}

			// A later event of another aggregate: once it is sent, a
			// released second event (earlier ids are claimed first) has
			// been claimed too.
			marker := emitEvents(t, db, outbox.Event{AggregateType: "order", AggregateID: "m", Type: "order.placed", Payload: []byte(`{}`)})
			r.waitFor(t, "the marker in the stream", func() bool { return inStream(marker[0]) })
			if tc.skip {
				r.waitFor(t, "order/p's second event past the dead letter", func() bool { return inStream(ids[1]) })
			} else {
				r.waitFor(t, "the marker marked sent", func() bool { return readStats(t, base).Sent == 1 })
				if s := readStats(t, base); s.Pending != 1 || s.Dead != 1 || inStream(ids[1]) {
					t.Errorf("hold: stats %+v, second event in the stream %v; want it pending behind the dead letter", s, inStream(ids[1]))
				}
			}
			if code := r.shutdown(t); code != 0 {
				t.Errorf("exit %d; stderr:\n%s", code, r.stderr.String())
			}
		})
	}
}
