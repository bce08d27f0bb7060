// Package privateserver starts and administers broker servers of a test's
// own, for the tests that need what the shared servers cannot give: a
// NATS server with users, permissions or TLS (a config file of the test's
// own, on a free port), a RabbitMQ user created for one test. The shared
// servers (NATS on 4222, RabbitMQ on 5672) are never stopped, restarted
// or reconfigured.
//
// What a test needs but cannot find (the nats-server binary, rabbitmqctl)
// skips it with the reason, unless OUTBOX_TEST_REQUIRE is set (CI and
// this project's machines set it): then the test fails, so that missing
// coverage never passes as green. It imports no broker client, so that
// every module's tests can use it (Go's internal rule goes by import
// path: github.com/sqloutbox/outbox/... may import it from any module of
// this repository).
package privateserver

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// EnvNATSServer names the variable that overrides the nats-server binary
// (default DefaultNATSServer).
const EnvNATSServer = "OUTBOX_TEST_NATS_SERVER"

// DefaultNATSServer is where Debian's nats-server package installs the
// binary (the shared server on this project's machines runs from it).
const DefaultNATSServer = "/usr/sbin/nats-server"

// readyTimeout bounds the wait for a started server to accept a
// connection: generous, since tests run beside other go test processes on
// 2 cores.
const readyTimeout = 60 * time.Second

// Unavailable skips t with why, or fails it when OUTBOX_TEST_REQUIRE is
// set (a server or tool CI has must not be silently missing there).
func Unavailable(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
		t.Fatalf("required (OUTBOX_TEST_REQUIRE is set) but unavailable: %s", why)
	}
	t.Skipf("SKIP: %s", why)
}

// NATSServer starts a nats-server of t's own on a free 127.0.0.1 port and
// returns its address, host:port, once it accepts connections (it has
// sent its INFO line; with TLS configured that line still comes in plain
// text, before the handshake). conf returns the body of the server's
// config file given a temporary directory of the test's (for a JetStream
// store_dir, certificate files); NATSServer adds the listen line, so conf
// must not set one. The server is killed, by its own process ID, when t
// ends. Without the binary (EnvNATSServer, default DefaultNATSServer)
// the test is skipped, or failed under OUTBOX_TEST_REQUIRE; a server that
// exits or is not ready within 60 s fails the test with its output.
func NATSServer(t testing.TB, conf func(dir string) string) string {
	t.Helper()
	bin := os.Getenv(EnvNATSServer)
	if bin == "" {
		bin = DefaultNATSServer
	}
	if _, err := os.Stat(bin); err != nil {
		Unavailable(t, fmt.Sprintf("no nats-server binary at %s (set %s): %v", bin, EnvNATSServer, err))
	}
	dir := t.TempDir()
	addr := freeAddr(t)
	file := filepath.Join(dir, "nats.conf")
	body := fmt.Sprintf("listen: %q\n%s\n", addr, conf(dir))
	if err := os.WriteFile(file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	var out syncBuffer
	cmd := exec.Command(bin, "-c", file)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // the server this test started
		<-exited
	})
	ready := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	go func() { ready <- waitINFO(ctx, addr) }()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("nats-server at %s not ready: %v\n%s", addr, err, out.String())
		}
	case err := <-exited:
		exited <- err // for the cleanup
		t.Fatalf("nats-server exited: %v\n%s", err, out.String())
	}
	return addr
}

// waitINFO dials addr until the server greets with its INFO line or ctx
// ends. Between refused dials it waits on ctx with a short timer: it
// polls a condition with a deadline, it does not sleep for a result.
func waitINFO(ctx context.Context, addr string) error {
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			line, rerr := bufio.NewReader(c).ReadString('\n')
			_ = c.Close()
			if rerr == nil && strings.HasPrefix(line, "INFO ") {
				return nil
			}
			err = fmt.Errorf("greeting %q: %v", line, rerr)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// freeAddr returns a 127.0.0.1 address with a port the kernel just gave
// out and released. Another process could take it before the server
// binds it; the server then exits and the test says so.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// Rabbitmqctl runs RabbitMQ's CLI on this host with args (bounded by
// 60 s) and returns its output. Without rabbitmqctl on PATH, or when the
// command fails (a broker that is not this host's, an Erlang cookie the
// test's user cannot read), the test is skipped with the output, or
// failed under OUTBOX_TEST_REQUIRE.
func Rabbitmqctl(t testing.TB, args ...string) string {
	t.Helper()
	path, err := exec.LookPath("rabbitmqctl")
	if err != nil {
		Unavailable(t, "rabbitmqctl not on PATH: cannot administer the broker")
	}
	out, err := rabbitmqctl(path, args...)
	if err != nil {
		Unavailable(t, fmt.Sprintf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out))
	}
	return out
}

func rabbitmqctl(path string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, args...).CombinedOutput()
	return string(out), err
}

// RabbitMQUser creates the RabbitMQ user name with password (through
// Rabbitmqctl; name it uniquely, e.g. with the test's own random suffix)
// and deletes it when t ends (a failed delete fails the test). Grant it
// permissions with Rabbitmqctl(t, "set_permissions", ...).
func RabbitMQUser(t testing.TB, name, password string) {
	t.Helper()
	Rabbitmqctl(t, "add_user", name, password)
	t.Cleanup(func() {
		path, err := exec.LookPath("rabbitmqctl")
		if err != nil {
			t.Errorf("removing the test's user %s: %v", name, err)
			return
		}
		if out, err := rabbitmqctl(path, "delete_user", name); err != nil {
			t.Errorf("removing the test's user %s: %v\n%s", name, err, out)
		}
	})
}

// syncBuffer is a strings.Builder safe for the server's output writers
// and the test reading it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
