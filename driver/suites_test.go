package driver_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sqloutbox/outbox/driver/dsn"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// TestDriverSuitesPassThrough runs lib/pq's and go-sql-driver/mysql's own
// test suites, from the module cache, once on the driver itself and once
// through this package's wrapper (at the same time, each in a private
// database; lib/pq's in both configurations its CI uses), and requires
// every test and subtest that passes on the driver to pass through the
// wrapper. None of the drivers' suites uses an emit
// scope, so for them the wrapper has to be a pure pass-through.
//
// The exceptions are listed per suite with the reason (driverSuite.allow):
// tests that type-assert the driver's own connection type inside
// (*sql.Conn).Raw. Their assertions are unchecked, so through the wrapper
// they panic and end the test binary; they run through the wrapper a
// third time, alone, with Raw's argument passed through Unwrap, and must
// then pass. A test that fails through the wrapper is run again alone
// before it counts as lost: several of these suites' tests have 100 ms
// deadlines that a loaded machine misses now and then; one that passes the
// second time is logged as flaky with its first failure.
//
// Nothing of the drivers is copied into this repository. At run time the
// test generates, in t.TempDir(), an overlay (go test -overlay) for the
// driver's package:
//
//   - one added test file, zz_outbox_suite_test.go, that registers the
//     wrapped driver under "outbox-<driver>", defines the helpers below and
//     TestOutboxSuiteProbe, which checks which connection type the suite's
//     databases really get in each mode;
//   - rewritten copies of the driver's test files (and of lib/pq's
//     internal/pqtest helper), made from the module cache's files by
//     string replacement, in which every database the suite opens goes
//     through the helpers: sql.Open("<driver>", ...) opens
//     OutboxSuiteDriverName() and sql.OpenDB(connector) becomes
//     OutboxSuiteOpenDB(connector), which wraps the connector with
//     WrapConnector. Replacements stay on their line, so the drivers' file
//     and line numbers in failures are the module cache's. An edit that no
//     longer finds its text fails the test (the suite changed).
//
// The mode is chosen at link time with -ldflags -X (mysql's own
// driverNameTest is set the same way, as its suite documents), so one
// compilation serves every mode. The inner suites are built without -race
// unless OUTBOX_SUITES_RACE is set: with it this test took 77 s instead of
// 21 s on the project's 2-core machine (the wrapper's own tests run with
// -race).
func TestDriverSuitesPassThrough(t *testing.T) {
	if testing.Short() {
		t.Skip("SKIP: -short: runs lib/pq's and go-sql-driver/mysql's own suites (about 25 s)")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
			t.Fatalf("go command required (OUTBOX_TEST_REQUIRE is set): %v", err)
		}
		t.Skipf("SKIP: no go command in PATH to run the drivers' suites: %v", err)
	}
	start := time.Now()
	for _, s := range driverSuites {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			s.run(t, goBin)
		})
	}
	t.Cleanup(func() {
		t.Logf("both suites, every mode and variant: %v wall time", time.Since(start).Round(time.Second))
	})
}

// Suite modes, set in the generated file's OutboxSuiteMode with -X.
const (
	modeRaw     = ""        // the driver itself
	modeWrapped = "wrapped" // through the wrapper
	modeUnwrap  = "unwrap"  // through the wrapper, Raw's argument unwrapped
)

// driverSuite is one driver's own test suite and how to point it at the
// wrapper.
type driverSuite struct {
	name    string // the subtest: "pq", "mysql"
	module  string // module path; its root package is the suite
	zz      string // the added test file
	edits   []edit
	forbid  []string // no test file may still contain these after the edits
	ldflags func(mode string) string
	setup   func(t *testing.T) (newDB func(t *testing.T) []string) // server env; newDB: a private database's env
	// skip: top-level tests run in no mode, with the reason (each is
	// reported as a skipped subtest).
	skip map[string]string
	// allow: top-level tests that may fail through the wrapper because
	// they type-assert the driver's connection type inside Raw; they must
	// pass in modeUnwrap.
	allow map[string]string
	// require: tests that must pass through the wrapper (in modeUnwrap if
	// allowed) whatever they do on the driver: the ones issue 11 named.
	require []string
	// variants: the suite's own configurations, each compared on its own
	// (one run of each mode per variant); none: one, "default".
	variants []suiteVariant
}

// suiteVariant is a configuration a suite documents, set by environment.
type suiteVariant struct {
	name string
	env  []string
}

// edit replaces old with new in the files that match: file names a file
// relative to the module root, or "*" for every _test.go file of the
// package clause pkg in the module root. It must apply at least min times
// over the files it matches.
type edit struct {
	file, pkg string
	old, new  string
	min       int
	suffix    string // appended once to each file the edit changed
}

// keepSQL keeps the database/sql import that an OpenDB edit may leave unused.
const keepSQL = "\nvar _ = sql.Drivers // outbox suite: keeps the import the OpenDB edit may leave unused\n"

var driverSuites = []driverSuite{
	{
		name:   "pq",
		module: "github.com/lib/pq",
		zz:     pqSuiteFile,
		edits: []edit{
			// pqtest.DB, behind pqtest.MustDB: most of the suite's databases.
			{file: "internal/pqtest/pqtest.go", old: `sql.Open("postgres", `, new: `sql.Open(DriverName, `, min: 1},
			{file: "internal/pqtest/pqtest.go", old: "\nvar envOnce sync.Once\n",
				new: "\nvar envOnce sync.Once; var DriverName = \"postgres\" // outbox suite: set by zz_outbox_suite_test.go\n", min: 1},
			{file: "*", pkg: "pq", old: `sql.Open("postgres", `, new: `sql.Open(OutboxSuiteDriverName(), `, min: 1},
			{file: "*", pkg: "pq", old: `sql.OpenDB(`, new: `OutboxSuiteOpenDB(`, min: 1, suffix: keepSQL},
			{file: "*", pkg: "pq_test", old: `sql.Open("postgres", `, new: `sql.Open(pq.OutboxSuiteDriverName(), `, min: 1},
			{file: "*", pkg: "pq_test", old: `sql.OpenDB(`, new: `pq.OutboxSuiteOpenDB(`, min: 1, suffix: keepSQL},
			// wantEvent panics when pq's Listener (its own connection,
			// not database/sql's) does not report within 100 ms, which
			// on a loaded machine kills the test binary and with it every
			// later test's result. A test failure keeps the rest.
			{file: "notify_test.go", old: `panic("wantEvent: timeout")`, new: `t.Fatal("wantEvent: timeout")`, min: 1},
		},
		forbid:  []string{`sql.Open("postgres"`, `sql.OpenDB(`},
		ldflags: func(mode string) string { return "-X github.com/lib/pq.OutboxSuiteMode=" + mode },
		setup:   pqSuiteSetup,
		// lib/pq's CI runs its suite both ways: binary_parameters=yes
		// sends arguments through the connection's CheckNamedValue.
		variants: []suiteVariant{{"default", nil}, {"binary_parameters", []string{"PQTEST_BINARY_PARAMETERS=yes"}}},
	},
	{
		name:   "mysql",
		module: "github.com/go-sql-driver/mysql",
		zz:     mysqlSuiteFile,
		edits: []edit{
			// runTests and most helpers open driverNameTest (set with -X);
			// runTestsParallel and a few tests open "mysql" by name.
			{file: "*", pkg: "mysql", old: `sql.Open("mysql", `, new: `sql.Open(OutboxSuiteDriverName(), `, min: 1},
			{file: "*", pkg: "mysql", old: `sql.OpenDB(`, new: `OutboxSuiteOpenDB(`, min: 1, suffix: keepSQL},
			{file: "driver_test.go", old: `conn.Raw(func(conn any) error {`,
				new: `conn.Raw(func(conn any) error { conn = OutboxSuiteRaw(conn);`, min: 3},
		},
		forbid: []string{`sql.Open("mysql"`, `sql.OpenDB(`},
		ldflags: func(mode string) string {
			f := "-X github.com/go-sql-driver/mysql.OutboxSuiteMode=" + mode
			if mode != modeRaw {
				f += " -X github.com/go-sql-driver/mysql.driverNameTest=outbox-mysql"
			}
			return f
		},
		setup: mysqlSuiteSetup,
		skip: map[string]string{
			"TestConnectorReturnsTimeout": "dials 1.1.1.1:1234 with the driver's connector directly (no database/sql, " +
				"nothing of the wrapper); where a sandbox's network accepts that connection the driver panics " +
				"(nil logger of an unnormalized Config) and kills the whole test binary",
		},
		allow: map[string]string{
			"TestPing": "its second part asserts conn.(*mysqlConn) inside Raw to read the driver's unexported " +
				"result fields; through the wrapper Raw gets the wrapper's connection (driver.Unwrap returns the driver's)",
			"TestQueryMultipleResults": "asserts conn.(*mysqlConn) inside Raw to read the driver's unexported " +
				"affectedRows; through the wrapper Raw gets the wrapper's connection (driver.Unwrap returns the driver's)",
		},
		// mysql.Result's AllRowsAffected and AllLastInsertIds through
		// the wrapper, and the driver's connection inside Raw by Unwrap.
		require: []string{"TestExecMultipleResults", "TestPing", "TestQueryMultipleResults"},
	},
}

// run runs one suite in every mode and compares.
func (s *driverSuite) run(t *testing.T, goBin string) {
	newDB := s.setup(t)
	dir := goOutput(t, goBin, "list", "-m", "-f", "{{.Dir}}", s.module)
	if dir == "" {
		t.Fatalf("%s is not in the module cache (go mod download %s)", s.module, s.module)
	}
	b := s.build(t, goBin, dir)
	for _, name := range sortedKeys(s.skip) {
		t.Run("skipped/"+name, func(t *testing.T) { t.Skipf("SKIP: not run in any mode: %s", s.skip[name]) })
	}
	variants := s.variants
	if len(variants) == 0 {
		variants = []suiteVariant{{"default", nil}}
	}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			env := func(t *testing.T) []string { return append(newDB(t), v.env...) }
			s.compare(t, b, env)
		})
	}
}

// compare runs the suite on the driver and through the wrapper, each in a
// private database (newEnv), and compares.
func (s *driverSuite) compare(t *testing.T, b *suiteBuild, newEnv func(t *testing.T) []string) {
	// The allowed tests' type assertions are unchecked: through the
	// wrapper they panic, which ends the test binary. They run through the
	// wrapper only with Raw's argument unwrapped (modeUnwrap).
	rawSkip := anchored(sortedKeys(s.skip))
	wrappedSkip := anchored(append(sortedKeys(s.skip), sortedKeys(s.allow)...))

	var raw, wrapped *suiteRun
	var wg sync.WaitGroup
	rawEnv, wrappedEnv := newEnv(t), newEnv(t)
	wg.Add(2)
	go func() { defer wg.Done(); raw = b.exec(t, modeRaw, rawEnv, "", rawSkip) }()
	go func() { defer wg.Done(); wrapped = b.exec(t, modeWrapped, wrappedEnv, "", wrappedSkip) }()
	wg.Wait()
	if t.Failed() {
		return
	}
	var unwrap *suiteRun
	if len(s.allow) > 0 {
		unwrap = b.exec(t, modeUnwrap, wrappedEnv, anchored(append(sortedKeys(s.allow), "TestOutboxSuiteProbe")), rawSkip)
		if t.Failed() {
			return
		}
	}
	t.Logf("%s raw:     %s", s.name, raw.summary())
	t.Logf("%s wrapped: %s", s.name, wrapped.summary())
	if unwrap != nil {
		t.Logf("%s unwrap:  %s (only %s)", s.name, unwrap.summary(), strings.Join(sortedKeys(s.allow), ", "))
	}
	if f := raw.names("fail"); len(f) > 0 {
		t.Logf("%s: failing on the driver itself (roles, TLS, servers this machine lacks), not compared: %s",
			s.name, strings.Join(f, " "))
	}
	for _, r := range []*suiteRun{raw, wrapped, unwrap} {
		if r != nil && r.results["TestOutboxSuiteProbe"] != "pass" {
			t.Errorf("%s %s: the probe did not pass, the suite may not have run through the wrapper:\n%s",
				s.name, r.mode, r.output["TestOutboxSuiteProbe"])
		}
	}

	// Every test (and subtest) that passed on the driver must pass through
	// the wrapper: the allowed ones with Raw's argument unwrapped.
	lost := map[string][]string{} // top-level test -> lost tests
	compared, failedOnce, confirmed := 0, 0, 0
	for _, name := range raw.names("pass") {
		top, _, _ := strings.Cut(name, "/")
		if top == "TestOutboxSuiteProbe" {
			continue
		}
		compared++
		if _, ok := s.allow[top]; ok {
			if unwrap.results[name] != "pass" {
				t.Errorf("%s: %s is allowed to differ only by its type assertion inside Raw, but fails with Raw's argument unwrapped:\n%s",
					s.name, name, unwrap.output[top])
			}
			continue
		}
		if wrapped.results[name] != "pass" {
			lost[top] = append(lost[top], name)
			failedOnce++
		}
	}
	var gained []string
	for _, name := range wrapped.names("pass") {
		if raw.results[name] != "pass" {
			gained = append(gained, name)
		}
	}
	if len(gained) > 0 {
		t.Logf("%s: passed through the wrapper but not on the driver (timing): %s", s.name, strings.Join(gained, " "))
	}

	// A loss is confirmed by running its tests again through the wrapper,
	// alone: several of these suites' tests have 100 ms deadlines, which a
	// machine shared with other test binaries misses now and then. A test
	// that passes the second time is reported as flaky with its first
	// failure, not counted as a loss.
	if len(lost) > 0 {
		tops := sortedKeys(lost)
		again := b.exec(t, modeWrapped, wrappedEnv, anchored(tops), wrappedSkip)
		for _, top := range tops {
			var still []string
			for _, name := range lost[top] {
				if again.results[name] != "pass" {
					still = append(still, name)
				}
			}
			if len(still) == 0 {
				t.Logf("%s: %s failed through the wrapper, then passed when run again alone (flaky under load); first failure:\n%s",
					s.name, top, wrapped.output[top])
				continue
			}
			confirmed += len(still)
			t.Errorf("%s: passes on the driver, fails through the wrapper (also when run again alone): %s\n%s",
				s.name, strings.Join(still, " "), again.output[top])
		}
	}
	for _, top := range s.require {
		r := wrapped
		if _, ok := s.allow[top]; ok {
			r = unwrap
		}
		if r.results[top] != "pass" {
			t.Errorf("%s: %s must pass through the wrapper (%s: %s):\n%s", s.name, top, r.mode, r.results[top], r.output[top])
		}
	}
	for _, top := range sortedKeys(s.allow) {
		t.Logf("%s: %s run through the wrapper only with driver.Unwrap inside Raw: %s", s.name, top, s.allow[top])
	}
	if sk := raw.names("skip"); len(sk) > 0 {
		t.Logf("%s: skipped by the suite itself (its own reasons, e.g. MYSQL_TEST_CONCURRENT unset): %s", s.name, strings.Join(sk, " "))
	}
	t.Logf("%s: %d tests and subtests passed on the driver; through the wrapper %d failed, %d of them also when run again", s.name, compared, failedOnce, confirmed)
}

// anchored is a -run or -skip pattern matching exactly the named top-level
// tests ("" for none).
func anchored(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return "^(" + strings.Join(names, "|") + ")$"
}

// overlay writes the generated file and the edited copies into a temporary
// directory and returns the go test flags that use them and the package
// directory they make (the link).
//
// The go command refuses an overlay of files beneath GOMODCACHE, so the
// driver's module is reached through a symbolic link to its module cache
// directory, and a temporary copy of this module's go.mod (-modfile)
// replaces the driver's module with the link: the suite's files are still
// read from the module cache, and the overlay names them by the link.
func (s *driverSuite) overlay(t *testing.T, goBin, dir string) (flags []string, link string) {
	tmp := t.TempDir()
	link = filepath.Join(tmp, "module")
	if err := os.Symlink(dir, link); err != nil {
		t.Fatal(err)
	}
	gomod := goOutput(t, goBin, "env", "GOMOD")
	mod, err := os.ReadFile(gomod)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := os.ReadFile(strings.TrimSuffix(gomod, ".mod") + ".sum")
	if err != nil {
		t.Fatal(err)
	}
	mod = fmt.Appendf(mod, "\nreplace %s => %s\n", s.module, link)
	modfile := filepath.Join(tmp, "go.mod")
	if err := os.WriteFile(modfile, mod, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, "go.sum"), sum, 0o644); err != nil {
		t.Fatal(err)
	}
	replace := map[string]string{}
	contents := map[string]string{} // module-relative path -> edited content
	read := func(rel string) string {
		if c, ok := contents[rel]; ok {
			return c
		}
		b, err := os.ReadFile(filepath.Join(dir, rel))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	testFiles, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	pkgOf := func(rel string) string {
		m := regexp.MustCompile(`(?m)^package (\w+)`).FindStringSubmatch(read(rel))
		if m == nil {
			return ""
		}
		return m[1]
	}
	for _, e := range s.edits {
		var files []string
		if e.file == "*" {
			for _, f := range testFiles {
				if rel := filepath.Base(f); pkgOf(rel) == e.pkg {
					files = append(files, rel)
				}
			}
		} else {
			files = []string{e.file}
		}
		n := 0
		for _, rel := range files {
			c := read(rel)
			if k := strings.Count(c, e.old); k > 0 {
				n += k
				contents[rel] = strings.ReplaceAll(c, e.old, e.new) + e.suffix
			}
		}
		if n < e.min {
			t.Fatalf("%s: %q found %d times in %s (want at least %d): has the suite changed? Update the edits",
				s.module, e.old, n, e.file, e.min)
		}
	}
	for _, f := range testFiles {
		rel := filepath.Base(f)
		for _, bad := range s.forbid {
			if strings.Contains(read(rel), bad) {
				t.Fatalf("%s: %s still contains %q after the edits: that database would bypass the wrapper", s.module, rel, bad)
			}
		}
	}
	for rel, c := range contents {
		p := filepath.Join(tmp, strings.ReplaceAll(rel, "/", "_"))
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
		replace[filepath.Join(link, rel)] = p
	}
	zz := filepath.Join(tmp, "zz_outbox_suite_test.go")
	if err := os.WriteFile(zz, []byte(s.zz), 0o644); err != nil {
		t.Fatal(err)
	}
	replace[filepath.Join(link, "zz_outbox_suite_test.go")] = zz
	b, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"-modfile=" + modfile, "-overlay=" + p}, link
}

// suiteBuild is a suite's test binaries, one per mode.
type suiteBuild struct {
	s     *driverSuite
	goBin string
	dir   string            // the package directory (the link), where go test runs a test binary
	bins  map[string]string // mode -> test binary
}

// build compiles the suite's test binary for each mode the suite needs,
// one after the other: the modes differ only at link time, so the later
// builds reuse the first one's compilation.
func (s *driverSuite) build(t *testing.T, goBin, dir string) *suiteBuild {
	flags, link := s.overlay(t, goBin, dir)
	b := &suiteBuild{s: s, goBin: goBin, dir: link, bins: map[string]string{}}
	modes := []string{modeRaw, modeWrapped}
	if len(s.allow) > 0 {
		modes = append(modes, modeUnwrap)
	}
	tmp := t.TempDir()
	for _, mode := range modes {
		bin := filepath.Join(tmp, s.name+"-"+modeName(mode)+".test")
		args := []string{"test", "-c", "-o", bin, "-ldflags=" + s.ldflags(mode)}
		if os.Getenv("OUTBOX_SUITES_RACE") != "" {
			args = append(args, "-race")
		}
		args = append(args, flags...)
		args = append(args, s.module)
		begin := time.Now()
		cmd := exec.Command(goBin, args...)
		cmd.Env = append(os.Environ(), "GOWORK=off") // -modfile does not apply in workspace mode
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: go %s: %v\n%s", s.name, strings.Join(args, " "), err, out)
		}
		t.Logf("%s: built the %s test binary in %v", s.name, modeName(mode), time.Since(begin).Round(100*time.Millisecond))
		b.bins[mode] = bin
	}
	return b
}

func modeName(mode string) string {
	if mode == modeRaw {
		return "raw"
	}
	return mode
}

// suiteRun is one go test -json run of a suite.
type suiteRun struct {
	mode    string
	results map[string]string // test -> pass, fail, skip
	output  map[string]string // top-level test -> its output (and its subtests')
	wall    time.Duration
}

func (r *suiteRun) names(action string) []string {
	var n []string
	for name, a := range r.results {
		if a == action {
			n = append(n, name)
		}
	}
	sort.Strings(n)
	return n
}

func (r *suiteRun) summary() string {
	return fmt.Sprintf("%d passed, %d failed, %d skipped (tests and subtests) in %v",
		len(r.names("pass")), len(r.names("fail")), len(r.names("skip")), r.wall.Round(100*time.Millisecond))
}

// exec runs the suite's binary for mode with env, restricted by run and
// skip (go test's -run and -skip; empty for all), as go test would (in the
// package directory, through test2json) and parses the events. It fails t
// if no test ran, or if the binary crashed (a panic or a timeout ends the
// binary, leaving the later tests without a result).
func (b *suiteBuild) exec(t *testing.T, mode string, env []string, run, skip string) *suiteRun {
	s := b.s
	args := []string{"tool", "test2json", "-p", s.module, b.bins[mode], "-test.v=test2json", "-test.count=1", "-test.timeout=4m"}
	if run != "" {
		args = append(args, "-test.run="+run)
	}
	if skip != "" {
		args = append(args, "-test.skip="+skip)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.goBin, args...)
	cmd.Dir = b.dir
	cmd.Env = append(os.Environ(), env...)
	cmd.WaitDelay = 10 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	begin := time.Now()
	err := cmd.Run()
	r := &suiteRun{mode: modeName(mode), results: map[string]string{}, output: map[string]string{}, wall: time.Since(begin)}
	var pkgOut strings.Builder
	crashed := ""
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var ev struct{ Action, Test, Output string }
		if json.Unmarshal(sc.Bytes(), &ev) != nil {
			continue
		}
		if ev.Test == "" {
			if ev.Action == "output" || ev.Action == "build-output" {
				pkgOut.WriteString(ev.Output)
			}
			continue
		}
		top, _, _ := strings.Cut(ev.Test, "/")
		switch ev.Action {
		case "pass", "fail", "skip":
			r.results[ev.Test] = ev.Action
		case "output":
			if o := r.output[top]; len(o) < 64<<10 {
				r.output[top] = o + ev.Output
			}
			if strings.HasPrefix(ev.Output, "panic: ") && crashed == "" {
				crashed = ev.Test + ": " + strings.TrimSpace(ev.Output)
			}
		}
	}
	switch {
	case len(r.results) == 0:
		t.Errorf("%s %s: go %s: no test ran (%v)\n%s\n%s", s.name, r.mode, strings.Join(args, " "), err, pkgOut.String(), stderr.String())
	case crashed != "":
		top, _, _ := strings.Cut(crashed, "/")
		top, _, _ = strings.Cut(top, ":")
		t.Errorf("%s %s: the suite's test binary crashed, so the tests after it have no result to compare: %s\n%s",
			s.name, r.mode, crashed, r.output[top])
	}
	return r
}

// goOutput runs the go command and returns its trimmed output.
func goOutput(t *testing.T, goBin string, args ...string) string {
	out, err := exec.Command(goBin, args...).Output()
	if err != nil {
		t.Fatalf("go %s: %v", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

func sortedKeys[V any](m map[string]V) []string {
	k := make([]string, 0, len(m))
	for n := range m {
		k = append(k, n)
	}
	sort.Strings(k)
	return k
}

func suiteDBName() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "outbox_suite_" + hex.EncodeToString(b)
}

// pqSuiteSetup points lib/pq's suite (libpq environment variables, read
// through pqtest.DSN) at the test server, each run in a private database.
// pqtest's defaults (user pqgo, database pqgo) are this machine's
// PostgreSQL user and a fresh database instead; the tests that need lib/pq's
// compose file's roles and TLS fail on the driver itself and are not
// compared.
func pqSuiteSetup(t *testing.T) func(t *testing.T) []string {
	dsn := testdb.PostgresDSN(t)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	base := []string{
		"PGHOST=" + cfg.Host, fmt.Sprintf("PGPORT=%d", cfg.Port), "PGUSER=" + cfg.User,
		"PGPASSWORD=" + cfg.Password, "PGSSLMODE=disable",
	}
	return func(t *testing.T) []string {
		name := suiteDBName()
		if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, err := admin.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); err != nil {
				t.Errorf("dropping %s: %v", name, err)
			}
		})
		return append(base, "PGDATABASE="+name)
	}
}

// mysqlSuiteSetup points go-sql-driver/mysql's suite (MYSQL_TEST_*) at the
// test server, each run in a private database.
func mysqlSuiteSetup(t *testing.T) func(t *testing.T) []string {
	server := testdb.MySQLDSN(t)
	cfg, err := dsn.MySQLConfig(server)
	if err != nil {
		t.Fatal(err)
	}
	admin, err := sql.Open("mysql", server)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	base := []string{
		"MYSQL_TEST_USER=" + cfg.User, "MYSQL_TEST_PASS=" + cfg.Passwd,
		"MYSQL_TEST_PROT=" + cfg.Net, "MYSQL_TEST_ADDR=" + cfg.Addr,
	}
	return func(t *testing.T) []string {
		name := suiteDBName()
		if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if _, err := admin.Exec("DROP DATABASE IF EXISTS " + name); err != nil {
				t.Errorf("dropping %s: %v", name, err)
			}
		})
		return append(base, "MYSQL_TEST_DBNAME="+name)
	}
}

// pqSuiteFile is added to lib/pq's package in the overlay.
const pqSuiteFile = `// Code generated by github.com/sqloutbox/outbox's TestDriverSuitesPassThrough
// in a temporary overlay; it is not part of lib/pq.

package pq

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"testing"

	"github.com/lib/pq/internal/pqtest"
	outboxdriver "github.com/sqloutbox/outbox/driver"
)

// OutboxSuiteMode is set with -ldflags -X: "" runs the suite on lib/pq
// itself, "wrapped" through the outbox wrapper.
var OutboxSuiteMode string

var outboxSuite = func() *outboxdriver.Outbox {
	ob, err := outboxdriver.New(outboxdriver.Config{Dialect: outboxdriver.Postgres})
	if err != nil {
		panic(err)
	}
	return ob
}()

func init() {
	sql.Register("outbox-postgres", outboxSuite.Wrap(&Driver{}))
	pqtest.DriverName = OutboxSuiteDriverName()
}

// OutboxSuiteDriverName is what the suite's sql.Open calls open.
func OutboxSuiteDriverName() string {
	if OutboxSuiteMode == "" {
		return "postgres"
	}
	return "outbox-postgres"
}

// OutboxSuiteOpenDB is the suite's sql.OpenDB.
func OutboxSuiteOpenDB(c driver.Connector) *sql.DB {
	if OutboxSuiteMode != "" {
		c = outboxSuite.WrapConnector(c)
	}
	return sql.OpenDB(c)
}

// TestOutboxSuiteProbe checks that the suite's databases are what the mode says.
func TestOutboxSuiteProbe(t *testing.T) {
	c, err := NewConnector("")
	if err != nil {
		t.Fatal(err)
	}
	for name, db := range map[string]*sql.DB{"pqtest.MustDB": pqtest.MustDB(t), "OpenDB": OutboxSuiteOpenDB(c)} {
		sc, err := db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		err = sc.Raw(func(dc any) error {
			_, own := dc.(*conn)
			inner, unwrapped := outboxdriver.Unwrap(dc).(*conn)
			if unwrapped && name == "pqtest.MustDB" && inner.cfg.BinaryParameters != pqtest.ForceBinaryParameters() {
				t.Errorf("binary_parameters = %v, PQTEST_BINARY_PARAMETERS says %v", inner.cfg.BinaryParameters, pqtest.ForceBinaryParameters())
			}
			switch {
			case !unwrapped:
				t.Errorf("%s: Unwrap(%T) is not lib/pq's *conn", name, dc)
			case OutboxSuiteMode == "" && !own:
				t.Errorf("%s: raw mode, but Raw got %T", name, dc)
			case OutboxSuiteMode != "" && own:
				t.Errorf("%s: wrapped mode, but Raw got lib/pq's own connection", name)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		sc.Close()
		db.Close()
	}
}
`

// mysqlSuiteFile is added to go-sql-driver/mysql's package in the overlay.
const mysqlSuiteFile = `// Code generated by github.com/sqloutbox/outbox's TestDriverSuitesPassThrough
// in a temporary overlay; it is not part of go-sql-driver/mysql.

package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"testing"

	outboxdriver "github.com/sqloutbox/outbox/driver"
)

// OutboxSuiteMode is set with -ldflags -X: "" runs the suite on the driver
// itself, "wrapped" through the outbox wrapper, "unwrap" through the
// wrapper with Raw's argument passed through outboxdriver.Unwrap.
var OutboxSuiteMode string

var outboxSuite = func() *outboxdriver.Outbox {
	ob, err := outboxdriver.New(outboxdriver.Config{Dialect: outboxdriver.MySQL})
	if err != nil {
		panic(err)
	}
	return ob
}()

func init() {
	sql.Register("outbox-mysql", outboxSuite.Wrap(&MySQLDriver{}))
}

// OutboxSuiteDriverName is what the suite's sql.Open("mysql", ...) calls open.
func OutboxSuiteDriverName() string {
	if OutboxSuiteMode == "" {
		return "mysql"
	}
	return "outbox-mysql"
}

// OutboxSuiteOpenDB is the suite's sql.OpenDB.
func OutboxSuiteOpenDB(c driver.Connector) *sql.DB {
	if OutboxSuiteMode != "" {
		c = outboxSuite.WrapConnector(c)
	}
	return sql.OpenDB(c)
}

// OutboxSuiteRaw is applied to Raw's argument.
func OutboxSuiteRaw(c any) any {
	if OutboxSuiteMode == "unwrap" {
		return outboxdriver.Unwrap(c)
	}
	return c
}

// TestOutboxSuiteProbe checks that the suite's databases are what the mode says.
func TestOutboxSuiteProbe(t *testing.T) {
	if !available {
		t.Skipf("MySQL server not running on %s", netAddr)
	}
	byName, err := sql.Open(driverNameTest, dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	byLiteral, err := sql.Open(OutboxSuiteDriverName(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	for name, db := range map[string]*sql.DB{"driverNameTest": byName, "sql.Open": byLiteral, "OpenDB": OutboxSuiteOpenDB(c)} {
		sc, err := db.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		err = sc.Raw(func(dc any) error {
			_, own := dc.(*mysqlConn)
			_, unwrapped := outboxdriver.Unwrap(dc).(*mysqlConn)
			switch {
			case !unwrapped:
				t.Errorf("%s: Unwrap(%T) is not the driver's *mysqlConn", name, dc)
			case OutboxSuiteMode == "" && !own:
				t.Errorf("%s: raw mode, but Raw got %T", name, dc)
			case OutboxSuiteMode != "" && own:
				t.Errorf("%s: wrapped mode, but Raw got the driver's own connection", name)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		sc.Close()
		db.Close()
	}
}
`
