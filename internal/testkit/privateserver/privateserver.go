// Package privateserver starts and administers servers of a test's own,
// for the tests that need what the shared servers cannot give: a
// PostgreSQL cluster to crash, restart or reconfigure (StartPostgres), a
// NATS server with users, permissions or TLS (a config file of the test's
// own, on a free port, that StartNATS lets the test change and reload
// while the server runs), a redis-server with the test's arguments or with
// TLS, a RabbitMQ user created for one test. The shared servers (NATS on
// 4222, Redis on 6379, RabbitMQ on 5672) are never stopped, restarted or
// reconfigured; neither is the shared PostgreSQL on 5432.
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
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
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
// StartNATS does the same and lets the test change the configuration.
func NATSServer(t testing.TB, conf func(dir string) string) string {
	t.Helper()
	return StartNATS(t, conf).Addr
}

// process is a server that start started.
type process struct {
	cmd *exec.Cmd
	out *syncBuffer // its stdout and stderr
}

// start runs bin with argv, kills it when t ends, and returns once
// ready(conn) succeeds on a connection to addr; a server that exits first
// or is not ready within 60 s fails t with its output.
func start(t testing.TB, name, bin string, argv []string, addr string, ready func(*bufio.Reader, net.Conn) error) *process {
	t.Helper()
	out := &syncBuffer{}
	cmd := exec.Command(bin, argv...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // the server this test started
		<-exited
	})
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- waitReady(ctx, addr, ready) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s at %s not ready: %v\n%s", name, addr, err, out.String())
		}
	case err := <-exited:
		exited <- err // for the cleanup
		t.Fatalf("%s exited: %v\n%s", name, err, out.String())
	}
	return &process{cmd: cmd, out: out}
}

// waitReady dials addr until ready succeeds on a connection or ctx ends.
// Between attempts it waits on ctx with a short timer: it polls a
// condition with a deadline, it does not sleep for a result.
func waitReady(ctx context.Context, addr string, ready func(*bufio.Reader, net.Conn) error) error {
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			err = ready(bufio.NewReader(c), c)
			_ = c.Close()
			if err == nil {
				return nil
			}
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

// EnvRedisServer names the variable that overrides the redis-server
// binary (default DefaultRedisServer).
const EnvRedisServer = "OUTBOX_TEST_REDIS_SERVER"

// DefaultRedisServer is where Debian's redis-server package installs the
// binary (the shared server on this project's machines runs from it).
const DefaultRedisServer = "/usr/bin/redis-server"

// RedisServer starts a redis-server of t's own on a free 127.0.0.1 port,
// keeping nothing on disk (no RDB, no AOF, its directory the test's
// temporary one), with args appended to its command line (e.g.
// "--maxmemory", "10mb"), and returns its address, host:port, once it
// answers PING. The server is killed when t ends; without the binary
// (EnvRedisServer, default DefaultRedisServer) the test is skipped, or
// failed under OUTBOX_TEST_REQUIRE.
func RedisServer(t testing.TB, args ...string) string {
	t.Helper()
	bin := redisBinary(t)
	addr := freeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	argv := append(redisArgs(t, "--port", port), args...)
	start(t, "redis-server", bin, argv, addr, func(r *bufio.Reader, c net.Conn) error {
		if _, err := c.Write([]byte("PING\r\n")); err != nil {
			return err
		}
		line, err := r.ReadString('\n')
		if err == nil && !strings.HasPrefix(line, "+PONG") {
			err = fmt.Errorf("PING answered %q", line)
		}
		return err
	})
	return addr
}

// RedisTLSServer starts a redis-server of t's own that listens on a free
// 127.0.0.1 port with TLS only (--tls-port, --port 0): certFile and
// keyFile are its PEM certificate and key, caFile the CA bundle it
// verifies client certificates against. Client certificates are required
// (redis-server's default; pass "--tls-auth-clients", "no" or "optional"
// in args to relax it). Like RedisServer it keeps nothing on disk, appends
// args (e.g. "--requirepass", pw) and is killed when t ends; it returns
// the address, host:port.
//
// Readiness is a completed TLS 1.3 handshake on that port, the only one
// the server opens (no plain-text port is opened just for the probe): the
// probe neither verifies the server's certificate nor presents one, since
// it checks that the server's event loop speaks TLS, not who it is, and a
// TLS 1.3 client has finished its handshake before the server judges the
// (missing) client certificate. A server whose certificate files are
// unusable exits at start, and the test fails with its output.
func RedisTLSServer(t testing.TB, certFile, keyFile, caFile string, args ...string) string {
	t.Helper()
	bin := redisBinary(t)
	addr := freeAddr(t)
	_, port, _ := net.SplitHostPort(addr)
	argv := append(redisArgs(t, "--port", "0", "--tls-port", port,
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile), args...)
	start(t, "redis-server", bin, argv, addr, func(_ *bufio.Reader, c net.Conn) error {
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}) //nolint:gosec // a readiness probe: no data is sent
		return tc.Handshake()
	})
	return addr
}

// redisBinary returns the redis-server binary (EnvRedisServer, default
// DefaultRedisServer), skipping t without it (failing it under
// OUTBOX_TEST_REQUIRE).
func redisBinary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv(EnvRedisServer)
	if bin == "" {
		bin = DefaultRedisServer
	}
	if _, err := os.Stat(bin); err != nil {
		Unavailable(t, fmt.Sprintf("no redis-server binary at %s (set %s): %v", bin, EnvRedisServer, err))
	}
	return bin
}

// redisArgs returns the command line of a private redis-server that binds
// 127.0.0.1, keeps nothing on disk and stays in the foreground, with
// listen (its port arguments) after the bind.
func redisArgs(t testing.TB, listen ...string) []string {
	argv := append([]string{"--bind", "127.0.0.1"}, listen...)
	return append(argv, "--save", "", "--appendonly", "no", "--dir", t.TempDir(), "--daemonize", "no")
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
