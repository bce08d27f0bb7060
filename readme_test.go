package outbox_test

import (
	"encoding/json"
	"fmt"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
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
