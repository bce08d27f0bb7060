package privateserver

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"
)

// TestNATSServer: a private server starts on its own port with the given
// config (JetStream in the test's directory), greets with INFO, and is
// gone once its test has ended.
func TestNATSServer(t *testing.T) {
	t.Parallel()
	var addr string
	t.Run("server", func(t *testing.T) {
		addr = NATSServer(t, func(dir string) string { return "jetstream { store_dir: \"" + dir + "/js\" }" })
		if addr == "127.0.0.1:4222" {
			t.Fatalf("the private server took the shared server's address %s", addr)
		}
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "INFO ") || !strings.Contains(line, `"jetstream":true`) {
			t.Fatalf("greeting %q, %v: want INFO with jetstream", line, err)
		}
	})
	// The subtest's cleanup killed the server and waited for it to exit.
	if c, err := net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after the test ended", addr)
	}
}

// TestRedisServer: a private redis-server starts on its own port with
// the given arguments and answers PING.
func TestRedisServer(t *testing.T) {
	t.Parallel()
	addr := RedisServer(t, "--maxmemory", "10mb")
	if addr == "127.0.0.1:6379" {
		t.Fatalf("the private server took the shared server's address %s", addr)
	}
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("CONFIG GET maxmemory\r\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	var lines []string
	for range 5 { // *2, $9, maxmemory, $8, 10485760
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, strings.TrimSpace(line))
	}
	if lines[4] != "10485760" {
		t.Errorf("CONFIG GET maxmemory = %q, want the argument given (10485760)", lines)
	}
}
