package main

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncWriter is a bytes.Buffer safe for the progress goroutine and the test.
type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestBadFlagValues: every flag value the quickstart cannot use is a
// usage error (exit 2, the reason and the usage on stderr), never a panic
// or a silent substitute.
func TestBadFlagValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-orders", "-5"}, "-orders must be at least 1, got -5"},
		{[]string{"-orders", "0"}, "-orders must be at least 1, got 0"},
		{[]string{"-workers", "0"}, "-workers must be at least 1, got 0"},
		{[]string{"-workers", "-3"}, "-workers must be at least 1, got -3"},
		{[]string{"-poll", "0s"}, "-poll must be positive"},
		{[]string{"-poll", "-1s"}, "-poll must be positive"},
		{[]string{"-timeout", "0s"}, "-timeout must be positive"},
		{[]string{"-progress", "-1s"}, "-progress must be positive, or 0"},
		{[]string{"-orders", "many"}, "invalid value"},
		{[]string{"-nosuch"}, "flag provided but not defined"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			var out, errb bytes.Buffer
			code := mainArgs(tc.args, &out, &errb)
			if code != 2 || !strings.Contains(errb.String(), tc.want) || !strings.Contains(errb.String(), "Usage of quickstart") {
				t.Errorf("exit %d, stderr:\n%s\nwant exit 2 with %q and the usage", code, errb.String(), tc.want)
			}
			if out.Len() != 0 {
				t.Errorf("stdout: %q", out.String())
			}
		})
	}
}

// TestRunRejectsNegativeConfig: run itself refuses negative counts (a
// config from code, not flags) instead of panicking in makeslice.
func TestRunRejectsNegativeConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []config{{Orders: -5}, {Workers: -1}, {Timeout: -1}} {
		if _, err := run(t.Context(), cfg, &bytes.Buffer{}); err == nil {
			t.Errorf("run(%+v): no error", cfg)
		}
	}
}

// TestProgressZeroDisables is the regression test for "-progress 0",
// which the usage documents as "disables it" but which failed as a usage
// error ("-progress must be positive, or 0 to disable it, got -1ns"):
// the run succeeds and writes no progress line.
func TestProgressZeroDisables(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	if code := mainArgs([]string{"-progress", "0", "-orders", "5", "-workers", "2"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d, stderr:\n%s", code, errb.String())
	}
	if strings.Contains(errb.String(), "events consumed") {
		t.Errorf("progress line with -progress 0:\n%s", errb.String())
	}
}

// TestProgressLines: a run with Progress set writes progress lines.
func TestProgressLines(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	var progress syncWriter
	rep, err := run(t.Context(), config{Orders: 300, Workers: 4, JSON: true, Logger: testLogger(t),
		Progress: &progress, ProgressEvery: 20 * time.Millisecond}, &out)
	if err != nil || !rep.OK {
		t.Fatalf("run: %v, report %+v", err, rep)
	}
	lines := progress.String()
	if !strings.Contains(lines, "quickstart: ") || !strings.Contains(lines, "transactions ") || !strings.Contains(lines, "/900") {
		t.Errorf("no progress line:\n%s", lines)
	}
}
