package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
)

// startDevBroker runs `outbox dev-broker args...` until the test ends and
// returns the first line it printed on stdout and a function that stops
// it and returns its exit code and stderr.
func startDevBroker(t *testing.T, args ...string) (string, func() (int, string)) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	var errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		code := run(ctx, append([]string{"dev-broker"}, args...), pw, &errb)
		pw.Close()
		done <- code
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		cancel()
		t.Fatalf("dev-broker printed nothing (exit %d): %v; stderr: %s", <-done, err, errb.String())
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	var once sync.Once
	var code int
	stop := func() (int, string) {
		once.Do(func() {
			cancel()
			code = <-done
		})
		return code, errb.String()
	}
	t.Cleanup(func() { stop() })
	return strings.TrimSpace(line), stop
}

// TestDevBroker: dev-broker prints its address, has created the topics
// (with their partition counts), serves produce and fetch, and exits 0 on
// cancellation (what SIGINT and SIGTERM do in run).
func TestDevBroker(t *testing.T) {
	t.Parallel()
	addr, stop := startDevBroker(t, "--port", "0", "--topic", "outbox.event.order:3,outbox.event.user", "--partitions", "2")
	if _, _, err := net.SplitHostPort(addr); err != nil {
		t.Fatalf("stdout %q is not host:port: %v", addr, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for topic, want := range map[string]int{"outbox.event.order": 3, "outbox.event.user": 2} {
		ends, err := kafkatest.EndOffsets(ctx, []string{addr}, topic)
		if err != nil {
			t.Fatal(err)
		}
		if len(ends) != want {
			t.Errorf("%s: %d partitions, want %d", topic, len(ends), want)
		}
	}
	c, err := kafkatest.NewConsumer([]string{addr}, []string{"outbox.event.order"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "outbox.event.order", Key: []byte("o-1"), Value: []byte("{}")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitForCount(ctx, 1); err != nil {
		t.Fatal(err)
	}
	code, stderr := stop()
	if code != exitOK {
		t.Fatalf("exit %d after cancellation, want 0; stderr: %s", code, stderr)
	}
	if !strings.Contains(stderr, "development only") || !strings.Contains(stderr, "stopped") {
		t.Errorf("stderr does not say what it is and that it stopped: %s", stderr)
	}
}

// TestDevBrokerJSON: with --json stdout is one object naming the
// brokers and the topics with their partition counts.
func TestDevBrokerJSON(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	var out, errb bytes.Buffer
	// Cancelled before it starts: the broker starts, prints, and stops at once.
	cancel()
	if code := run(ctx, []string{"--json", "dev-broker", "--port", "0", "--topic", "a:2"}, &out, &errb); code != exitOK {
		t.Fatalf("exit %d, stderr %s", code, errb.String())
	}
	var got struct {
		Brokers []string         `json:"brokers"`
		Topics  map[string]int32 `json:"topics"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("stdout %q: %v", out.String(), err)
	}
	if len(got.Brokers) != 1 || got.Topics["a"] != 2 {
		t.Fatalf("stdout %+v", got)
	}
}

// TestDevBrokerUsage: bad flag values are usage errors (exit 2) naming
// the flag; a busy port is a runtime error (exit 1) naming --port.
func TestDevBrokerUsage(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	busy := ln.Addr().(*net.TCPAddr).Port
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--port", "-1"}, exitUsage, "--port"},
		{[]string{"--port", "70000"}, exitUsage, "--port"},
		{[]string{"--port", "0", "--partitions", "0"}, exitUsage, "--partitions"},
		{[]string{"--port", "0", "--topic", "t:0"}, exitUsage, "--topic"},
		{[]string{"--port", "0", "--topic", "t:x"}, exitUsage, "--topic"},
		{[]string{"--port", "0", "--topic", ":3"}, exitUsage, "empty topic name"},
		{[]string{"--port", strconv.Itoa(busy)}, exitRuntime, "--port"},
	} {
		var out, errb bytes.Buffer
		code := run(t.Context(), append([]string{"dev-broker"}, tc.args...), &out, &errb)
		if code != tc.code || !strings.Contains(errb.String(), tc.msg) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d naming %q", tc.args, code, errb.String(), tc.code, tc.msg)
		}
		if out.Len() != 0 {
			t.Errorf("%v: stdout %q, want nothing", tc.args, out.String())
		}
	}
}
