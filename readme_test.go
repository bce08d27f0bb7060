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
	args := []string{"build", "-overlay=" + ovFile}
	if raceBuild {
		// The enclosing `go test -race` compiled every dependency with
		// -race: building the snippets the same way reuses those packages
		// from the build cache. Without it, a cold cache compiled them all
		// a second time (133 s of the suite's 2 cores).
		args = append(args, "-race")
	}
	cmd := exec.CommandContext(t.Context(), goBin, append(args, pkgs...)...)
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

// testCommand is the whole test suite's command: the README's first
// screen shows it, docs/testing.md explains it and .ci/run runs it.
const testCommand = "go test -race -count=1 -timeout 30m work"

// TestTestCommandCoversEveryModule: the test command of the README's first
// screen and of docs/testing.md is testCommand; .ci/run runs exactly it;
// .ci/run's module list (its per-module go mod tidy) names the modules
// go.work lists; and the `work` pattern selects the same packages as
// those modules' ./m/... patterns (a nested module is not matched by its
// parent's ./...), so a module added to the workspace cannot be left out
// of the tests.
func TestTestCommandCoversEveryModule(t *testing.T) {
	t.Parallel()
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
	// README and docs/testing.md: every `go test -race -count=1 -timeout
	// 30m ...` command line (the whole suite's) is testCommand.
	anyCmd := regexp.MustCompile(`(?m)go test -race -count=1 -timeout 30m[^#\n]*?\s*(?:#|$)`)
	for _, name := range []string{"README.md", filepath.Join("docs", "testing.md")} {
		cmds := anyCmd.FindAllString(readFile(name), -1)
		if len(cmds) == 0 {
			t.Errorf("%s has no test command", name)
		}
		for _, c := range cmds {
			if got := strings.TrimSpace(strings.TrimSuffix(c, "#")); got != testCommand {
				t.Errorf("%s: test command %q, want %q", name, got, testCommand)
			}
		}
	}
	ci := readFile(filepath.Join(".ci", "run"))
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(testCommand) + `$`).MatchString(ci) {
		t.Errorf(".ci/run does not run the README's test command %q on a line of its own", testCommand)
	}
	// .ci/run: modules=(...), each "." -> ./..., else ./m/...
	m := regexp.MustCompile(`(?m)^modules=\(([^)]*)\)`).FindStringSubmatch(ci)
	if m == nil {
		t.Fatal(".ci/run has no modules=(...) list")
	}
	var mods []string
	for _, mod := range strings.Fields(m[1]) {
		if mod == "." {
			mods = append(mods, "./...")
		} else {
			mods = append(mods, "./"+mod+"/...")
		}
	}
	if got := sortedJoin(mods); got != want {
		t.Errorf(".ci/run's modules name %s\n go.work %s", got, want)
	}
	// `go list work` against the modules' patterns: the same packages.
	goList := func(patterns ...string) []string {
		cmd := exec.CommandContext(t.Context(), "go", append([]string{"list"}, patterns...)...)
		cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(must(os.Getwd()), "go.work"))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list %s: %v", strings.Join(patterns, " "), err)
		}
		pkgs := strings.Fields(string(out))
		slices.Sort(pkgs)
		return pkgs
	}
	byWork, byModules := goList("work"), goList(work...)
	if !slices.Equal(byWork, byModules) {
		t.Errorf("go list work selects %d packages, the modules' patterns %d:\n%v\n%v", len(byWork), len(byModules), byWork, byModules)
	}
	if len(byWork) < 40 {
		t.Errorf("go list work selects %d packages, expected the whole workspace (56 when written)", len(byWork))
	}
}

// must returns v, panicking on err (only for calls that cannot fail in a
// test's working directory).
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestREADMEFirstScreen: what a new reader needs before scrolling sits
// before the README's first section: that no version is tagged (build
// from a clone), the test command, and a first snippet that keeps the
// *driver.Outbox Register returns and hands it to relay.New (the snippet
// once dropped it, and a reader could not start a relay from it).
func TestREADMEFirstScreen(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	first, _, ok := strings.Cut(string(b), "\n## ")
	if !ok {
		t.Fatal("README.md has no ## section")
	}
	for _, want := range []string{"No version is tagged", testCommand, "relay.New(ob, db,", "*driver.Outbox, error)"} {
		if !strings.Contains(first, want) {
			t.Errorf("the README's first screen (before its first section) lacks %q", want)
		}
	}
	if n := strings.Count(first, "\n"); n > 90 {
		t.Errorf("the README's first screen is %d lines", n)
	}
}
