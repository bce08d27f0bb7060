package testdb

import (
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
)

// TestPingWaitsForASlowServer: a server that accepts a connection but
// answers only after longer than one attempt (here a paused proxy in
// front of PostgreSQL, resumed after 1.5 attempts) is found, not taken
// for no server. With one attempt only, this failed, and the failure,
// cached for the test binary, failed every test of the package (CI).
func TestPingWaitsForASlowServer(t *testing.T) {
	t.Parallel()
	dsn := ConfiguredDSN(driver.Postgres)
	if err := Ping(driver.Postgres, dsn); err != nil {
		unavailable(t, driver.Postgres, err)
	}
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Start(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Pause(true)
	const attempt = 400 * time.Millisecond
	resume := time.AfterFunc(attempt*3/2, func() { p.Pause(false) })
	defer resume.Stop()
	proxied := "postgres://" + url.UserPassword(cfg.User, cfg.Password).String() + "@" + p.Addr() + "/" + url.PathEscape(cfg.Database) + "?sslmode=disable"
	if err := pingWithin("pgx", proxied, attempt, 20*attempt); err != nil {
		t.Fatalf("ping through a server slow to answer: %v", err)
	}
}
