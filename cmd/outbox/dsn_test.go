package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

func TestRedactDSN(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"postgres://bob:secret@db:5432/app?sslmode=disable", "postgres://bob:xxxxx@db:5432/app?sslmode=disable"},
		{"postgresql://bob:p%40ss%2Fw0rd@db/app", "postgresql://bob:xxxxx@db/app"},
		{"postgres://bob@db/app", "postgres://bob@db/app"},
		{"postgres://db/app?user=bob&password=secret", "postgres://db/app?user=bob&password=xxxxx"},
		{"postgres://bob:s%zz@db/app", "postgres://bob:xxxxx@db/app"}, // unparsable URL
		{"mysql://root:secret@127.0.0.1:3306/test?parseTime=true", "mysql://root:xxxxx@127.0.0.1:3306/test?parseTime=true"},
		{"root:secret@tcp(127.0.0.1:3306)/test", "root:xxxxx@tcp(127.0.0.1:3306)/test"},
		{"root:se:cr@et@tcp(127.0.0.1:3306)/test?parseTime=true", "root:xxxxx@tcp(127.0.0.1:3306)/test?parseTime=true"},
		{"root@tcp(127.0.0.1:3306)/test", "root@tcp(127.0.0.1:3306)/test"},
		{"app:secret@unix(/run/mysqld/mysqld.sock)/app", "app:xxxxx@unix(/run/mysqld/mysqld.sock)/app"},
		{"host=db user=bob password=secret dbname=app", "host=db user=bob password=xxxxx dbname=app"},
		{"host=db password = 'se cret\\' x' dbname=app", "host=db password=xxxxx dbname=app"},
		{"sqlite:/var/lib/app.db", "sqlite:/var/lib/app.db"},
		{"file:/tmp/x.db?_pragma=busy_timeout(5000)", "file:/tmp/x.db?_pragma=busy_timeout(5000)"},
	} {
		if got := redactDSN(tc.in); got != tc.want {
			t.Errorf("redactDSN(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestRedactMessage(t *testing.T) {
	t.Parallel()
	a := &app{dsn: "postgres://bob:hunter22@db/app"}
	got := a.redact(`dial postgres://bob:hunter22@db/app: auth "hunter22" failed`)
	if strings.Contains(got, "hunter22") || !strings.Contains(got, "postgres://bob:xxxxx@db/app") {
		t.Errorf("redact: %q", got)
	}
	a = &app{dsn: "bob:hunter22@tcp(db:3306)/app"}
	if got := a.redact("access denied for hunter22"); strings.Contains(got, "hunter22") {
		t.Errorf("redact: %q", got)
	}
}

func TestParseDSN(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		dsn   string
		d     driver.Dialect
		where string
	}{
		{"postgres://bob:pw@db.example:6432/app", driver.Postgres, "db.example:6432"},
		{"postgresql://bob@db/app", driver.Postgres, "db:5432"},
		{"mysql://root:pw@db/app?parseTime=true", driver.MySQL, "db:3306"},
		{"mysql://root@db:3307/app", driver.MySQL, "db:3307"},
		{"root:pw@tcp(10.0.0.1:3306)/app", driver.MySQL, "10.0.0.1:3306"},
		{"root@unix(/run/mysqld.sock)/app", driver.MySQL, "/run/mysqld.sock"},
		{"sqlite:/data/app.db", driver.SQLite, "/data/app.db"},
		{"sqlite:///data/app.db", driver.SQLite, "/data/app.db"},
		{"file:rel/app.sqlite?_pragma=cache_size(2000)", driver.SQLite, "rel/app.sqlite"},
		{"/data/app.db", driver.SQLite, "/data/app.db"},
		// libpq's keyword/value form, as lib/pq and pgx accept it (issue
		// 36, item 8: the command refused it).
		{"host=db.example port=6432 dbname=app user=bob password=pw", driver.Postgres, "db.example:6432"},
		{"dbname=app.db host=db", driver.Postgres, "db:5432"},
		{"  user=bob host=10.0.0.2 sslmode=disable", driver.Postgres, "10.0.0.2:5432"},
	} {
		tg, err := parseDSN(tc.dsn)
		if err != nil {
			t.Errorf("parseDSN(%q): %v", tc.dsn, err)
			continue
		}
		if tg.dialect != tc.d || tg.where != tc.where {
			t.Errorf("parseDSN(%q) = %s at %s, want %s at %s", tc.dsn, tg.dialect, tg.where, tc.d, tc.where)
		}
	}
	for _, dsn := range []string{"", "oracle://x", "app.sqlite3", "sqlite:", "mysql://root@db/app?parseTime=maybe", "root@tcp(db)/app?parseTime=maybe", "host=db port=notaport"} {
		if _, err := parseDSN(dsn); err == nil {
			t.Errorf("parseDSN(%q) accepted", dsn)
		}
	}
}

// TestKeywordValueDSNConnects: the command reaches PostgreSQL through a
// libpq keyword/value --dsn, as the application's driver does (issue 36,
// item 8: "cannot tell the database from --dsn").
func TestKeywordValueDSNConnects(t *testing.T) {
	t.Parallel()
	cfg, err := pgconn.ParseConfig(testdb.PostgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	kv := fmt.Sprintf("host=%s port=%d dbname=%s user=%s sslmode=disable", cfg.Host, cfg.Port, cfg.Database, cfg.User)
	r := expect(t, cli(t, "migrate", "status", "--dsn", kv, "--table", "kv_never_migrated_"+uniqueID()), exitOutdated)
	if !strings.Contains(r.stdout+r.stderr, "schema version 0") {
		t.Errorf("migrate status through %q: %v", kv, r)
	}
}
