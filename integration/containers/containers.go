// Package containers starts throwaway PostgreSQL and MariaDB servers with
// testcontainers-go for the tests, when the configured server does not
// answer and a Docker engine does. It lives in the nested test module so
// that the library's own go.mod does not depend on Docker.
//
// The servers are handed to the tests through the variables
// internal/testkit/testdb reads (OUTBOX_TEST_POSTGRES, OUTBOX_TEST_MYSQL): a test
// binary calls Main from its TestMain, and `go run ./integration/cmd/testservers
// -- CMD...` runs any command (the root module's tests too) with them set.
package containers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/mysql"
	"github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// Images started by Start.
const (
	PostgresImage = "postgres:16-alpine"
	MariaDBImage  = "mariadb:11"
)

// Servers are the dialects that need a server, in the order Ensure checks them.
var Servers = []driver.Dialect{driver.Postgres, driver.MySQL}

// ErrNoDocker is returned when a server is needed and no Docker engine answers.
var ErrNoDocker = errors.New("containers: no Docker engine answers")

// DockerEndpoint returns the network and address of the Docker engine named
// by dockerHost (the DOCKER_HOST value; "" means the default Unix socket
// /var/run/docker.sock). ok is false for a scheme it cannot dial (ssh://,
// npipe://).
func DockerEndpoint(dockerHost string) (network, addr string, ok bool) {
	switch {
	case dockerHost == "":
		return "unix", "/var/run/docker.sock", true
	case strings.HasPrefix(dockerHost, "unix://"):
		return "unix", strings.TrimPrefix(dockerHost, "unix://"), true
	case strings.HasPrefix(dockerHost, "tcp://"):
		return "tcp", strings.TrimPrefix(dockerHost, "tcp://"), true
	}
	return "", "", false
}

// DockerAvailable reports whether a Docker engine accepts a connection at
// DOCKER_HOST (or the default socket) within a second.
func DockerAvailable() bool {
	network, addr, ok := DockerEndpoint(os.Getenv("DOCKER_HOST"))
	if !ok {
		return false
	}
	c, err := net.DialTimeout(network, addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// Start starts a server for d (PostgreSQL: PostgresImage with database
// "test"; MySQL: MariaDBImage with database "test") and returns its DSN in
// the form internal/testkit/testdb expects, and a function that removes the
// container. Testcontainers' reaper also removes it when this process exits.
func Start(ctx context.Context, d driver.Dialect) (dsn string, terminate func(context.Context) error, err error) {
	var c testcontainers.Container
	switch d {
	case driver.Postgres:
		pc, err := postgres.Run(ctx, PostgresImage,
			postgres.WithDatabase("test"), postgres.WithUsername("postgres"), postgres.WithPassword("test"),
			postgres.BasicWaitStrategies())
		if err != nil {
			return "", nil, fmt.Errorf("starting %s: %w", PostgresImage, err)
		}
		c = pc
		dsn, err = pc.ConnectionString(ctx, "sslmode=disable")
		if err != nil {
			_ = pc.Terminate(context.Background())
			return "", nil, err
		}
	case driver.MySQL:
		mc, err := mysql.Run(ctx, MariaDBImage, mysql.WithDatabase("test"), mysql.WithUsername("root"), mysql.WithPassword("test"))
		if err != nil {
			return "", nil, fmt.Errorf("starting %s: %w", MariaDBImage, err)
		}
		c = mc
		dsn, err = mc.ConnectionString(ctx)
		if err != nil {
			_ = mc.Terminate(context.Background())
			return "", nil, err
		}
	default:
		return "", nil, fmt.Errorf("containers: %s needs no server", d)
	}
	return dsn, func(ctx context.Context) error { return c.Terminate(ctx) }, nil
}

// Result is what Ensure found or did for one server.
type Result struct {
	Dialect driver.Dialect
	// DSN is the server's DSN: the configured one, or the container's.
	DSN string
	// Started says a container was started (and its DSN put in the
	// environment).
	Started bool
	// Err is why the server is unavailable (nil if it answers).
	Err error
}

// Ensure checks every server in Servers at its configured DSN
// (testdb.ConfiguredDSN). For each that does not answer it starts a
// container, if a Docker engine answers. It sets the variable
// (testdb.EnvVar) of every available server to its DSN, the container's
// or the configured one, so that internal/testkit/testdb and child processes use it. A server left unavailable is reported in its Result,
// not as an error: the tests then skip (or fail under OUTBOX_TEST_REQUIRE)
// with the reason. cleanup removes the containers started; call it once.
func Ensure(ctx context.Context) (results []Result, cleanup func()) {
	var stops []func(context.Context) error
	cleanup = func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, stop := range stops {
			_ = stop(ctx)
		}
	}
	docker := -1 // unknown until a server is missing
	for _, d := range Servers {
		r := Result{Dialect: d, DSN: testdb.ConfiguredDSN(d)}
		pingErr := testdb.Ping(d, r.DSN)
		if pingErr == nil {
			os.Setenv(testdb.EnvVar(d), r.DSN)
			results = append(results, r)
			continue
		}
		if docker < 0 {
			docker = 0
			if DockerAvailable() {
				docker = 1
			}
		}
		if docker == 0 {
			r.Err = fmt.Errorf("%s at %s: %w; %w", d, testdb.EnvVar(d), pingErr, ErrNoDocker)
			results = append(results, r)
			continue
		}
		dsn, stop, err := Start(ctx, d)
		if err == nil {
			stops = append(stops, stop)
			err = testdb.Ping(d, dsn)
		}
		if err != nil {
			r.Err = fmt.Errorf("%s at %s: %w; container: %w", d, testdb.EnvVar(d), pingErr, err)
			results = append(results, r)
			continue
		}
		r.DSN, r.Started = dsn, true
		os.Setenv(testdb.EnvVar(d), dsn)
		results = append(results, r)
	}
	return results, cleanup
}

// Main is a TestMain body: it runs Ensure (reporting unavailable servers
// and started containers on stderr), runs the tests, removes the
// containers and returns the exit code for os.Exit.
//
//	func TestMain(m *testing.M) { os.Exit(containers.Main(m)) }
func Main(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	results, cleanup := Ensure(ctx)
	cancel()
	defer cleanup()
	for _, r := range results {
		switch {
		case r.Err != nil:
			fmt.Fprintf(os.Stderr, "containers: %v\n", r.Err)
		case r.Started:
			fmt.Fprintf(os.Stderr, "containers: started %s for %s\n", r.Dialect, testdb.EnvVar(r.Dialect))
		}
	}
	return m.Run()
}
