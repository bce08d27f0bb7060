package outbox_test

import (
	"encoding/json"
	"fmt"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// goBlock matches a ```go fenced block of README.md; group 1 is its body.
var goBlock = regexp.MustCompile("(?ms)^```go\n(.*?)^```$")

// TestREADMESnippetsCompile compiles every ```go block of README.md
// (`go build`), each block as a package of its own, and checks it is
// gofmt-formatted: a block is a Go file without its package clause
// (imports, then declarations), so the README shows the imports a reader
// needs, and a wrong signature, a stale name or an unused import fails
// here. The blocks are compiled in this module (through an overlay:
// nothing is written into the tree), so they may import the library, its
// drivers and sarama; errors point at README.md's lines.
//
// Why a test and not example_test.go files: the README's snippets are
// start-up and request-handling code that needs a database and a broker;
// this keeps them in the README, where a reader looks, and still compiled.
// The runnable, output-checked examples are the Example functions.
func TestREADMESnippetsCompile(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed: %v", err)
	}
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	blocks := goBlock.FindAllSubmatchIndex(readme, -1)
	if len(blocks) < 5 {
		t.Fatalf("found %d go blocks in README.md, expected at least 5: is the pattern still right?", len(blocks))
	}
	tmp := t.TempDir()
	overlay := map[string]string{}
	var pkgs []string
	for i, m := range blocks {
		body := string(readme[m[2]:m[3]])
		if !strings.HasPrefix(body, "import") {
			line := 1 + strings.Count(string(readme[:m[2]]), "\n")
			t.Errorf("README.md:%d: a go block must start with its imports", line)
			continue
		}
		firstLine := 1 + strings.Count(string(readme[:m[2]]), "\n")
		if formatted, err := format.Source([]byte(body)); err != nil || string(formatted) != body {
			t.Errorf("README.md:%d: the go block is not gofmt-formatted (%v)", firstLine, err)
		}
		src := fmt.Sprintf("package snippet%d\n\n//line README.md:%d\n%s", i, firstLine, body)
		file := filepath.Join(tmp, fmt.Sprintf("snippet%d.go", i))
		if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		dir := fmt.Sprintf("internal/readmesnippet%d", i)
		overlay[filepath.Join(root, dir, "snippet.go")] = file
		pkgs = append(pkgs, "./"+dir)
	}
	ov, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	ovFile := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(ovFile, ov, 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), goBin, append([]string{"build", "-overlay=" + ovFile}, pkgs...)...)
	cmd.Dir = root
	// In the repository's workspace whatever the caller's GOWORK says: a
	// block may import any of its modules (the test kit's, for one).
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(root, "go.work"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("README.md's go blocks do not compile: %v\n%s", err, out)
	}
}

// TestTestCommandCoversEveryModule: the README's test command (its first
// screen and its "Tests" section), .ci/run's module list and go.work name
// the same modules, so a module added to the workspace cannot be left out
// of the tests (a nested module is not matched by its parent's ./...).
func TestTestCommandCoversEveryModule(t *testing.T) {
	readFile := func(name string) string {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// go.work: the `use` entries, as test patterns.
	var work []string
	for _, m := range regexp.MustCompile(`(?m)^\s+(\.(?:/[\w./-]+)?)\s*$`).FindAllStringSubmatch(readFile("go.work"), -1) {
		p := "./..."
		if m[1] != "." {
			p = m[1] + "/..."
		}
		work = append(work, p)
	}
	sortedJoin := func(ps []string) string {
		c := append([]string(nil), ps...)
		slices.Sort(c)
		return strings.Join(c, " ")
	}
	want := sortedJoin(work)
	if len(work) < 2 {
		t.Fatalf("go.work lists %d modules: the pattern found no use entries", len(work))
	}
	// README: every `go test -race -count=1 -timeout 30m ...` command line.
	cmds := regexp.MustCompile(`(?m)go test -race -count=1 -timeout 30m ((?:\./[\w./-]*\.\.\.\s*)+)`).FindAllStringSubmatch(readFile("README.md"), -1)
	if len(cmds) < 2 {
		t.Fatalf("found %d README test commands, want the first screen's and the Tests section's", len(cmds))
	}
	for _, c := range cmds {
		if got := sortedJoin(strings.Fields(c[1])); got != want {
			t.Errorf("README test command %q\n names %s\n go.work %s", strings.TrimSpace(c[0]), got, want)
		}
	}
	// .ci/run: modules=(...), each "." -> ./..., else ./m/...
	m := regexp.MustCompile(`(?m)^modules=\(([^)]*)\)`).FindStringSubmatch(readFile(filepath.Join(".ci", "run")))
	if m == nil {
		t.Fatal(".ci/run has no modules=(...) list")
	}
	var ci []string
	for _, mod := range strings.Fields(m[1]) {
		if mod == "." {
			ci = append(ci, "./...")
		} else {
			ci = append(ci, "./"+mod+"/...")
		}
	}
	if got := sortedJoin(ci); got != want {
		t.Errorf(".ci/run's modules name %s\n go.work %s", got, want)
	}
}
