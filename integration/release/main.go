// Command release builds the release of every module of the repository's
// workspace (go.work) at one version, as the Go module proxy will serve
// them once the tags exist, and checks that a module outside the
// repository can consume it with no replace directive.
//
// # Tag scheme
//
// All modules are released together, at one version (lockstep): the root
// module github.com/sqloutbox/outbox is tagged vX.Y.Z and each nested
// module is tagged with its directory as prefix, as the go command
// requires (https://go.dev/ref/mod#vcs-version): relay/nats/vX.Y.Z,
// inbox/kafka/vX.Y.Z, cmd/outbox/vX.Y.Z, and so on, all on one commit.
//
// # How the modules require each other
//
// On main, a nested module's go.mod requires its siblings with replace
// directives to their directories, so that every module builds and tidies
// on its own (GOWORK=off) and in the workspace. A release commit has no
// replace directive: release -apply rewrites each go.mod to require its
// siblings at the release version, in dependency order, and writes the
// go.sum lines for them (the hashes of the module zips it built, which are
// the zips the proxy builds from those tags: a module's zip holds its
// directory without its nested modules, so a later module's rewrite does
// not change an earlier one's hash). Releasing vX.Y.Z:
//
//	git switch -c release-vX.Y.Z
//	go run ./integration/release -version vX.Y.Z -apply   # rewrites go.mod/go.sum, then checks
//	git commit -am "release vX.Y.Z"
//	git tag vX.Y.Z; for m in <each nested module>; do git tag $m/vX.Y.Z; done
//	git push origin vX.Y.Z '*/vX.Y.Z'
//
// (release prints the tag list.) Main keeps its replace directives.
//
// # The check
//
// Without -apply, release builds the same zips in a copy of the tracked
// files, serves them from a file-system module proxy
// (GOPROXY=file://...,<your GOPROXY>, checksum database off for
// github.com/sqloutbox/outbox only) and, in a scratch module outside the
// repository with GOWORK=off and no replace: go gets the root module,
// relay/nats, inbox/kafka and otel, builds a program that imports them,
// go installs cmd/outbox at the version and runs its --version, which
// must print that version. FirstEvents (TestRelease, or -first-events)
// then builds there, from the release alone, a program that publishes 100
// events to each of Kafka (in-process), NATS, RabbitMQ and Redis and
// consumes them through the inbox. It fails if any module of go.work is not
// releasable: a replace directive to a directory outside the release, a
// module path that does not match its directory (the tag would not find
// it), a go.mod that go.work does not list, a cycle, or a module that
// does not tidy, zip or build. The integration test TestRelease runs it
// in CI, under a version of its own (v0.0.0-check.<time>) so that the
// module cache never holds an older build of the same version.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"
)

func main() {
	version := flag.String("version", "", "the release version, vX.Y.Z (required)")
	apply := flag.Bool("apply", false, "rewrite the working tree's go.mod and go.sum files for the release commit (default: check in a copy)")
	first := flag.Bool("first-events", false, "also build the first-events program against the release and run it against the local NATS, RabbitMQ and Redis (and an in-process Kafka broker)")
	out := flag.String("out", "", "directory for the module proxy tree, kept at exit so that another module can consume the release (GOPROXY=file://DIR,$(go env GOPROXY) GONOSUMDB=github.com/sqloutbox/outbox GOWORK=off; docs/layout.md); default: a temporary directory, removed at exit")
	flag.Parse()
	if *version == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: go run ./integration/release -version vX.Y.Z [-apply] [-out DIR]")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	rel, err := Build(ctx, Options{Version: *version, Apply: *apply, Out: *out, Log: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
	defer rel.Cleanup()
	if err := rel.Check(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "release check:", err)
		os.Exit(1)
	}
	if *first {
		out, err := rel.FirstEvents(ctx)
		fmt.Fprint(os.Stderr, out)
		if err != nil {
			fmt.Fprintln(os.Stderr, "release first events:", err)
			os.Exit(1)
		}
	}
	fmt.Println("tags:")
	for _, t := range rel.Tags() {
		fmt.Println("  " + t)
	}
}
