//go:build race

package outbox_test

// raceBuild is true in a test binary built with -race:
// TestREADMESnippetsCompile then builds the docs' snippets with -race too,
// so they reuse the packages the enclosing `go test -race` compiled
// instead of compiling every dependency a second time.
const raceBuild = true
