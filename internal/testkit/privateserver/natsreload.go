package privateserver

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// NATS is a nats-server of a test's own, started by StartNATS, whose
// configuration the test can change while it runs (Reload): users and
// permissions revoked and restored under a connected client.
type NATS struct {
	// Addr is the server's address, host:port.
	Addr string

	dir, file string
	proc      *process
}

// StartNATS starts a nats-server as NATSServer does (conf, the listen
// line, the binary, readiness, the kill when t ends) and returns it.
func StartNATS(t testing.TB, conf func(dir string) string) *NATS {
	t.Helper()
	bin := os.Getenv(EnvNATSServer)
	if bin == "" {
		bin = DefaultNATSServer
	}
	if _, err := os.Stat(bin); err != nil {
		Unavailable(t, fmt.Sprintf("no nats-server binary at %s (set %s): %v", bin, EnvNATSServer, err))
	}
	s := &NATS{dir: t.TempDir(), Addr: freeAddr(t)}
	s.file = filepath.Join(s.dir, "nats.conf")
	s.write(t, conf)
	s.proc = start(t, "nats-server", bin, []string{"-c", s.file}, s.Addr, func(r *bufio.Reader, _ net.Conn) error {
		line, err := r.ReadString('\n')
		if err == nil && !strings.HasPrefix(line, "INFO ") {
			err = fmt.Errorf("greeting %q", line)
		}
		return err
	})
	return s
}

// write writes the config file: the listen line, then conf(dir).
func (s *NATS) write(t testing.TB, conf func(dir string) string) {
	t.Helper()
	body := fmt.Sprintf("listen: %q\n%s\n", s.Addr, conf(s.dir))
	if err := os.WriteFile(s.file, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Log lines of nats-server (v2.9 and later) after a reload signal.
const (
	natsReloaded     = "Reloaded server configuration"
	natsReloadFailed = "Failed to reload server configuration"
)

// Reload rewrites the server's config file with conf(dir) (the same
// directory StartNATS gave; the listen line is added again and must not
// change) and signals the server to reload it (SIGHUP, as `nats-server
// --signal reload` does). It returns once the server logged that it
// reloaded the configuration: permissions changed for a user then apply
// to that user's connections already open. A server that refuses the new
// configuration, or does not answer within 60 s, fails t with its output.
// Not safe for concurrent use.
func (s *NATS) Reload(t testing.TB, conf func(dir string) string) {
	t.Helper()
	before := strings.Count(s.proc.out.String(), natsReloaded)
	failed := strings.Count(s.proc.out.String(), natsReloadFailed)
	s.write(t, conf)
	if err := s.proc.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatalf("signalling nats-server to reload: %v", err)
	}
	deadline := time.Now().Add(readyTimeout)
	// Polls a condition with a deadline; the server logs the line within
	// milliseconds.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		out := s.proc.out.String()
		switch {
		case strings.Count(out, natsReloaded) > before:
			return
		case strings.Count(out, natsReloadFailed) > failed:
			t.Fatalf("nats-server refused the new configuration:\n%s", out)
		case time.Now().After(deadline):
			t.Fatalf("nats-server did not log %q within %s:\n%s", natsReloaded, readyTimeout, out)
		}
		<-tick.C
	}
}
