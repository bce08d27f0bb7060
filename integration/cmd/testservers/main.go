// Command testservers makes sure the PostgreSQL and MariaDB servers the
// tests need are there: a server that does not answer at its configured
// DSN (OUTBOX_TEST_POSTGRES, OUTBOX_TEST_MYSQL, or internal/testkit/testdb's
// defaults) is started as a container with testcontainers-go, if a Docker
// engine answers.
//
// With a command after "--" it runs the command with both variables set and
// exits with its status, removing the containers first:
//
//	go run ./integration/cmd/testservers -- go test -race -count=1 ./... ./integration/...
//
// Without one it prints the variables as shell assignments and keeps the
// containers until interrupted (testcontainers' reaper removes them when
// this process exits):
//
//	go run ./integration/cmd/testservers
//
// It exits 1 when a server is still unavailable (no Docker engine, or the
// container failed), before running anything.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/sqloutbox/outbox/integration/containers"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fmt.Fprintln(os.Stderr, "usage: testservers [-- command [args...]]")
		os.Exit(2)
	}
	os.Exit(run(args))
}

func run(args []string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	results, cleanup := containers.Ensure(ctx)
	cancel()
	defer cleanup()
	failed := false
	for _, r := range results {
		if r.Err != nil {
			fmt.Fprintf(os.Stderr, "testservers: %v\n", r.Err)
			failed = true
		} else if r.Started {
			fmt.Fprintf(os.Stderr, "testservers: started a container for %s\n", r.Dialect)
		}
	}
	if failed {
		return 1
	}
	if len(args) == 0 {
		for _, r := range results {
			fmt.Printf("export %s=%s\n", testdb.EnvVar(r.Dialect), shellQuote(r.DSN))
		}
		fmt.Fprintln(os.Stderr, "testservers: servers ready; interrupt to remove the containers")
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		<-sig
		return 0
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// The child inherits the environment Ensure updated.
	signal.Ignore(os.Interrupt) // the child gets the terminal's interrupt and ends; then we clean up
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &exit):
		return exit.ExitCode()
	default:
		fmt.Fprintf(os.Stderr, "testservers: %v\n", err)
		return 1
	}
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	out := []byte{'\''}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, `'\''`...)
		} else {
			out = append(out, s[i])
		}
	}
	return string(append(out, '\''))
}
