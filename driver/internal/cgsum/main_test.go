package main

import (
	"strings"
	"testing"
)

// A callgrind dump in the shape valgrind writes for a Go program: name
// compression, a recursion suffix, an inlined file, and a call whose
// inclusive cost must not count as the caller's own.
const dump = `# callgrind format
version: 1
positions: line
events: Ir
summary: 1000

ob=(1) /tmp/prog
fl=(1) /usr/local/go/src/runtime/proc.go
fn=(1) runtime.schedule
10 300
fl=(2) /work/driver/wrap.go
fn=(2) driver.(*conn).BeginTx
fi=(3) /work/emit/scope.go
20 50
fe=(2)
+1 50
cfl=(1)
cfn=(1)
calls=1 10
* 300
fn=(3) driver.classify'2
* 100
fl=(4) /usr/local/go/src/syscall/syscall_linux.go
fn=(4) syscall.read
5 200
fl=(2)
fn=(3)
7 300
`

func TestParse(t *testing.T) {
	t.Parallel()
	p, err := parse(strings.NewReader(dump))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		fn   string
		self int64
		file string
	}{
		{"runtime.schedule", 300, "/usr/local/go/src/runtime/proc.go"},
		{"driver.(*conn).BeginTx", 100, "/work/driver/wrap.go"},
		{"driver.classify", 400, "/work/driver/wrap.go"},
		{"syscall.read", 200, "/usr/local/go/src/syscall/syscall_linux.go"},
	} {
		if p.self[c.fn] != c.self || p.file[c.fn] != c.file {
			t.Errorf("%s: self %d in %q, want %d in %q", c.fn, p.self[c.fn], p.file[c.fn], c.self, c.file)
		}
	}
	if p.total != 1000 || p.wait() != 500 {
		t.Errorf("total %d wait %d, want 1000 and 500", p.total, p.wait())
	}
	if top := p.topWork(1); len(top) != 1 || top[0].fn != "driver.classify" || top[0].cost != 400 {
		t.Errorf("topWork(1) = %+v", top)
	}
}

func TestWaiting(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		file string
		want bool
	}{
		{"/usr/local/go/src/runtime/proc.go", true},
		{"/usr/local/go/src/internal/poll/fd_unix.go", true},
		{"/usr/local/go/src/syscall/syscall_linux.go", true},
		{"/usr/local/go/src/internal/runtime/syscall/linux/asm_linux_amd64.s", true},
		{"/usr/local/go/src/runtime/malloc.go", false},
		{"/usr/local/go/src/database/sql/sql.go", false},
		{"/usr/local/go/src/net/net.go", true},
		{"/usr/local/go/src/net/netip/netip.go", false},
		{"/root/go/pkg/mod/github.com/lib/pq@v1.12.3/conn.go", false},
		{"/work/wt-driver/driver/wrap.go", false},
		{"???", false},
	} {
		if got := waiting(c.file); got != c.want {
			t.Errorf("waiting(%q) = %v, want %v", c.file, got, c.want)
		}
	}
}
