// Command outbox operates the transactional outbox of a database: it
// applies and inspects the schema, runs the standalone relay service that
// publishes committed events to Kafka, NATS JetStream, RabbitMQ or Redis
// Streams, reports the backlog, lists, retries or skips dead letters, and
// dead-letters pending events whose route does not exist.
//
//	outbox --dsn postgres://app@db:5432/app migrate apply
//	outbox --dsn postgres://app@db:5432/app relay --brokers kafka:9092
//	outbox --dsn sqlite:/var/lib/app/app.db stats --json
//	outbox --dsn 'app:secret@tcp(db:3306)/app' dead retry --aggregate order/42 --dry-run
//	OUTBOX_SASL_PASSWORD_FILE=/run/secrets/kafka outbox relay --brokers kafka:9093 \
//	    --tls-ca-file ca.pem --sasl-mechanism SCRAM-SHA-512 --sasl-user outbox
//	OUTBOX_BROKER=amqps://relay:secret@rabbit:5671/prod outbox relay --exchange orders
//	outbox relay --broker nats://nats:4222 --nats-creds-file /run/secrets/relay.creds
//	outbox relay --brokers kafka:9092 --max-attempts 10 --retry-max 1m --dead-letter-policy skip
//	outbox --version
//
// Exit codes: 0 success; 1 runtime or database error; 2 usage error (bad
// flags, missing DSN, bad selector); 3 `migrate status` found the schema
// not up to date. Errors are one line on stderr, with any password in the
// DSN redacted.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sqloutbox/outbox/driver"
)

// Exit codes scripts can rely on.
const (
	exitOK       = 0
	exitRuntime  = 1
	exitUsage    = 2
	exitOutdated = 3
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line args and returns the process exit code.
// SIGINT and SIGTERM cancel ctx's child context (the relay then shuts down
// cleanly); cancelling ctx does the same, which is how tests stop it.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runEnv(ctx, args, stdout, stderr, os.Getenv)
}

// runEnv is run reading environment variables through getenv (tests give
// their own, so that they can run in parallel).
func runEnv(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = context.WithValue(ctx, restoreSignalsKey{}, stop)
	stderr = &lockedWriter{w: stderr}
	root := newRootCmd(stdout, stderr, getenv)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		// Cobra's own errors: unknown command, bad flag, wrong arguments.
		ee = &exitError{code: exitUsage, msg: err.Error()}
	}
	if ee.msg != "" {
		msg := oneLine(ee.msg)
		if ee.code == exitUsage && cmd != nil {
			msg += fmt.Sprintf(" (see '%s --help')", cmd.CommandPath())
		}
		fmt.Fprintln(stderr, "outbox: "+msg)
	}
	return ee.code
}

// restoreSignalsKey holds, in the command's context, the function that
// restores default signal handling: after the first SIGINT or SIGTERM
// started a clean shutdown, a second one kills the process.
type restoreSignalsKey struct{}

func restoreSignals(ctx context.Context) {
	if f, ok := ctx.Value(restoreSignalsKey{}).(context.CancelFunc); ok {
		f()
	}
}

// exitError carries an exit code and the one-line message to print ("" to
// print nothing, e.g. for `migrate status` exiting 3).
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &exitError{code: exitUsage, msg: fmt.Sprintf(format, args...)}
}

// oneLine trims the library's repeated "outbox: " prefixes and folds the
// message onto one line. A message that starts with a package's own
// prefix ("outbox/nats: ") keeps it as "nats: ", after the "outbox: " the
// command prints (it printed "outbox: outbox/nats: ").
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	for strings.HasPrefix(s, "outbox: ") {
		s = strings.TrimPrefix(s, "outbox: ")
	}
	if rest, ok := strings.CutPrefix(s, "outbox/"); ok {
		if i := strings.Index(rest, ": "); i > 0 && !strings.Contains(rest[:i], " ") {
			s = rest
		}
	}
	return strings.ReplaceAll(s, ": outbox: ", ": ")
}

// lockedWriter serializes writes: the relay's goroutines log concurrently.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// app holds the global flags and the output streams of one invocation.
type app struct {
	stdout, stderr io.Writer
	getenv         func(string) string

	dsn     string
	table   string
	json    bool
	timeout time.Duration

	// fromEnv records the flags applyEnv set from their variables (the
	// rest were given on the command line or not at all).
	fromEnv map[string]bool
	// secrets are passwords besides the DSN's (the broker's) that
	// redact scrubs from every message.
	secrets []string
}

const envAnnotation = "outbox_env"

// envFlag records that flag name of fs falls back to the environment
// variable env, and mentions it in the flag's help.
func envFlag(fs *pflag.FlagSet, name, env string) {
	f := fs.Lookup(name)
	f.Usage += " (env " + env + ")"
	_ = fs.SetAnnotation(name, envAnnotation, []string{env})
}

// newRootCmd builds the outbox command tree writing to stdout and stderr
// and reading environment variables through getenv.
func newRootCmd(stdout, stderr io.Writer, getenv func(string) string) *cobra.Command {
	a := &app{stdout: stdout, stderr: stderr, getenv: getenv}
	root := &cobra.Command{
		Use:   "outbox",
		Short: "Operate a transactional outbox: schema, relay, backlog and dead letters",
		Long: `outbox operates the outbox table of a database/sql application that emits
events with github.com/sqloutbox/outbox: it applies and inspects the schema,
runs the standalone relay that publishes committed events to Kafka, NATS
JetStream, RabbitMQ or Redis Streams, reports the backlog, and lists,
retries or skips dead letters.

The database is chosen by --dsn (or OUTBOX_DSN):
  postgres://user:pass@host:5432/db?sslmode=disable   PostgreSQL (pgx)
  mysql://user:pass@host:3306/db  or  user:pass@tcp(host:3306)/db   MySQL/MariaDB
  sqlite:/path/app.db  or  file:/path/app.db  or  /path/app.db      SQLite

Exit codes: 0 ok, 1 runtime or database error, 2 usage error,
3 'migrate status' found the schema not up to date.`,
		SilenceErrors:     true,
		SilenceUsage:      true,
		Args:              cobra.NoArgs,
		RunE:              groupRunE,
		PersistentPreRunE: a.applyEnv,
		// "outbox [command]" only: the root does nothing by itself.
		DisableFlagsInUseLine: true,
		Version:               version(),
	}
	root.SetVersionTemplate("outbox {{.Version}}\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &exitError{code: exitUsage, msg: err.Error()}
	})
	root.CompletionOptions.HiddenDefaultCmd = true

	pf := root.PersistentFlags()
	pf.StringVar(&a.dsn, "dsn", "", "database to operate on: postgres://... or host=... dbname=... (libpq keyword/value), mysql://... or user:pass@tcp(host:port)/db, sqlite:PATH")
	envFlag(pf, "dsn", "OUTBOX_DSN")
	pf.StringVar(&a.table, "table", driver.DefaultTable, "outbox table, name or schema.name")
	envFlag(pf, "table", "OUTBOX_TABLE")
	pf.BoolVar(&a.json, "json", false, "print machine-readable JSON on stdout")
	pf.DurationVar(&a.timeout, "timeout", 30*time.Second, "time limit of the command's database work (relay: of its start-up checks)")
	envFlag(pf, "timeout", "OUTBOX_TIMEOUT")

	root.AddCommand(a.migrateCmd(), a.relayCmd(), a.statsCmd(), a.deadCmd(), a.pendingCmd())
	root.AddCommand(a.devBrokerCmd())
	root.AddCommand(a.inboxCmd(), a.adminCmd())
	root.AddCommand(a.natsCmd(), a.rabbitmqCmd(), a.kafkaCmd(), a.walCmd())
	return root
}

// groupRunE makes a command group called without a subcommand a usage
// error (exit 2) after printing its help.
func groupRunE(cmd *cobra.Command, _ []string) error {
	cmd.SetOut(cmd.ErrOrStderr())
	_ = cmd.Help()
	return usageErrorf("%s needs a subcommand", cmd.CommandPath())
}

// applyEnv fills every flag not given on the command line from its
// environment variable, if set.
func (a *app) applyEnv(cmd *cobra.Command, _ []string) error {
	var err error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		envs := f.Annotations[envAnnotation]
		if err != nil || f.Changed || len(envs) == 0 {
			return
		}
		v := a.getenv(envs[0])
		if v == "" {
			return
		}
		if serr := f.Value.Set(v); serr != nil {
			shown := v
			if f.Name == "dsn" {
				shown = redactDSN(v)
			}
			err = usageErrorf("invalid %s=%q: %v", envs[0], shown, serr)
			return
		}
		f.Changed = true
		if a.fromEnv == nil {
			a.fromEnv = map[string]bool{}
		}
		a.fromEnv[f.Name] = true
	})
	if err != nil {
		return err
	}
	if a.timeout <= 0 {
		return usageErrorf("--timeout must be positive, got %v", a.timeout)
	}
	return nil
}

// wrap turns the error of a command's work into an exitError: usage
// mistakes detected late (invalid table name, relay settings, dead-letter
// selector) exit 2, everything else 1, with the DSN's password redacted.
func (a *app) wrap(fn func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := fn(cmd, args)
		if err == nil {
			return nil
		}
		var ee *exitError
		if !errors.As(err, &ee) {
			ee = &exitError{code: exitRuntime, msg: err.Error()}
			if isConfigError(err) {
				ee.code = exitUsage
			}
			if errors.Is(err, context.DeadlineExceeded) {
				ee.msg += fmt.Sprintf(" (timed out after %v; see --timeout)", a.timeout)
			}
		}
		ee.msg = a.redact(ee.msg)
		return ee
	}
}
