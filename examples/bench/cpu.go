package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of /proc's CPU times (proc(5)): 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// cpuTicks is a sample of CPU time, in clock ticks: this process's, its
// child processes' (the broker, where the bench started one), and the
// PostgreSQL server's (every process named "postgres", plus what the
// postmaster has reaped from backends that exited: cutime+cstime).
type cpuTicks struct {
	self, children, postgres int64
	ok                       bool
}

// sampleCPU reads /proc (Linux); ok is false where it is unreadable, and
// a server on another machine (or in a container the bench cannot see)
// counts 0 for PostgreSQL.
func sampleCPU() cpuTicks {
	self, ok := procTicks("/proc/self/stat", false)
	if !ok {
		return cpuTicks{}
	}
	s := cpuTicks{self: self, ok: true}
	pid := strconv.Itoa(os.Getpid())
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		if ppid, _ := procField(filepath.Join(d, "stat"), 4); ppid == pid {
			if n, ok := procTicks(filepath.Join(d, "stat"), false); ok {
				s.children += n
			}
			continue
		}
		comm, err := os.ReadFile(filepath.Join(d, "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "postgres" {
			continue
		}
		if n, ok := procTicks(filepath.Join(d, "stat"), true); ok {
			s.postgres += n
		}
	}
	return s
}

// procField returns field n (from 3 on, proc(5)'s numbering) of a stat
// file.
func procField(path string, n int) (string, bool) {
	f, ok := statFields(path)
	if !ok || n < 3 || n-3 >= len(f) {
		return "", false
	}
	return f[n-3], true
}

// statFields returns a stat file's fields from field 3 (state) on: the
// command name (field 2) may hold spaces, so they count from its ")".
func statFields(path string) ([]string, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, false
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return nil, false
	}
	return strings.Fields(string(b[i+1:])), true
}

// procTicks reads utime+stime (fields 14 and 15 of proc(5)'s stat) and,
// with children, cutime+cstime (16 and 17: the reaped children's time,
// which a backend that exited leaves in the postmaster's).
func procTicks(path string, children bool) (int64, bool) {
	f, ok := statFields(path)
	// f[0] is field 3 (state); field n is f[n-3].
	if !ok || len(f) < 15 {
		return 0, false
	}
	last := 13
	if children {
		last = 15
	}
	var sum int64
	for k := 11; k < last; k++ {
		n, err := strconv.ParseInt(f[k], 10, 64)
		if err != nil {
			return 0, false
		}
		sum += n
	}
	return sum, true
}

// cpuPerEvent is the CPU time between two samples per event, in
// microseconds: the bench process (the relay), its children (the broker)
// and PostgreSQL. All are 0 where /proc is unreadable.
func cpuPerEvent(from, to cpuTicks, events int) (self, children, postgres float64) {
	if !from.ok || !to.ok || events <= 0 {
		return 0, 0, 0
	}
	us := func(t int64) float64 { return round2(float64(t) * 1e6 / clockTicks / float64(events)) }
	return us(to.self - from.self), us(to.children - from.children), us(to.postgres - from.postgres)
}
