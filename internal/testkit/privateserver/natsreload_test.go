package privateserver

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// TestNATSReload: a permission changed by Reload applies to a connection
// already open: its user may publish to "secret.x", then may not (the
// server answers the publish with a permissions violation), then may
// again. The client speaks the NATS protocol by hand (this package
// imports no broker client).
func TestNATSReload(t *testing.T) {
	t.Parallel()
	conf := func(deny bool) func(string) string {
		return func(string) string {
			perms := ""
			if deny {
				perms = `, permissions: { publish: { deny: ["secret.>"] } }`
			}
			return fmt.Sprintf("authorization { users: [ { user: u, password: p%s } ] }", perms)
		}
	}
	s := StartNATS(t, conf(false))
	c, err := net.DialTimeout("tcp", s.Addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(c)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "INFO ") {
		t.Fatalf("greeting %q, %v", line, err)
	}
	// publish sends a publish and a PING and returns the first line of
	// the answer: PONG if the publish was allowed, else the violation.
	publish := func() string {
		t.Helper()
		if _, err := c.Write([]byte("PUB secret.x 1\r\nx\r\nPING\r\n")); err != nil {
			t.Fatal(err)
		}
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "-ERR") {
			if pong, err := r.ReadString('\n'); err != nil || pong != "PONG\r\n" {
				t.Fatalf("after %q: %q, %v", line, pong, err)
			}
		}
		return strings.TrimSpace(line)
	}
	if _, err := c.Write([]byte(`CONNECT {"user":"u","pass":"p","verbose":false,"pedantic":false}` + "\r\n")); err != nil {
		t.Fatal(err)
	}
	if got := publish(); got != "PONG" {
		t.Fatalf("allowed publish: %q", got)
	}
	s.Reload(t, conf(true))
	if got := publish(); !strings.Contains(got, "Permissions Violation") {
		t.Fatalf("publish after the deny was loaded: %q, want a permissions violation", got)
	}
	s.Reload(t, conf(false))
	if got := publish(); got != "PONG" {
		t.Fatalf("publish after the deny was lifted: %q", got)
	}
}
