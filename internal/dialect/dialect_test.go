package dialect

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestSupportedVersion(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name Name
		ver  string
		ok   bool
	}{
		{Postgres, "110022", false},
		{Postgres, "120000", true},
		{Postgres, "150020", true},
		{Postgres, "garbage", false},
		{MySQL, "10.5.23-MariaDB", false},
		{MySQL, "10.6.0-MariaDB", true},
		{MySQL, "10.11.19-MariaDB-0+deb12u1", true},
		{MySQL, "11.4.2-MariaDB", true},
		{MySQL, "5.7.44", false},
		{MySQL, "8.0.36", true},
		{MySQL, "8.4.0-commercial", true},
		{SQLite, "3.41.2", false},
		{SQLite, "3.42.0", true},
		{SQLite, "3.50.1", true},
	} {
		err := SupportedVersion(c.name, c.ver)
		if (err == nil) != c.ok {
			t.Errorf("%s %q: err = %v, want ok=%v", c.name, c.ver, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrUnsupportedServer) {
			t.Errorf("%s %q: %v does not match ErrUnsupportedServer", c.name, c.ver, err)
		}
	}
}

func TestTableNames(t *testing.T) {
	t.Parallel()
	good := []string{"outbox_message", "_x", "public.outbox", "s1.t1", strings.Repeat("a", 40)}
	bad := []string{"", "1abc", "a.b.c", "a-b", "x; DROP TABLE y", "a.", ".a", strings.Repeat("a", 41), "tab le", `a"b`, "a`b"}
	for _, name := range []Name{Postgres, MySQL, SQLite} {
		for _, g := range good {
			if _, err := New(name, g); err != nil {
				t.Errorf("%s %q: %v", name, g, err)
			}
		}
		for _, b := range bad {
			if _, err := New(name, b); !errors.Is(err, ErrInvalidTable) {
				t.Errorf("%s %q: err = %v, want ErrInvalidTable", name, b, err)
			}
		}
	}
	if _, err := New("oracle", "t"); !errors.Is(err, ErrUnknownDialect) {
		t.Errorf("unknown dialect: %v", err)
	}
}

func TestRenderedSQL(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  Name
		table string
		want  []string
	}{
		{Postgres, "app.events", []string{`CREATE TABLE IF NOT EXISTS "app"."events"`, `"events_pending_idx" ON "app"."events"`}},
		{MySQL, "app.events", []string{"CREATE TABLE IF NOT EXISTS `app`.`events`", "KEY `events_status_retry_idx`"}},
		{SQLite, "main.events", []string{`CREATE TABLE IF NOT EXISTS "main"."events"`, `"main"."events_pending_idx" ON "events"`}},
	} {
		d, err := New(c.name, c.table)
		if err != nil {
			t.Fatal(err)
		}
		ddl := d.DDL()
		for _, w := range c.want {
			if !strings.Contains(ddl, w) {
				t.Errorf("%s DDL lacks %q:\n%s", c.name, w, ddl)
			}
		}
		for _, q := range []string{"mark_sent", "mark_retry", "mark_dead", "mark_dead_released", "dead_list", "dead_retry", "dead_skip", "now", "version", "insert", "insert_row"} {
			if strings.Contains(d.Query(q), "{{.") {
				t.Errorf("%s query %s not rendered", c.name, q)
			}
		}
	}
}

func TestInsertPlaceholders(t *testing.T) {
	t.Parallel()
	pg, _ := New(Postgres, "t")
	q := pg.Insert(2)
	if !strings.Contains(q, "$18") || strings.Contains(q, "$19") || strings.Contains(q, "?") {
		t.Errorf("postgres insert for 2 rows: %s", q)
	}
	my, _ := New(MySQL, "t")
	if n := strings.Count(my.Insert(3), "?"); n != 3*InsertColumns {
		t.Errorf("mysql insert for 3 rows has %d placeholders", n)
	}
	if pg.MaxInsertRows()*InsertColumns > 65535 {
		t.Error("postgres rows exceed the parameter limit")
	}
	lite, _ := New(SQLite, "t")
	if lite.MaxInsertRows()*InsertColumns > 32766 {
		t.Error("sqlite rows exceed the parameter limit")
	}
	q, args := my.MarkSent([]int64{4, 5, 6}, "")
	if strings.Count(q, "?") != 3 || len(args) != 3 {
		t.Errorf("mysql mark_sent: %s %v", q, args)
	}
	q, args = pg.MarkSent([]int64{4, 5, 6}, "")
	if len(args) != 1 || args[0] != "{4,5,6}" || !strings.Contains(q, "ANY($1") {
		t.Errorf("postgres mark_sent: %s %v", q, args)
	}
}

func TestFencedWrites(t *testing.T) {
	t.Parallel()
	pg, _ := New(Postgres, "s.t")
	q, args := pg.MarkSent([]int64{1}, "relay-a")
	if !strings.Contains(q, "l.owner = $2") || len(args) != 2 || args[1] != "relay-a" || !strings.Contains(q, `"s"."t_lease"`) {
		t.Errorf("fenced postgres mark_sent: %s %v", q, args)
	}
	if q := pg.Fenced("mark_retry", true); !strings.Contains(q, "l.owner = $4") {
		t.Errorf("fenced postgres mark_retry: %s", q)
	}
	for _, n := range []Name{Postgres, MySQL, SQLite} {
		d, _ := New(n, "t")
		if q, _ := d.MarkSent([]int64{1}, "x"); strings.Contains(q, "{{") {
			t.Errorf("%s mark_sent: marker left: %s", n, q)
		}
		for _, q := range []string{"mark_retry", "mark_dead", "mark_dead_released"} {
			if strings.Contains(d.Fenced(q, false), "{{") || strings.Contains(d.Fenced(q, true), "{{") {
				t.Errorf("%s %s: marker left", n, q)
			}
		}
		if d.HasClaimFloor() {
			if q := d.ClaimFloor(); strings.Contains(q, "{{") || !strings.Contains(q, `"t_claim"(`) {
				t.Errorf("%s claim_floor: %s", n, q)
			}
		} else if strings.Contains(d.Claim(nil), "{{") || !strings.Contains(d.Claim([]int{3, 7}), "IN (3,7)") {
			t.Errorf("%s claim partitions: %s", n, d.Claim([]int{3, 7}))
		}
		if got := strings.Count(d.LeaseInit(4), "0)"); got != 4 {
			t.Errorf("%s lease_init: %s", n, d.LeaseInit(4))
		}
	}
}

// TestLeaseAcquire: the statement taking several partitions at once has
// the instance, the TTL and one placeholder per partition (none for no
// partition); MySQL/MariaDB alone lock them first, without waiting.
func TestLeaseAcquire(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name Name
		n    int
		want string // a fragment of the statement; "" for none
	}{
		{Postgres, 3, "partition_key IN ($3, $4, $5)"},
		{Postgres, 1, "partition_key IN ($3)"},
		{Postgres, 0, ""},
		{SQLite, 2, "partition_key IN (?, ?)"},
		{MySQL, 3, "partition_key IN (?, ?, ?)"},
	} {
		d, _ := New(tc.name, "t")
		q := d.LeaseAcquire(tc.n)
		lock := d.LeaseLockFree(tc.n)
		if (lock != "") != (tc.name == MySQL && tc.n > 0) || strings.Count(lock, "?") != map[bool]int{true: tc.n}[tc.name == MySQL] ||
			(lock != "" && !strings.HasSuffix(lock, "FOR UPDATE SKIP LOCKED")) {
			t.Errorf("%s LeaseLockFree(%d) = %q", tc.name, tc.n, lock)
		}
		switch {
		case tc.want == "" && q != "":
			t.Errorf("%s LeaseAcquire(%d) = %s, want none", tc.name, tc.n, q)
		case tc.want != "" && (!strings.Contains(q, tc.want) || strings.Contains(q, "{{")):
			t.Errorf("%s LeaseAcquire(%d) = %s, want it to contain %q", tc.name, tc.n, q, tc.want)
		}
	}
}

// TestClaimReadsTheClockOnce is the regression test for a claim that read
// the database clock twice (PostgreSQL: two InitPlans evaluated at
// different moments; SQLite: 'now' re-read at each step): a retry coming
// due between the reads was neither claimed nor holding its aggregate, and
// a later event of the aggregate went out first (seen under load as
// "A delivered as [A-2 A-3 A-1]"). MySQL's UTC_TIMESTAMP() is constant
// within a statement by definition.
func TestClaimReadsTheClockOnce(t *testing.T) {
	t.Parallel()
	lite, _ := New(SQLite, "t")
	if n := strings.Count(lite.Claim(nil), "unixepoch("); n != 1 {
		t.Errorf("sqlite claim reads the clock %d times, want once:\n%s", n, lite.Claim(nil))
	}
	pg, _ := New(Postgres, "t")
	var fn string
	for _, m := range pg.Migrations() {
		for _, s := range m.Statements {
			if strings.HasPrefix(s, `CREATE OR REPLACE FUNCTION "t_claim"`) {
				fn = s
			}
		}
	}
	// statement_timestamp() is the client statement's start, the same
	// for every statement inside the function.
	if fn == "" || strings.Contains(fn, "clock_timestamp()") || !strings.Contains(fn, "statement_timestamp()") {
		t.Errorf("postgres claim function must use the one statement_timestamp(), not clock_timestamp() reads:\n%s", fn)
	}
}

func TestChunks(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		n, max int
		want   [][2]int
	}{
		{0, 0, [][2]int{{0, 0}}},
		{5, 0, [][2]int{{0, 5}}},
		{5, 5, [][2]int{{0, 5}}},
		{5, 2, [][2]int{{0, 2}, {2, 4}, {4, 5}}},
		{1000, 500, [][2]int{{0, 500}, {500, 1000}}},
	} {
		if got := Chunks(c.n, c.max); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Chunks(%d, %d) = %v, want %v", c.n, c.max, got, c.want)
		}
	}
}

// TestMaxIDs: on MySQL/MariaDB the id-list statements that MariaDB would
// turn into a derived-table join at 1,000 ids are split below that.
func TestMaxIDs(t *testing.T) {
	t.Parallel()
	for _, name := range []Name{Postgres, MySQL, SQLite} {
		d, err := New(name, "outbox_message")
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{"mark_sent", "mark_sent_retried", "delete_sent", "retention_archive", "retention_delete"} {
			want := 0
			if name == MySQL && q != "mark_sent_retried" { // a single-table UPDATE keeps a range
				want = MySQLMaxIDs
			}
			if got := d.MaxIDs(q); got != want {
				t.Errorf("%s MaxIDs(%s) = %d, want %d", name, q, got, want)
			}
		}
	}
	if MySQLMaxIDs >= 1000 {
		t.Fatalf("MySQLMaxIDs = %d, must stay below MariaDB's in_predicate_conversion_threshold (1,000)", MySQLMaxIDs)
	}
}

// TestChannel: the NOTIFY channel names the schema of a qualified table
// (tables of one name in two schemas used to share one channel and wake
// each other's relays), keeps the case, and stays within PostgreSQL's
// 63-byte limit, distinct for distinct long names; LISTEN quotes it.
func TestChannel(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("s", 63)
	cases := []struct{ table, want string }{
		{"outbox_message", "outbox_message_wakeup"},
		{"Outbox", "Outbox_wakeup"},
		{"tenant_a.outbox_message", "tenant_a.outbox_message_wakeup"},
		{"tenant_b.outbox_message", "tenant_b.outbox_message_wakeup"},
		{"Shop.Events", "Shop.Events_wakeup"},
	}
	for _, c := range cases {
		d, err := New(Postgres, c.table)
		if err != nil {
			t.Fatal(err)
		}
		if got := d.Channel(); got != c.want {
			t.Errorf("Channel of %s: %q, want %q", c.table, got, c.want)
		}
	}
	a, _ := New(Postgres, long+".outbox_message")
	b, _ := New(Postgres, long+".outbox_messages")
	ca, cb := a.Channel(), b.Channel()
	if len(ca) > 63 || len(cb) > 63 || ca == cb || !strings.HasPrefix(ca, long[:46]) {
		t.Errorf("long qualified names: %q (%d bytes) and %q (%d bytes), want distinct names of at most 63 bytes", ca, len(ca), cb, len(cb))
	}
	if got, want := ListenStatement(`Shop.Events_wakeup`), `LISTEN "Shop.Events_wakeup"`; got != want {
		t.Errorf("ListenStatement: %s, want %s", got, want)
	}
	if got, want := ListenStatement(`a"b`), `LISTEN "a""b"`; got != want {
		t.Errorf("ListenStatement quoting: %s, want %s", got, want)
	}
}
