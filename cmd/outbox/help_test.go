package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

var update = flag.Bool("update", false, "rewrite the golden help texts under testdata")

// TestHelpGolden: the help texts of the commands below are the files
// under testdata/help (go test -run TestHelpGolden -update rewrites them;
// review the diff). It pins what a user reads: flag value names (pflag
// takes a `backquoted` word of a usage string as the value name, which
// once printed "--nats-stream outbox nats stream create"), a command's own
// flags under "Flags:", not "Global Flags:", and the deprecated aliases
// hidden.
func TestHelpGolden(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"relay"},
		{"admin"},
		{"nats", "stream", "create"},
		{"nats", "stream", "check"},
		{"rabbitmq", "declare"},
		{"rabbitmq", "check"},
		{"kafka", "state-topic", "create"},
		{"kafka", "state-topic", "check"},
		{"wal", "status"},
		{"wal", "drop"},
		{"wal", "create"},
		{"wal", "ack-loss"},
	} {
		name := strings.Join(args, "_")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := expect(t, cli(t, append(args, "--help")...), 0)
			file := filepath.Join("testdata", "help", name+".txt")
			if *update {
				if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(file, []byte(r.stdout), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(file)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if r.stdout != string(want) {
				t.Errorf("outbox %s --help differs from %s (rerun with -update and review the diff):\n%s", strings.Join(args, " "), file, r.stdout)
			}
		})
	}
}

// TestNoBackquotesInFlagUsage: no flag of any command has a backquote in
// its usage string (pflag would print the quoted words as the flag's value
// name).
func TestNoBackquotesInFlagUsage(t *testing.T) {
	t.Parallel()
	root := newRootCmd(io.Discard, io.Discard, func(string) string { return "" })
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if strings.Contains(f.Usage, "`") {
				t.Errorf("%s --%s: usage %q has a backquote", c.CommandPath(), f.Name, f.Usage)
			}
		})
		c.PersistentFlags().VisitAll(func(f *pflag.Flag) {
			if strings.Contains(f.Usage, "`") {
				t.Errorf("%s --%s: usage %q has a backquote", c.CommandPath(), f.Name, f.Usage)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// TestNATSStreamFlagAlias: provisioning takes the stream's name as
// --nats-stream, the relay's flag; the old --stream still sets it.
func TestNATSStreamFlagAlias(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "OUTBOX"},
		{[]string{"--nats-stream", "ORDERS"}, "ORDERS"},
		{[]string{"--stream", "LEGACY"}, "LEGACY"},
	} {
		root := newRootCmd(io.Discard, io.Discard, func(string) string { return "" })
		cmd, _, err := root.Find([]string{"nats", "stream", "create"})
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.ParseFlags(c.args); err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if got := cmd.Flags().Lookup("nats-stream").Value.String(); got != c.want {
			t.Errorf("%v: --nats-stream %q, want %q", c.args, got, c.want)
		}
	}
}
