// Command cgsum reads a callgrind profile of a Go program and reports its
// instructions per operation: the profile's total (callgrind's summary),
// the part spent waiting, and the rest, the work.
//
// The waiting part is the self cost of the functions defined in the Go
// scheduler, the runtime's locks, the network poller, timers, stack
// switches and system calls (waitFiles). How much of that runs depends on
// whether a server's reply had arrived when the program read, so it varies
// from run to run by thousands of instructions per transaction; the work
// repeats to within a few hundred. With -top it also lists the functions
// with the most work (self cost), for finding where a difference goes.
//
// BENCHMARKS.md ("Issue 34") runs it on a dump of driver's
// BenchmarkTxPath:
//
//	go run ./driver/internal/cgsum -n 2000 -top 30 /tmp/cg.out.2
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

func main() {
	n := flag.Int("n", 1, "operations in the profile (the divisor)")
	top := flag.Int("top", 0, "list this many functions with the most work")
	flag.Parse()
	if flag.NArg() == 0 || *n < 1 {
		fmt.Fprintln(os.Stderr, "usage: cgsum [-n operations] [-top k] callgrind.out...")
		os.Exit(2)
	}
	for _, path := range flag.Args() {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		p, err := parse(f)
		f.Close()
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			os.Exit(1)
		}
		per := func(v int64) string { return strconv.FormatInt((v+int64(*n)/2)/int64(*n), 10) }
		fmt.Printf("%s: per op (n=%d): total %s, wait %s, work %s\n", path, *n, per(p.total), per(p.wait()), per(p.total-p.wait()))
		for _, fc := range p.topWork(*top) {
			fmt.Printf("  %8s  %s  (%s)\n", per(fc.cost), fc.fn, fc.file)
		}
	}
}

// waitFiles are the Go source files (paths below GOROOT/src) whose
// functions' instructions count as waiting: the scheduler (proc.go, with
// entersyscall and sysmon), runtime locks, the network poller, futexes and
// clocks, timers, the GC CPU limiter's idle accounting, the idle lists,
// stack switches and spinning (asm_amd64.s), and system calls and socket
// I/O, whose count depends on whether a read found the reply.
var waitFiles = []string{
	"runtime/proc.go", "runtime/lock_spinbit.go", "runtime/lock_futex.go",
	"runtime/netpoll.go", "runtime/netpoll_epoll.go", "runtime/os_linux.go",
	"runtime/sys_linux_amd64.s", "runtime/time.go", "runtime/mgclimit.go",
	"runtime/list_manual.go", "runtime/asm_amd64.s",
	"internal/runtime/syscall/", "syscall/", "internal/poll/",
	"net/fd_posix.go", "net/fd_unix.go", "net/net.go",
}

// waiting reports whether file (as callgrind names it: an absolute path)
// is one of waitFiles.
func waiting(file string) bool {
	i := strings.LastIndex(file, "/src/")
	if i < 0 {
		return false
	}
	rel := file[i+len("/src/"):]
	for _, w := range waitFiles {
		if rel == w || strings.HasSuffix(w, "/") && strings.HasPrefix(rel, w) {
			return true
		}
	}
	return false
}

// profile is what cgsum takes from a callgrind file: the summary, and the
// self cost (first event) of each function with the file it is defined in.
type profile struct {
	total int64
	self  map[string]int64  // function -> self cost
	file  map[string]string // function -> file
}

func (p *profile) wait() int64 {
	var w int64
	for fn, c := range p.self {
		if waiting(p.file[fn]) {
			w += c
		}
	}
	return w
}

type fnCost struct {
	fn, file string
	cost     int64
}

// topWork returns the k functions with the most self cost outside waiting.
func (p *profile) topWork(k int) []fnCost {
	var out []fnCost
	for fn, c := range p.self {
		if !waiting(p.file[fn]) {
			out = append(out, fnCost{fn: fn, file: filepath.Base(p.file[fn]), cost: c})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].cost != out[j].cost {
			return out[i].cost > out[j].cost
		}
		return out[i].fn < out[j].fn
	})
	return out[:min(k, len(out))]
}

// parse reads callgrind's format (valgrind's docs, "Callgrind Format
// Specification"): name compression "(id) name", cost lines of positions
// then events, and a call's inclusive cost on the line after calls=, which
// is not the caller's self cost. Recursion suffixes ('2) are folded.
func parse(r io.Reader) (*profile, error) {
	p := &profile{self: map[string]int64{}, file: map[string]string{}}
	names := map[string]map[string]string{"fl": {}, "fn": {}}
	name := func(kind, v string) string {
		if strings.HasPrefix(v, "(") {
			if end := strings.IndexByte(v, ')'); end > 0 {
				id, rest := v[:end+1], strings.TrimSpace(v[end+1:])
				if rest != "" {
					names[kind][id] = rest
				}
				v = names[kind][id]
			}
		}
		if i := strings.LastIndexByte(v, '\''); i > 0 {
			if _, err := strconv.Atoi(v[i+1:]); err == nil {
				v = v[:i]
			}
		}
		return v
	}
	positions := 1
	var fl, fn string
	afterCalls := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		key, val, isKV := strings.Cut(line, "=")
		if isKV && !strings.ContainsAny(key, " \t") {
			switch key {
			case "fl":
				fl = name("fl", val)
			case "fi", "fe", "cfi", "cfl":
				name("fl", val)
			case "fn":
				fn = name("fn", val)
				if _, ok := p.file[fn]; !ok {
					p.file[fn] = fl
				}
				afterCalls = false
			case "cfn":
				name("fn", val)
			case "calls":
				afterCalls = true
			}
			continue
		}
		switch {
		case strings.HasPrefix(line, "positions:"):
			positions = len(strings.Fields(strings.TrimPrefix(line, "positions:")))
		case strings.HasPrefix(line, "summary:"):
			f := strings.Fields(strings.TrimPrefix(line, "summary:"))
			if len(f) > 0 {
				v, err := strconv.ParseInt(f[0], 10, 64)
				if err != nil {
					return nil, fmt.Errorf("summary: %w", err)
				}
				p.total = v
			}
		case line != "" && (line[0] >= '0' && line[0] <= '9' || line[0] == '+' || line[0] == '-' || line[0] == '*'):
			f := strings.Fields(line)
			if afterCalls {
				afterCalls = false
				continue
			}
			if len(f) <= positions {
				continue // no event on this line: zero
			}
			v, err := strconv.ParseInt(f[positions], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("cost line %q: %w", line, err)
			}
			p.self[fn] += v
		}
	}
	return p, sc.Err()
}
