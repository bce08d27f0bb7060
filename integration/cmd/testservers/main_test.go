package main

import (
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

func TestShellQuote(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "root@tcp(127.0.0.1:3306)/test", "postgres://u:it's@h/db?a=1&b=2", `"$HOME" \ ;`} {
		out, err := exec.Command("sh", "-c", "printf %s "+shellQuote(s)).Output()
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != s {
			t.Errorf("shell read %q back as %q", s, out)
		}
	}
}

// Without a server and without Docker, run reports it and runs nothing.
func TestRunFailsBeforeTheCommandWithoutServers(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "docker.sock"))
	t.Setenv(testdb.PostgresEnv, "postgres://postgres@127.0.0.1:1/test?sslmode=disable")
	marker := filepath.Join(t.TempDir(), "ran")
	if code := run([]string{"touch", marker}); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if err := exec.Command("test", "-e", marker).Run(); err == nil {
		t.Error("the command ran")
	}
}

// With the servers up, the command runs with both variables set and its
// exit status is passed on.
func TestRunPassesServersToTheCommand(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "docker.sock"))
	for _, d := range []string{testdb.PostgresEnv, testdb.MySQLEnv} {
		t.Setenv(d, "") // the defaults
	}
	if testdb.Ping(driver.Postgres, testdb.DefaultPostgres) != nil || testdb.Ping(driver.MySQL, testdb.DefaultMySQL) != nil {
		t.Skip("no PostgreSQL or MariaDB server on the defaults")
	}
	script := `test "$OUTBOX_TEST_POSTGRES" = "` + testdb.DefaultPostgres + `" && test "$OUTBOX_TEST_MYSQL" = "` + testdb.DefaultMySQL + `" && exit 3`
	if code := run([]string{"sh", "-c", script}); code != 3 {
		t.Errorf("exit %d, want 3 (the command's, with both variables set)", code)
	}
}
