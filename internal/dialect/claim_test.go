package dialect

import (
	"fmt"
	"strings"
	"testing"
)

func TestIDRanges(t *testing.T) {
	cases := []struct {
		ids    []int64
		ranges [][2]int64
		want   string
	}{
		{nil, nil, "[]"},
		{[]int64{5}, nil, "[[5 5]]"},
		{[]int64{3, 1, 2, 7, 9, 8}, nil, "[[1 3] [7 9]]"},
		{[]int64{4}, [][2]int64{{1, 3}, {5, 6}}, "[[1 6]]"},
		{[]int64{10}, [][2]int64{{1, 3}}, "[[1 3] [10 10]]"},
		{nil, [][2]int64{{5, 9}, {1, 6}}, "[[1 9]]"},
		{[]int64{2, 2, 3}, [][2]int64{{1, 1}}, "[[1 3]]"},
	}
	for _, c := range cases {
		if got := fmt.Sprint(IDRanges(c.ids, c.ranges)); got != c.want {
			t.Errorf("IDRanges(%v, %v) = %s, want %s", c.ids, c.ranges, got, c.want)
		}
	}
}

// TestClaimExcluding: skipped ids and sent ranges are left out exactly, as
// ranges and single ids, never as an IN list (MariaDB turns one of 1,000
// values into a derived table); SQLite ignores sent ranges; PostgreSQL
// claims through ClaimFloor instead.
func TestClaimExcluding(t *testing.T) {
	my, err := New(MySQL, "outbox_message")
	if err != nil {
		t.Fatal(err)
	}
	skip := make([]int64, 0, 2000)
	for id := int64(1001); id <= 3000; id++ {
		if id != 1500 {
			skip = append(skip, id)
		}
	}
	q, args := my.ClaimExcluding([]int{0, 1}, skip, [][2]int64{{1, 1000}, {4000, 4000}})
	if args != nil {
		t.Fatalf("MySQL claim arguments %v, want none", args)
	}
	want := "AND p.partition_key IN (0,1) AND p.id NOT BETWEEN 1 AND 1499 AND p.id NOT BETWEEN 1501 AND 3000 AND p.id <> 4000"
	if !strings.Contains(q, want) || strings.Contains(q, "NOT IN") {
		t.Fatalf("MySQL claim does not exclude exactly %q:\n%s", want, q)
	}
	lite, err := New(SQLite, "outbox_message")
	if err != nil {
		t.Fatal(err)
	}
	q, _ = lite.ClaimExcluding(nil, []int64{7, 8}, [][2]int64{{1, 5}})
	if !strings.Contains(q, "AND p.id NOT IN (7,8)") || strings.Contains(q, "BETWEEN") {
		t.Fatalf("SQLite claim must leave out the skipped ids only, as one NOT IN list:\n%s", q)
	}
	if pg, _ := New(Postgres, "outbox_message"); !pg.HasClaimFloor() || my.HasClaimFloor() || lite.HasClaimFloor() {
		t.Fatal("PostgreSQL claims through ClaimFloor, the others through ClaimExcluding")
	}
}

// TestClaimBatch: MySQL/MariaDB gets its batch size in the text and no
// arguments (one round trip with go-sql-driver/mysql), SQLite as its one
// argument; a batch below 1 is claimed as 1.
func TestClaimBatch(t *testing.T) {
	cases := []struct {
		name     Name
		batch    int
		wantText string
		wantArgs []any
	}{
		{MySQL, 500, "LIMIT 500", nil},
		{MySQL, 0, "LIMIT 1", nil},
		{SQLite, 500, "LIMIT ?", []any{500}},
		{SQLite, -3, "LIMIT ?", []any{1}},
	}
	for _, c := range cases {
		d, err := New(c.name, "outbox_message")
		if err != nil {
			t.Fatal(err)
		}
		q, args := d.ClaimBatch(c.batch, []int{0}, []int64{9}, nil)
		if !strings.Contains(q, c.wantText) || strings.Count(q, "?") != len(c.wantArgs) || !(strings.Contains(q, "p.id <> 9") || strings.Contains(q, "p.id NOT IN (9)")) {
			t.Errorf("%s batch %d: text without %q or with a placeholder per argument %v:\n%s", c.name, c.batch, c.wantText, c.wantArgs, q)
		}
		if fmt.Sprint(args) != fmt.Sprint(c.wantArgs) || len(args) != len(c.wantArgs) {
			t.Errorf("%s batch %d: arguments %v, want %v", c.name, c.batch, args, c.wantArgs)
		}
	}
}

// TestClaimLate: the MySQL/MariaDB claim's second statement leaves out
// the ids given and every id from the bound up (ranges above the bound are
// not written), takes its batch in the text, and exists on MySQL only.
func TestClaimLate(t *testing.T) {
	my, err := New(MySQL, "outbox_message")
	if err != nil {
		t.Fatal(err)
	}
	q := my.ClaimLate(2, []int{3}, []int64{10, 11, 12, 20, 40}, [][2]int64{{1, 5}, {50, 60}}, 30)
	want := "AND p.partition_key IN (3) AND p.id < 30 AND p.id NOT BETWEEN 1 AND 5 AND p.id NOT BETWEEN 10 AND 12 AND p.id <> 20\n"
	if !strings.Contains(q, want) || !strings.Contains(q, "LIMIT 2") || strings.Contains(q, "?") {
		t.Fatalf("MySQL late-rows claim does not read %q with LIMIT 2 and no placeholder:\n%s", want, q)
	}
	if q := my.ClaimLate(0, []int{0}, nil, nil, 0); !strings.Contains(q, "p.id < 1") || !strings.Contains(q, "LIMIT 1") {
		t.Fatalf("bound and batch below 1 must be taken as 1:\n%s", q)
	}
	for _, n := range []Name{Postgres, SQLite} {
		d, err := New(n, "outbox_message")
		if err != nil {
			t.Fatal(err)
		}
		if q := d.ClaimLate(2, []int{0}, nil, nil, 30); q != "" {
			t.Errorf("%s has no late-rows claim, got:\n%s", n, q)
		}
	}
}
