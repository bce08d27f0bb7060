// Package depgraph checks what the library costs a user's module: a
// scratch module that imports the common path (the root package, driver
// and relay/kafka) must not get the test-only dependencies (kfake,
// testcontainers, Docker, the ORMs) into its go.sum.
//
// The test needs the go command and the module proxy (GOPROXY as the
// environment sets it); it fails, never skips, when it cannot run.
package depgraph

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// forbidden are module path fragments a user of the library's common path
// must not download: test brokers, containers and the ORMs of the
// integration tests.
var forbidden = []string{
	"github.com/twmb/franz-go/pkg/kfake",
	"testcontainers",
	"github.com/moby/",
	"github.com/docker/",
	"gorm.io/",
	"github.com/uptrace/bun",
	"github.com/jmoiron/sqlx",
}

const scratchMain = `package main

import (
	"database/sql"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/relay/kafka"
)

func main() {
	ob, err := driver.New(driver.Config{Dialect: driver.Postgres})
	if err != nil {
		panic(err)
	}
	_ = sql.OpenDB(ob.WrapConnector(nil))
	_ = outbox.NewContext
	_, _ = kafka.NewPublisher(kafka.Config{})
}
`

func TestUserGoSumHasNoTestDependencies(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "go.mod")); err != nil || !bytes.HasPrefix(b, []byte("module github.com/sqloutbox/outbox\n")) {
		t.Fatalf("%s is not the library's module root (%v)", root, err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed: %v", err)
	}
	dir := t.TempDir()
	gomod := "module example.com/scratch\n\ngo 1.26.0\n\nrequire github.com/sqloutbox/outbox v0.0.0\n\nreplace github.com/sqloutbox/outbox => " + root + "\n"
	for name, body := range map[string]string{"go.mod": gomod, "main.go": scratchMain} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), goBin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("mod", "tidy")
	run("build", "-o", os.DevNull, ".")

	f, err := os.Open(filepath.Join(dir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines++
		mod := strings.Fields(sc.Text())[0]
		for _, bad := range forbidden {
			if strings.Contains(mod, bad) {
				t.Errorf("go.sum holds %s (matches %q): %s", mod, bad, sc.Text())
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("the scratch module's go.sum has %d lines", lines)
}

// TestTestSupportStaysApart: internal/ holds what the library runs on, and
// the test support lives apart in internal/testkit (issue 36, item 12: the
// two were mixed, and test helpers that import driver and relay sat beside
// the dialects those import). No package of the library's module outside
// internal/testkit depends on it (tests aside), and no package of
// internal/ outside it imports "testing".
func TestTestSupportStaysApart(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	list := func(args ...string) []string {
		t.Helper()
		cmd := exec.Command("go", append([]string{"list"}, args...)...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		out, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("go list %v: %v\n%s", args, err, stderr)
		}
		return strings.Fields(string(out))
	}
	const testkit = "github.com/sqloutbox/outbox/internal/testkit/"
	var lib []string
	for _, p := range list("./...") {
		if !strings.HasPrefix(p, testkit) {
			lib = append(lib, p)
		}
	}
	if len(lib) < 10 {
		t.Fatalf("go list found only %v in the library's module", lib)
	}
	for _, dep := range list(append([]string{"-deps"}, lib...)...) {
		if strings.HasPrefix(dep, testkit) {
			t.Errorf("a package of the library depends on %s", dep)
		}
	}
	for _, line := range list(append([]string{"-f", "{{.ImportPath}}:{{range .Imports}}{{if eq . \"testing\"}}imports-testing{{end}}{{end}}"}, lib...)...) {
		if strings.HasPrefix(line, "github.com/sqloutbox/outbox/internal/") && strings.HasSuffix(line, ":imports-testing") {
			t.Errorf("%s imports testing: test support belongs in internal/testkit", strings.TrimSuffix(line, ":imports-testing"))
		}
	}
}
