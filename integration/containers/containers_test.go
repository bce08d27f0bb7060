package containers

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// This machine has no Docker engine: these tests check the decisions
// around the container path, not the containers themselves.

func TestDockerEndpoint(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		host, network, addr string
		ok                  bool
	}{
		{"", "unix", "/var/run/docker.sock", true},
		{"unix:///run/user/1000/docker.sock", "unix", "/run/user/1000/docker.sock", true},
		{"tcp://127.0.0.1:2375", "tcp", "127.0.0.1:2375", true},
		{"ssh://me@host", "", "", false},
		{"npipe:////./pipe/docker_engine", "", "", false},
	} {
		network, addr, ok := DockerEndpoint(c.host)
		if network != c.network || addr != c.addr || ok != c.ok {
			t.Errorf("DockerEndpoint(%q) = %q, %q, %v; want %q, %q, %v", c.host, network, addr, ok, c.network, c.addr, c.ok)
		}
	}
}

// noDocker points DOCKER_HOST at a socket nobody listens on.
func noDocker(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "docker.sock"))
}

func TestEnsureWithoutServersOrDocker(t *testing.T) {
	noDocker(t)
	if DockerAvailable() {
		t.Fatal("DockerAvailable with DOCKER_HOST at a closed socket")
	}
	unreachable := map[driver.Dialect]string{
		driver.Postgres: "postgres://postgres@127.0.0.1:1/test?sslmode=disable",
		driver.MySQL:    "root@tcp(127.0.0.1:1)/test",
	}
	for d, dsn := range unreachable {
		t.Setenv(testdb.EnvVar(d), dsn)
	}
	results, cleanup := Ensure(context.Background())
	defer cleanup()
	if len(results) != len(Servers) {
		t.Fatalf("%d results, want %d", len(results), len(Servers))
	}
	for _, r := range results {
		if r.Started || !errors.Is(r.Err, ErrNoDocker) {
			t.Errorf("%s: started %v, err %v; want not started, ErrNoDocker", r.Dialect, r.Started, r.Err)
		}
		if got := os.Getenv(testdb.EnvVar(r.Dialect)); got != unreachable[r.Dialect] {
			t.Errorf("%s changed to %q", testdb.EnvVar(r.Dialect), got)
		}
	}
}

func TestEnsureUsesReachableServers(t *testing.T) {
	noDocker(t)
	for _, d := range Servers {
		if err := testdb.Ping(d, testdb.ConfiguredDSN(d)); err != nil {
			t.Skipf("no %s server: %v", d, err)
		}
	}
	results, cleanup := Ensure(context.Background())
	defer cleanup()
	for _, r := range results {
		if r.Err != nil || r.Started {
			t.Errorf("%s: started %v, err %v; want the configured server", r.Dialect, r.Started, r.Err)
		}
		if got := os.Getenv(testdb.EnvVar(r.Dialect)); got != r.DSN || got != testdb.ConfiguredDSN(r.Dialect) {
			t.Errorf("%s = %q, want %q", testdb.EnvVar(r.Dialect), got, r.DSN)
		}
	}
}

func TestStartRejectsSQLite(t *testing.T) {
	t.Parallel()
	if _, _, err := Start(context.Background(), driver.SQLite); err == nil {
		t.Fatal("Start(SQLite) succeeded")
	}
}
