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

// goBlock matches a ```go fenced block of a Markdown file; group 1 is its
// body.
var goBlock = regexp.MustCompile("(?ms)^```go\n(.*?)^```$")

// docFiles are the Markdown files whose snippets and links are checked:
// the README and every guide under docs/.
func docFiles(t *testing.T) []string {
	t.Helper()
	guides, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(guides) < 10 {
		t.Fatalf("found %d guides in docs/, expected the dozen the README maps", len(guides))
	}
	return append([]string{"README.md", "BENCHMARKS.md"}, guides...)
}

// TestREADMESnippetsCompile compiles every ```go block of README.md and
// of the guides in docs/ (`go build`), each block as a package of its own,
// and checks it is gofmt-formatted: a block is a Go file without its
// package clause (imports, then declarations), so the docs show the
// imports a reader needs, and a wrong signature, a stale name or an unused
// import fails here. The blocks are compiled in this module (through an
// overlay: nothing is written into the tree), so they may import the
// library, its drivers and sarama; errors point at the Markdown file's
// lines.
//
// Why a test and not example_test.go files: the snippets are start-up and
// request-handling code that needs a database and a broker; this keeps
// them in the docs, where a reader looks, and still compiled. The
// runnable, output-checked examples are the Example functions.
func TestREADMESnippetsCompile(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed: %v", err)
	}
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	overlay := map[string]string{}
	var pkgs []string
	total := 0
	for _, name := range docFiles(t) {
		doc, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range goBlock.FindAllSubmatchIndex(doc, -1) {
			i := total
			total++
			body := string(doc[m[2]:m[3]])
			firstLine := 1 + strings.Count(string(doc[:m[2]]), "\n")
			if !strings.HasPrefix(body, "import") {
				t.Errorf("%s:%d: a go block must start with its imports", name, firstLine)
				continue
			}
			if formatted, err := format.Source([]byte(body)); err != nil || string(formatted) != body {
				t.Errorf("%s:%d: the go block is not gofmt-formatted (%v)", name, firstLine, err)
			}
			src := fmt.Sprintf("package snippet%d\n\n//line %s:%d\n%s", i, filepath.ToSlash(name), firstLine, body)
			file := filepath.Join(tmp, fmt.Sprintf("snippet%d.go", i))
			if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
				t.Fatal(err)
			}
			dir := fmt.Sprintf("internal/readmesnippet%d", i)
			overlay[filepath.Join(root, dir, "snippet.go")] = file
			pkgs = append(pkgs, "./"+dir)
		}
	}
	if total < 15 {
		t.Fatalf("found %d go blocks in the docs, expected at least 15: is the pattern still right?", total)
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
		t.Fatalf("the docs' go blocks do not compile: %v\n%s", err, out)
	}
}

// mdLink matches a Markdown link outside code: group 1 its target.
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// anchors returns the GitHub anchors of a Markdown file's headings
// (outside fenced code): lower case, punctuation other than '-' and '_'
// dropped, spaces as '-', a repeated one with "-1", "-2", ...
func anchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fence := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, "```") {
			fence = !fence
		}
		if fence || !regexp.MustCompile(`^#{1,6} `).MatchString(l) {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(l, "#")))
		h = regexp.MustCompile(`[^\p{L}\p{N}_\- ]`).ReplaceAllString(h, "")
		a := strings.ReplaceAll(h, " ", "-")
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// TestDocLinks: every relative link of the README, BENCHMARKS.md and the
// guides points at a file that exists and, with a #fragment, at a heading
// of that file; and the README's map lists every guide in docs/.
func TestDocLinks(t *testing.T) {
	files := docFiles(t)
	texts := map[string]string{}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		texts[filepath.Clean(name)] = string(b)
	}
	checked := 0
	for _, name := range files {
		fence := false
		for n, l := range strings.Split(texts[filepath.Clean(name)], "\n") {
			if strings.HasPrefix(l, "```") {
				fence = !fence
			}
			if fence {
				continue
			}
			for _, m := range mdLink.FindAllStringSubmatch(l, -1) {
				target := m[1]
				if regexp.MustCompile(`^[a-z]+:`).MatchString(target) {
					continue // a URL
				}
				file, frag, _ := strings.Cut(target, "#")
				path := filepath.Clean(name)
				if file != "" {
					path = filepath.Clean(filepath.Join(filepath.Dir(name), file))
				}
				checked++
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s:%d: link %s: %v", name, n+1, target, err)
					continue
				}
				if frag == "" {
					continue
				}
				text, ok := texts[path]
				if !ok {
					b, err := os.ReadFile(path)
					if err != nil {
						t.Errorf("%s:%d: link %s: %v", name, n+1, target, err)
						continue
					}
					text = string(b)
				}
				if !anchors(text)[frag] {
					t.Errorf("%s:%d: link %s: %s has no heading #%s", name, n+1, target, path, frag)
				}
			}
		}
	}
	if checked < 30 {
		t.Fatalf("checked %d links: is the pattern still right?", checked)
	}
	for _, name := range files {
		if strings.HasPrefix(filepath.ToSlash(name), "docs/") && !strings.Contains(texts["README.md"], "]("+filepath.ToSlash(name)+")") {
			t.Errorf("the README's map does not list %s", name)
		}
	}
}

// TestTestCommandCoversEveryModule: the test command (the README's first
// screen and docs/testing.md's "Tests" section), .ci/run's module list and go.work name
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
	// README and docs/testing.md: every `go test -race -count=1 -timeout 30m ...` command line.
	cmds := regexp.MustCompile(`(?m)go test -race -count=1 -timeout 30m ((?:\./[\w./-]*\.\.\.\s*)+)`).FindAllStringSubmatch(readFile("README.md")+readFile(filepath.Join("docs", "testing.md")), -1)
	if len(cmds) < 2 {
		t.Fatalf("found %d test commands, want the README's first screen's and docs/testing.md's", len(cmds))
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
