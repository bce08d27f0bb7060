package dsn_test

import (
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite" // registers driver "sqlite"

	"github.com/sqloutbox/outbox/driver/dsn"
)

func TestMySQLConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in                string
		net, addr, user, passwd string
		db                      string
		parseTime               bool
	}{
		{"DriverDSN", "root@tcp(127.0.0.1:3306)/test", "tcp", "127.0.0.1:3306", "root", "", "test", false},
		{"DriverDSNWithPasswordAndParams", "app:s3cret@tcp(db.example:3307)/shop?parseTime=true", "tcp", "db.example:3307", "app", "s3cret", "shop", true},
		{"DriverDSNDefaults", "/test", "tcp", "127.0.0.1:3306", "", "", "test", false},
		{"DriverDSNHostWithoutPort", "root@tcp(db)/test", "tcp", "db:3306", "root", "", "test", false},
		{"DriverDSNUnixSocket", "app@unix(/run/mysqld/mysqld.sock)/app", "unix", "/run/mysqld/mysqld.sock", "app", "", "app", false},
		{"URL", "mysql://app:s3cret@db.example:3307/shop?parseTime=true", "tcp", "db.example:3307", "app", "s3cret", "shop", true},
		{"URLWithoutPort", "mysql://root@localhost/test", "tcp", "localhost:3306", "root", "", "test", false},
		{"URLWithoutUser", "mysql://db.example:3307/shop", "tcp", "db.example:3307", "", "", "shop", false},
		{"URLWithoutHost", "mysql:///test", "tcp", "127.0.0.1:3306", "", "", "test", false},
		{"URLWithoutDatabase", "mysql://root@db", "tcp", "db:3306", "root", "", "", false},
		{"URLEscapedPassword", "mysql://app:p%40ss%2Fw0rd@db/app", "tcp", "db:3306", "app", "p@ss/w0rd", "app", false},
		{"URLIPv6", "mysql://root@[::1]:3307/test", "tcp", "[::1]:3307", "root", "", "test", false},
		{"URLIPv6WithoutPort", "mysql://root@[::1]/test", "tcp", "[::1]:3306", "root", "", "test", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := dsn.MySQLConfig(tc.in)
			if err != nil {
				t.Fatalf("MySQLConfig(%q): %v", tc.in, err)
			}
			if c.Net != tc.net || c.Addr != tc.addr || c.User != tc.user || c.Passwd != tc.passwd || c.DBName != tc.db || c.ParseTime != tc.parseTime {
				t.Errorf("MySQLConfig(%q) = net %q addr %q user %q passwd %q db %q parseTime %v, want %q %q %q %q %q %v",
					tc.in, c.Net, c.Addr, c.User, c.Passwd, c.DBName, c.ParseTime, tc.net, tc.addr, tc.user, tc.passwd, tc.db, tc.parseTime)
			}
		})
	}
}

func TestMySQLConfigURLParams(t *testing.T) {
	t.Parallel()
	c, err := dsn.MySQLConfig("mysql://app@db/shop?parseTime=true&loc=UTC&timeout=5s&sql_mode=ANSI")
	if err != nil {
		t.Fatal(err)
	}
	if !c.ParseTime || c.Loc != time.UTC || c.Timeout != 5*time.Second || c.Params["sql_mode"] != "ANSI" {
		t.Errorf("parameters not passed to go-sql-driver: parseTime %v loc %v timeout %v params %v", c.ParseTime, c.Loc, c.Timeout, c.Params)
	}
}

func TestMySQLConfigErrors(t *testing.T) {
	t.Parallel()
	const password = "hunter2"
	for _, tc := range []struct{ name, in string }{
		{"URLBadEscape", "mysql://app:" + password + "%zz@db/app"},
		{"URLBadPort", "mysql://app:" + password + "@db:port/app"},
		{"URLBadParam", "mysql://app:" + password + "@db/app?parseTime=maybe"},
		{"DriverDSNUnterminatedAddress", "app:" + password + "@tcp(db/app"},
		{"DriverDSNBadParam", "app:" + password + "@tcp(db)/app?parseTime=maybe"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := dsn.MySQLConfig(tc.in)
			if err == nil {
				t.Fatalf("MySQLConfig(%q) = %+v, want an error", tc.in, c)
			}
			if strings.Contains(err.Error(), password) {
				t.Errorf("MySQLConfig(%q)'s error holds the password: %v", tc.in, err)
			}
		})
	}
}

func TestRedactURLError(t *testing.T) {
	t.Parallel()
	//lint:ignore SA1007 the URL is invalid on purpose: its error is the input
	_, parseErr := url.Parse("postgres://bob:hunter2%zz@db/app")
	if parseErr == nil || !strings.Contains(parseErr.Error(), "hunter2") {
		t.Fatalf("url.Parse's error should hold the URL for this test to mean anything: %v", parseErr)
	}
	other := errors.New("other")
	for _, tc := range []struct {
		name string
		in   error
		want string // "" for nil
	}{
		{"URLError", parseErr, `invalid URL escape "%zz"`},
		{"WrappedURLError", fmt.Errorf("opening: %w", parseErr), `invalid URL escape "%zz"`},
		{"OtherError", other, "other"},
		{"Nil", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := dsn.RedactURLError(tc.in)
			if tc.want == "" {
				if got != nil {
					t.Fatalf("RedactURLError(nil) = %v", got)
				}
				return
			}
			if got == nil || got.Error() != tc.want {
				t.Errorf("RedactURLError(%v) = %v, want %q", tc.in, got, tc.want)
			}
		})
	}
	if got := dsn.RedactURLError(other); got != other {
		t.Errorf("RedactURLError changed an error that is not a *url.Error: %v", got)
	}
}

func TestSQLite(t *testing.T) {
	t.Parallel()
	const recipe = "_pragma=busy_timeout%2810000%29&_pragma=journal_mode%28WAL%29&_pragma=synchronous%28NORMAL%29&_pragma=foreign_keys%281%29"
	for _, tc := range []struct {
		name string
		path string
		user url.Values
		want string
	}{
		{"Recipe", "/data/app.db", nil, "file:/data/app.db?" + recipe + "&_txlock=immediate"},
		{"RelativePath", "app.db", url.Values{}, "file:app.db?" + recipe + "&_txlock=immediate"},
		{"OtherParameterAdded", "/x.db", url.Values{"_time_format": {"sqlite"}}, "file:/x.db?" + recipe + "&_time_format=sqlite&_txlock=immediate"},
		{"TxlockReplaced", "/x.db", url.Values{"_txlock": {"deferred"}}, "file:/x.db?" + recipe + "&_txlock=deferred"},
		{"PragmaAdded", "/x.db", url.Values{"_pragma": {"cache_size(2000)"}}, "file:/x.db?" + recipe + "&_pragma=cache_size%282000%29&_txlock=immediate"},
		{"PragmaReplaced", "/x.db", url.Values{"_pragma": {"busy_timeout(500)"}},
			"file:/x.db?_pragma=journal_mode%28WAL%29&_pragma=synchronous%28NORMAL%29&_pragma=foreign_keys%281%29&_pragma=busy_timeout%28500%29&_txlock=immediate"},
		{"PragmaReplacedWhateverItsSpelling", "/x.db", url.Values{"_pragma": {" Synchronous = FULL"}},
			"file:/x.db?_pragma=busy_timeout%2810000%29&_pragma=journal_mode%28WAL%29&_pragma=foreign_keys%281%29&_pragma=+Synchronous+%3D+FULL&_txlock=immediate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := dsn.SQLite(tc.path, tc.user); got != tc.want {
				t.Errorf("SQLite(%q, %v) =\n%s\nwant\n%s", tc.path, tc.user, got, tc.want)
			}
		})
	}
}

// TestSQLiteOpens opens databases with SQLite's DSNs through
// modernc.org/sqlite and reads back the settings that took effect: the
// recipe's, and the user's where they replace it.
func TestSQLiteOpens(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name                 string
		user                 url.Values
		busyTimeout          int
		journalMode          string
		synchronous, foreign int
	}{
		{"Recipe", nil, 10000, "wal", 1, 1},
		{"UserPragmasWin", url.Values{"_pragma": {"busy_timeout(500)", "synchronous(FULL)", "journal_mode(DELETE)", "foreign_keys(0)"}}, 500, "delete", 2, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, err := sql.Open("sqlite", dsn.SQLite(filepath.Join(t.TempDir(), "x.db"), tc.user))
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var busy, sync, fk int
			var journal string
			for _, q := range []struct {
				pragma string
				into   any
			}{{"busy_timeout", &busy}, {"journal_mode", &journal}, {"synchronous", &sync}, {"foreign_keys", &fk}} {
				if err := db.QueryRow("PRAGMA " + q.pragma).Scan(q.into); err != nil {
					t.Fatalf("PRAGMA %s: %v", q.pragma, err)
				}
			}
			if busy != tc.busyTimeout || journal != tc.journalMode || sync != tc.synchronous || fk != tc.foreign {
				t.Errorf("busy_timeout %d journal_mode %s synchronous %d foreign_keys %d, want %d %s %d %d",
					busy, journal, sync, fk, tc.busyTimeout, tc.journalMode, tc.synchronous, tc.foreign)
			}
		})
	}
}
