package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRelease is the release check CI runs: every module of go.work is
// built at one version into a file-system module proxy, and a scratch
// module outside the repository, with GOWORK=off and no replace, go gets
// the root module, relay/nats, inbox/kafka and otel, builds and runs a
// program importing them, and go installs cmd/outbox at that version,
// whose --version prints it; then a program built there from the release
// alone publishes 100 events to each of Kafka (in-process), NATS,
// RabbitMQ and Redis and consumes them through the inbox (FirstEvents).
// The version is new at every run, so that the module cache never serves
// an older build of it.
func TestRelease(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	version := "v0.0.0-check." + strconv.FormatInt(time.Now().UnixNano(), 10)
	before := modStatus(t, ctx)
	var log strings.Builder
	rel, err := Build(ctx, Options{Version: version, Log: &log})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	defer rel.Cleanup()
	if len(rel.Modules) < 12 {
		t.Errorf("released %d modules (%v), want every module of go.work", len(rel.Modules), rel.Modules)
	}
	if err := rel.Check(ctx); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	// From go get to first events: 100 on each broker, through the inbox.
	out, err := rel.FirstEvents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"kafka", "nats", "rabbitmq", "redis"} {
		if !strings.Contains(out, "\n"+b+" 100 <nil>\n") && !strings.HasPrefix(out, b+" 100 <nil>\n") {
			t.Errorf("%s: not 100 effects through the inbox:\n%s", b, out)
		}
	}
	tags := rel.Tags()
	if tags[0] != version || !contains(tags, "relay/nats/"+version) || !contains(tags, "cmd/outbox/"+version) {
		t.Errorf("tags %v: want %s first and <dir>/%s for each nested module", tags, version, version)
	}
	// The check did not touch the working tree's go.mod and go.sum files.
	if after := modStatus(t, ctx); after != before {
		t.Errorf("go.mod/go.sum files changed in the working tree: before\n%s\nafter\n%s", before, after)
	}
}

// modStatus is git's short status of the working tree's go.mod and go.sum
// files.
func modStatus(t *testing.T, ctx context.Context) string {
	t.Helper()
	out, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--", "*go.mod", "*go.sum").Output()
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestNotReleasable: a repository whose modules could not be consumed
// from their tags is refused before anything is built, with the reason.
func TestNotReleasable(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("git"); err != nil {
		t.Fatalf("git is needed: %v", err)
	}
	for _, c := range []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"replace to a directory outside", map[string]string{
			"go.work":    "go 1.26\n\nuse (\n\t.\n\t./sub\n)\n",
			"go.mod":     "module example.com/r\n\ngo 1.26\n",
			"sub/go.mod": "module example.com/r/sub\n\ngo 1.26\n\nrequire example.com/x v0.0.0\n\nreplace example.com/x => ../../x\n",
		}, "replaces example.com/x with the directory ../../x"},
		{"module path unlike its directory", map[string]string{
			"go.work":    "go 1.26\n\nuse (\n\t.\n\t./sub\n)\n",
			"go.mod":     "module example.com/r\n\ngo 1.26\n",
			"sub/go.mod": "module example.com/other\n\ngo 1.26\n",
		}, "its tag sub/vX.Y.Z would name example.com/r/sub"},
		{"a module go.work does not use", map[string]string{
			"go.work":      "go 1.26\n\nuse .\n",
			"go.mod":       "module example.com/r\n\ngo 1.26\n",
			"tools/go.mod": "module example.com/r/tools\n\ngo 1.26\n",
		}, "tools/go.mod is a module that go.work does not use"},
		{"a requirement cycle", map[string]string{
			"go.work":  "go 1.26\n\nuse (\n\t.\n\t./a\n\t./b\n)\n",
			"go.mod":   "module example.com/r\n\ngo 1.26\n",
			"a/go.mod": "module example.com/r/a\n\ngo 1.26\n\nrequire example.com/r/b v0.0.0\n",
			"b/go.mod": "module example.com/r/b\n\ngo 1.26\n\nrequire example.com/r/a v0.0.0\n",
		}, "requirement cycle"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			root := t.TempDir()
			for name, body := range c.files {
				p := filepath.Join(root, filepath.FromSlash(name))
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for _, args := range [][]string{{"init", "-q"}, {"add", "-A"}} {
				cmd := exec.Command("git", args...)
				cmd.Dir = root
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("git %v: %v\n%s", args, err, out)
				}
			}
			rel, err := Build(context.Background(), Options{Version: "v1.0.0", Root: root})
			if err == nil {
				rel.Cleanup()
				t.Fatal("Build succeeded, want ErrNotReleasable")
			}
			if !errors.Is(err, ErrNotReleasable) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Build: %v, want ErrNotReleasable saying %q", err, c.want)
			}
		})
	}
}

func TestVersionMustBeCanonical(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"", "1.0.0", "v1.0", "v1.0.0+meta"} {
		if _, err := Build(context.Background(), Options{Version: v, Root: t.TempDir()}); err == nil || errors.Is(err, ErrNotReleasable) {
			t.Errorf("Build(version %q) = %v, want a version error", v, err)
		}
	}
}

// TestCleanupLeavesTheCacheAsFound: Cleanup removes from the module cache
// what the release's go commands put there for its version, and leaves a
// module whose entries for that version were there before Build (issue 36,
// item 7: it removed them too, a real release's download among them).
func TestCleanupLeavesTheCacheAsFound(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("GOMODCACHE", cache)
	const version = "v1.2.3"
	mods := []Module{{Dir: ".", Path: "example.com/found"}, {Dir: "b", Path: "example.com/made"}}
	put := func(path string) (dir, zip string) {
		d, dl, ok := cachePaths(cache, path)
		if !ok {
			t.Fatalf("cachePaths(%s)", path)
		}
		dir, zip = d+"@"+version, filepath.Join(dl, version+".zip")
		for _, p := range []string{filepath.Join(dir, "go.mod"), zip} {
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir, zip
	}
	foundDir, foundZip := put("example.com/found")
	r := &Release{opts: Options{Version: version}, tmp: t.TempDir()}
	r.found = r.cachedNow(mods)
	r.Modules = mods
	madeDir, madeZip := put("example.com/made") // what the build downloaded
	r.Cleanup()
	for _, p := range []string{foundDir, foundZip} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s was in the cache before Build and is gone: %v", p, err)
		}
	}
	for _, p := range []string{madeDir, madeZip} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s, put there by the release, is still in the cache (%v)", p, err)
		}
	}
}
