package privateserver

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// EnvPostgresBin names the variable that overrides the directory of
// PostgreSQL's server binaries (initdb, pg_ctl); default: the newest
// /usr/lib/postgresql/<version>/bin, where Debian installs them.
const EnvPostgresBin = "OUTBOX_TEST_POSTGRES_BIN"

// Postgres is a PostgreSQL server of one test's own: its own data
// directory and port, so that the test may crash it, restart it or change
// settings that need a restart (wal_level, max_slot_wal_keep_size),
// which the shared server on 5432 must never see. Its methods are safe
// for concurrent use.
type Postgres struct {
	// DSN reaches the server as the superuser postgres, database postgres
	// (trust authentication, TCP on 127.0.0.1).
	DSN string
	// Port is the server's TCP port on 127.0.0.1.
	Port int

	bin, dir string
	cred     *syscall.Credential // the postgres OS user, when the test runs as root
	mu       sync.Mutex
	running  bool
}

// StartPostgres creates a cluster of t's own (initdb, trust
// authentication), starts it on a free port of 127.0.0.1 with settings
// written to postgresql.conf (name to value, as the file takes them:
// "wal_level": "logical"), and stops it (immediate shutdown) and removes
// its files when t ends. A test running as root runs the server as the
// postgres OS user (PostgreSQL refuses root). Without the binaries the
// test is skipped, or failed under OUTBOX_TEST_REQUIRE.
func StartPostgres(t testing.TB, settings map[string]string) *Postgres {
	t.Helper()
	bin := os.Getenv(EnvPostgresBin)
	if bin == "" {
		dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
		sort.Slice(dirs, func(i, j int) bool { return pgMajor(dirs[i]) < pgMajor(dirs[j]) })
		if len(dirs) > 0 {
			bin = dirs[len(dirs)-1]
		}
	}
	if _, err := os.Stat(filepath.Join(bin, "initdb")); bin == "" || err != nil {
		Unavailable(t, fmt.Sprintf("PostgreSQL's initdb not found (set %s to the directory of initdb and pg_ctl)", EnvPostgresBin))
	}
	s := &Postgres{bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			Unavailable(t, "running as root, and no postgres OS user to run a private PostgreSQL server as")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	// Not t.TempDir: its parents are private to root, and the server runs
	// as postgres.
	dir, err := os.MkdirTemp("", "outbox-pg-")
	if err != nil {
		t.Fatal(err)
	}
	s.dir = dir
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if s.cred != nil {
		if err := os.Chown(dir, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(dir, "data")
	if out, err := s.run(t, "initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	addr := freeAddr(t)
	_, portText, _ := net.SplitHostPort(addr)
	s.Port, _ = strconv.Atoi(portText)
	conf := map[string]string{
		"listen_addresses":        "'127.0.0.1'",
		"port":                    portText,
		"unix_socket_directories": "'" + dir + "'",
		"shared_buffers":          "'32MB'",
		"max_connections":         "50",
		"fsync":                   "on",
		"logging_collector":       "off",
	}
	for k, v := range settings {
		conf[k] = v
	}
	var b strings.Builder
	keys := make([]string, 0, len(conf))
	for k := range conf {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = %s\n", k, conf[k])
	}
	f, err := os.OpenFile(filepath.Join(data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(b.String()); err != nil {
		t.Fatal(err)
	}
	f.Close()
	s.DSN = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.Port)
	s.Start(t)
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.running {
			_, _ = s.run(t, "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop")
			s.running = false
		}
	})
	return s
}

// pgMajor is the major version in a path /usr/lib/postgresql/<major>/bin.
func pgMajor(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// run runs one of the server's binaries as the server's OS user.
func (s *Postgres) run(t testing.TB, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Start starts the stopped server and waits until it accepts connections
// (recovering from a crash first if Crash stopped it).
func (s *Postgres) Start(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running {
		return
	}
	if out, err := s.run(t, "pg_ctl", "-D", filepath.Join(s.dir, "data"), "-l", filepath.Join(s.dir, "server.log"), "-w", "-t", "60", "start"); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
		t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	s.running = true
}

// Crash stops the server the way a crash would (immediate shutdown: every
// process quits at once, without a checkpoint and without writing what
// is still in the WAL buffers, such as the commits of transactions with
// synchronous_commit off that the WAL writer has not flushed yet). Start
// recovers from it.
func (s *Postgres) Crash(t testing.TB) {
	t.Helper()
	s.stop(t, "immediate")
}

// Stop shuts the server down cleanly (fast shutdown: a checkpoint, every
// commit on disk).
func (s *Postgres) Stop(t testing.TB) {
	t.Helper()
	s.stop(t, "fast")
}

func (s *Postgres) stop(t testing.TB, mode string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running {
		return
	}
	if out, err := s.run(t, "pg_ctl", "-D", filepath.Join(s.dir, "data"), "-m", mode, "-w", "-t", "60", "stop"); err != nil {
		t.Fatalf("pg_ctl stop -m %s: %v\n%s", mode, err, out)
	}
	s.running = false
}

// Log returns what the server has logged so far.
func (s *Postgres) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	return string(b)
}

// PauseWALWriter stops the server's WAL writer process (SIGSTOP), so that
// the commits of transactions with synchronous_commit off stay in the WAL
// buffers, unwritten, until something else flushes them (a synchronous
// commit, a full buffer, a checkpoint): with bgwriter_lru_maxpages = 0
// and a large wal_buffers, a Crash then loses them for certain. Crash and
// Stop end the paused process (immediate shutdown kills it).
func (s *Postgres) PauseWALWriter(t testing.TB) {
	t.Helper()
	pidFile, err := os.ReadFile(filepath.Join(s.dir, "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	postmaster := strings.TrimSpace(strings.SplitN(string(pidFile), "\n", 2)[0])
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		rest := string(stat)
		if i := strings.LastIndexByte(rest, ')'); i >= 0 {
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) < 2 || f[1] != postmaster {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if !strings.Contains(string(cmdline), "walwriter") {
			continue
		}
		pid, _ := strconv.Atoi(e.Name())
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatalf("stopping the WAL writer %d: %v", pid, err)
		}
		return
	}
	t.Fatalf("no WAL writer process under postmaster %s", postmaster)
}
