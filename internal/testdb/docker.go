package testdb

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/testcontainers/testcontainers-go/modules/mysql"
	"github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/sqloutbox/outbox/driver"
)

// dockerAvailable reports whether a Docker engine answers on its socket
// (DOCKER_HOST, or /var/run/docker.sock).
func dockerAvailable() bool {
	addr := "/var/run/docker.sock"
	network := "unix"
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		switch {
		case len(h) > 7 && h[:7] == "unix://":
			addr = h[7:]
		case len(h) > 6 && h[:6] == "tcp://":
			network, addr = "tcp", h[6:]
		default:
			return false
		}
	}
	c, err := net.DialTimeout(network, addr, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// startContainer starts a throwaway server with testcontainers-go and
// returns its DSN. The containers live until the test binary exits
// (testcontainers' reaper removes them).
func startContainer(d driver.Dialect) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	switch d {
	case driver.Postgres:
		c, err := postgres.Run(ctx, "postgres:16-alpine",
			postgres.WithDatabase("test"), postgres.WithUsername("postgres"), postgres.WithPassword("test"),
			postgres.BasicWaitStrategies())
		if err != nil {
			return "", err
		}
		return c.ConnectionString(ctx, "sslmode=disable")
	case driver.MySQL:
		c, err := mysql.Run(ctx, "mariadb:11", mysql.WithDatabase("test"), mysql.WithUsername("root"), mysql.WithPassword("test"))
		if err != nil {
			return "", err
		}
		return c.ConnectionString(ctx)
	}
	return "", fmt.Errorf("no container for %s", d)
}
