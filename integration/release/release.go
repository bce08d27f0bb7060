package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	modzip "golang.org/x/mod/zip"
)

// ErrNotReleasable wraps every reason a module of go.work cannot be
// released: a replace directive to a directory outside the release, a
// module path that does not match its directory, a go.mod that go.work
// does not list, a requirement cycle, or a module that does not tidy or
// zip.
var ErrNotReleasable = errors.New("not releasable")

// Options configure Build.
type Options struct {
	// Version is the release version, a canonical semantic version
	// ("v1.2.3", "v0.0.0-check.1").
	Version string
	// Root is the repository root, the directory holding go.work.
	// Default: the nearest directory above the working directory that
	// holds one.
	Root string
	// Apply copies the rewritten go.mod and go.sum files back into Root
	// (the release commit's tree).
	Apply bool
	// Out is the module proxy directory. Default: a temporary directory
	// that Cleanup removes.
	Out string
	// Log receives progress lines. Default: discarded.
	Log io.Writer
}

// Module is one module of the release.
type Module struct {
	Dir  string // relative to the repository root, "." for the root module
	Path string // module path
}

// Release is a built release: its modules in dependency order, and the
// proxy that serves them.
type Release struct {
	opts    Options
	Modules []Module
	Proxy   string // the module proxy directory
	tmp     string // temporary directory Cleanup removes
	root    string // module path of the root module
	env     []string
	// found lists the modules whose entries for this version were in the
	// module cache before Build (from an earlier download of a real
	// release, say): Cleanup leaves them as they were.
	found map[string]bool
}

// Build rewrites, tidies and zips every module of go.work at
// opts.Version, in a copy of the repository's tracked files, into a
// file-system module proxy. Errors wrap ErrNotReleasable when the
// repository is at fault, and the go command's or the file system's
// otherwise.
func Build(ctx context.Context, opts Options) (*Release, error) {
	if !semver.IsValid(opts.Version) || semver.Canonical(opts.Version) != opts.Version {
		return nil, fmt.Errorf("version %q is not a canonical semantic version (vX.Y.Z)", opts.Version)
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if opts.Root == "" {
		wd, err := os.Getwd()
		if err != nil {
			return nil, err
		}
		for dir := wd; ; dir = filepath.Dir(dir) {
			if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
				opts.Root = dir
				break
			}
			if filepath.Dir(dir) == dir {
				return nil, fmt.Errorf("no go.work above %s", wd)
			}
		}
	}
	tmp, err := os.MkdirTemp("", "outbox-release-")
	if err != nil {
		return nil, err
	}
	r := &Release{opts: opts, tmp: tmp, Proxy: opts.Out}
	if r.Proxy == "" {
		r.Proxy = filepath.Join(tmp, "proxy")
	}
	if err := r.build(ctx); err != nil {
		r.Cleanup()
		return nil, err
	}
	return r, nil
}

func (r *Release) build(ctx context.Context) error {
	files, err := r.trackedFiles(ctx)
	if err != nil {
		return err
	}
	mods, err := r.modules(files)
	if err != nil {
		return err
	}
	r.found = r.cachedNow(mods)
	r.Modules = mods // Cleanup clears the module cache of them, also after a failure
	src := filepath.Join(r.tmp, "src")
	for _, f := range files {
		if err := copyFile(filepath.Join(r.opts.Root, f), filepath.Join(src, f)); err != nil {
			return err
		}
	}
	if err := r.goEnv(ctx); err != nil {
		return err
	}
	byPath := map[string]Module{}
	for _, m := range mods {
		byPath[m.Path] = m
	}
	for _, m := range mods {
		fmt.Fprintf(r.opts.Log, "release: %s %s\n", m.Path, r.opts.Version)
		dir := filepath.Join(src, m.Dir)
		if err := r.rewrite(dir, m, byPath); err != nil {
			return err
		}
		if out, err := r.goCmd(ctx, dir, "mod", "tidy"); err != nil {
			return fmt.Errorf("%w: %s: go mod tidy: %v\n%s", ErrNotReleasable, m.Dir, err, out)
		}
		if err := r.publish(dir, m); err != nil {
			return err
		}
	}
	if r.opts.Apply {
		for _, m := range mods {
			for _, name := range []string{"go.mod", "go.sum"} {
				from := filepath.Join(src, m.Dir, name)
				if _, err := os.Stat(from); errors.Is(err, os.ErrNotExist) {
					continue
				}
				if err := copyFile(from, filepath.Join(r.opts.Root, m.Dir, name)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// trackedFiles lists the repository's tracked files (what a tag holds),
// relative to the root, with forward slashes.
func (r *Release) trackedFiles(ctx context.Context) ([]string, error) {
	cmd := exec.CommandContext(ctx, "git", "ls-files", "-z")
	cmd.Dir = r.opts.Root
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s: %w", r.opts.Root, err)
	}
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f == "" {
			continue
		}
		if _, err := os.Lstat(filepath.Join(r.opts.Root, f)); errors.Is(err, os.ErrNotExist) {
			continue // deleted in the working tree
		}
		files = append(files, f)
	}
	return files, nil
}

// modules reads go.work and every module it uses, checks that each is
// releasable under the tag scheme, and returns them in dependency order
// (a module after every module of the release it requires).
func (r *Release) modules(files []string) ([]Module, error) {
	data, err := os.ReadFile(filepath.Join(r.opts.Root, "go.work"))
	if err != nil {
		return nil, err
	}
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, err
	}
	var mods []Module
	deps := map[string][]string{} // path -> in-release paths it requires or replaces
	inWork := map[string]bool{}
	for _, u := range wf.Use {
		dir := path.Clean(filepath.ToSlash(u.Path))
		inWork[dir] = true
		gm := filepath.Join(r.opts.Root, dir, "go.mod")
		data, err := os.ReadFile(gm)
		if err != nil {
			return nil, fmt.Errorf("%w: go.work uses %s: %v", ErrNotReleasable, dir, err)
		}
		f, err := modfile.Parse(gm, data, nil)
		if err != nil {
			return nil, err
		}
		if f.Module == nil {
			return nil, fmt.Errorf("%w: %s/go.mod has no module line", ErrNotReleasable, dir)
		}
		m := Module{Dir: dir, Path: f.Module.Mod.Path}
		mods = append(mods, m)
		for _, q := range f.Require {
			deps[m.Path] = append(deps[m.Path], q.Mod.Path)
		}
		for _, rp := range f.Replace {
			deps[m.Path] = append(deps[m.Path], rp.Old.Path)
		}
	}
	for _, m := range mods {
		if m.Dir == "." {
			r.root = m.Path
		}
	}
	if r.root == "" {
		return nil, fmt.Errorf("%w: go.work does not use the repository root", ErrNotReleasable)
	}
	for _, m := range mods {
		if want := r.root + "/" + m.Dir; m.Dir != "." && m.Path != want {
			return nil, fmt.Errorf("%w: module %s lives in %s: its tag %s/vX.Y.Z would name %s", ErrNotReleasable, m.Path, m.Dir, m.Dir, want)
		}
	}
	for _, f := range files {
		if path.Base(f) == "go.mod" && !inWork[path.Dir(f)] {
			return nil, fmt.Errorf("%w: %s is a module that go.work does not use", ErrNotReleasable, f)
		}
	}
	// Dependency order, depth first; a cycle is refused.
	inRelease := map[string]Module{}
	for _, m := range mods {
		inRelease[m.Path] = m
	}
	state := map[string]int{} // 1 visiting, 2 done
	var order []Module
	var visit func(p string, stack []string) error
	visit = func(p string, stack []string) error {
		switch state[p] {
		case 1:
			return fmt.Errorf("%w: requirement cycle %s", ErrNotReleasable, strings.Join(append(stack, p), " -> "))
		case 2:
			return nil
		}
		state[p] = 1
		for _, d := range deps[p] {
			if _, ok := inRelease[d]; ok && d != p {
				if err := visit(d, append(stack, p)); err != nil {
					return err
				}
			}
		}
		state[p] = 2
		order = append(order, inRelease[p])
		return nil
	}
	for _, m := range mods {
		if err := visit(m.Path, nil); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// rewrite drops the replace directives to the release's modules, requires
// them at the release version, and refuses any other replace directive to
// a directory.
func (r *Release) rewrite(dir string, m Module, byPath map[string]Module) error {
	gm := filepath.Join(dir, "go.mod")
	data, err := os.ReadFile(gm)
	if err != nil {
		return err
	}
	f, err := modfile.Parse(gm, data, nil)
	if err != nil {
		return err
	}
	for _, rp := range slices.Clone(f.Replace) {
		if _, ok := byPath[rp.Old.Path]; ok {
			if err := f.DropReplace(rp.Old.Path, rp.Old.Version); err != nil {
				return err
			}
			continue
		}
		if rp.New.Version == "" {
			return fmt.Errorf("%w: %s/go.mod replaces %s with the directory %s, which no user has", ErrNotReleasable, m.Dir, rp.Old.Path, rp.New.Path)
		}
	}
	for _, q := range slices.Clone(f.Require) {
		if _, ok := byPath[q.Mod.Path]; ok {
			if err := f.AddRequire(q.Mod.Path, r.opts.Version); err != nil {
				return err
			}
		}
	}
	f.Cleanup()
	out, err := f.Format()
	if err != nil {
		return err
	}
	return os.WriteFile(gm, out, 0o644)
}

// publish zips the module into the proxy tree
// (<proxy>/<escaped path>/@v/<version>.{zip,mod,info} and list).
func (r *Release) publish(dir string, m Module) error {
	esc, err := module.EscapePath(m.Path)
	if err != nil {
		return err
	}
	at := filepath.Join(r.Proxy, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return err
	}
	v := module.Version{Path: m.Path, Version: r.opts.Version}
	zf, err := os.Create(filepath.Join(at, r.opts.Version+".zip"))
	if err != nil {
		return err
	}
	if err := modzip.CreateFromDir(zf, v, dir); err != nil {
		zf.Close()
		return fmt.Errorf("%w: %s: %v", ErrNotReleasable, m.Dir, err)
	}
	if err := zf.Close(); err != nil {
		return err
	}
	if err := copyFile(filepath.Join(dir, "go.mod"), filepath.Join(at, r.opts.Version+".mod")); err != nil {
		return err
	}
	info, _ := json.Marshal(map[string]string{"Version": r.opts.Version, "Time": time.Now().UTC().Format(time.RFC3339)})
	if err := os.WriteFile(filepath.Join(at, r.opts.Version+".info"), info, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(at, "list"), []byte(r.opts.Version+"\n"), 0o644)
}

// goEnv sets the environment every go command of the release runs in:
// outside any workspace, the release's proxy first, then the user's, and
// the checksum database off for the release's modules only.
func (r *Release) goEnv(ctx context.Context) error {
	out, err := exec.CommandContext(ctx, "go", "env", "GOPROXY", "GOFLAGS").Output()
	if err != nil {
		return fmt.Errorf("go env: %w", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	proxy, flags := lines[0], ""
	if len(lines) > 1 {
		flags = lines[1]
	}
	chain := "file://" + filepath.ToSlash(r.Proxy)
	if proxy != "" && proxy != "off" {
		chain += "," + proxy
	}
	r.env = append(os.Environ(), "GOWORK=off", "GOPROXY="+chain, "GONOSUMDB="+r.root, "GOFLAGS="+strings.TrimSpace(flags+" -modcacherw"))
	return nil
}

func (r *Release) goCmd(ctx context.Context, dir string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = r.env
	return cmd.CombinedOutput()
}

// scratchMain imports a package of each module the check gets.
const scratchMain = `package main

import (
	"fmt"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
	inboxkafka "github.com/sqloutbox/outbox/inbox/kafka"
	outboxotel "github.com/sqloutbox/outbox/otel"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
	natspub "github.com/sqloutbox/outbox/relay/nats"
)

func main() {
	_ = outbox.Emit
	_ = driver.Migrate
	_ = relay.New
	_ = kafka.NewPublisher
	_ = natspub.NewPublisher
	_ = inboxkafka.NewRunner
	_ = outboxotel.Capture
	fmt.Println("built against the release")
}
`

// Check consumes the release as a user would, in a scratch module outside
// the repository (see the package documentation).
func (r *Release) Check(ctx context.Context) error {
	dir := filepath.Join(r.tmp, "scratch")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	run := func(args ...string) ([]byte, error) {
		out, err := r.goCmd(ctx, dir, args...)
		if err != nil {
			return out, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
		}
		return out, nil
	}
	if _, err := run("mod", "init", "example.com/scratch"); err != nil {
		return err
	}
	get := []string{"get"}
	for _, p := range []string{"", "/relay/nats", "/inbox/kafka", "/otel"} {
		get = append(get, r.root+p+"@"+r.opts.Version)
	}
	if _, err := run(get...); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(scratchMain), 0o644); err != nil {
		return err
	}
	if _, err := run("mod", "tidy"); err != nil {
		return err
	}
	gm, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	if bytes.Contains(gm, []byte("replace")) {
		return fmt.Errorf("the scratch module's go.mod has a replace directive:\n%s", gm)
	}
	bin := filepath.Join(r.tmp, "bin")
	if _, err := run("build", "-o", filepath.Join(bin, "scratch"), "."); err != nil {
		return err
	}
	if out, err := exec.CommandContext(ctx, filepath.Join(bin, "scratch")).CombinedOutput(); err != nil {
		return fmt.Errorf("the scratch program: %w\n%s", err, out)
	}
	r.env = append(r.env, "GOBIN="+bin)
	if _, err := run("install", r.root+"/cmd/outbox@"+r.opts.Version); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "outbox"), "--version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("outbox --version: %w\n%s", err, out)
	}
	// "outbox vX.Y.Z, go1.26.8": the module version the build recorded.
	got := strings.TrimPrefix(strings.TrimSpace(string(out)), "outbox ")
	if v, _, _ := strings.Cut(got, ","); v != r.opts.Version {
		return fmt.Errorf("outbox --version printed %q, want the version %s", out, r.opts.Version)
	}
	fmt.Fprintf(r.opts.Log, "release: outbox --version: %s", out)
	return nil
}

// Tags returns the tags of the release, root first.
func (r *Release) Tags() []string {
	var tags []string
	for _, m := range r.Modules {
		if m.Dir == "." {
			tags = append([]string{r.opts.Version}, tags...)
		} else {
			tags = append(tags, m.Dir+"/"+r.opts.Version)
		}
	}
	return tags
}

// Cleanup removes the temporary directory and what the go commands put in
// the module cache for this version of the release's modules (it would
// otherwise be served instead of a later build of the same version). It
// leaves the cache as Build found it: a module whose entries for this
// version were already there keeps them.
func (r *Release) Cleanup() {
	cache := moduleCache()
	for _, m := range r.Modules {
		if cache == "" || r.found[m.Path] {
			continue
		}
		dir, dl, ok := cachePaths(cache, m.Path)
		if !ok {
			continue
		}
		_ = os.RemoveAll(dir + "@" + r.opts.Version)
		for _, ext := range []string{".zip", ".mod", ".info", ".ziphash", ".lock", ".partial"} {
			_ = os.Remove(filepath.Join(dl, r.opts.Version+ext))
		}
	}
	_ = os.RemoveAll(r.tmp)
}

// cachedNow returns the modules of mods that the module cache holds at
// this version (extracted, or downloaded).
func (r *Release) cachedNow(mods []Module) map[string]bool {
	found := map[string]bool{}
	cache := moduleCache()
	if cache == "" {
		return found
	}
	for _, m := range mods {
		dir, dl, ok := cachePaths(cache, m.Path)
		if !ok {
			continue
		}
		for _, p := range []string{dir + "@" + r.opts.Version, filepath.Join(dl, r.opts.Version+".zip"), filepath.Join(dl, r.opts.Version+".mod")} {
			if _, err := os.Stat(p); err == nil {
				found[m.Path] = true
			}
		}
	}
	return found
}

// moduleCache is `go env GOMODCACHE` ("" if the go command fails).
func moduleCache() string {
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// cachePaths returns where the module cache keeps module path's versions:
// the extracted trees' prefix (dir + "@" + version) and the download
// directory (cache/download/<path>/@v).
func cachePaths(cache, path string) (dir, dl string, ok bool) {
	esc, err := module.EscapePath(path)
	if err != nil {
		return "", "", false
	}
	return filepath.Join(cache, filepath.FromSlash(esc)), filepath.Join(cache, "cache", "download", filepath.FromSlash(esc), "@v"), true
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	st, err := os.Stat(from)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	return os.WriteFile(to, data, st.Mode().Perm())
}
