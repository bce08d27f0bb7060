// Package dsn builds the connection strings the outbox is run with: the
// project's SQLite recipe for modernc.org/sqlite, and MySQL/MariaDB
// configurations for github.com/go-sql-driver/mysql from either of the two
// shapes users write, a go-sql-driver DSN or a mysql:// URL.
//
// The outbox command, the examples and the project's tests open their
// databases through this package, so an application that opens its own
// the same way gets the settings they are tested with. Nothing here
// opens a connection: the results are handed to sql.Open,
// mysql.NewConnector or a driver's OpenConnector, then wrapped as
// package driver describes.
//
// PostgreSQL needs nothing of this package: its postgres:// URLs go to
// lib/pq or pgx as they are. RedactURLError serves them too.
package dsn

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// MySQLConfig parses dsn, a MySQL or MariaDB data source name in either of
// two shapes, into a go-sql-driver configuration (for mysql.NewConnector,
// or FormatDSN for sql.Open("mysql", ...)):
//
//   - a go-sql-driver DSN, [user[:password]@][net[(addr)]]/dbname[?param=value&...],
//     e.g. "root@tcp(127.0.0.1:3306)/test": handed to mysql.ParseDSN
//     unchanged, with its defaults (tcp, 127.0.0.1:3306) and its errors;
//   - a URL, mysql://[user[:password]@][host[:port]]/[dbname][?param=value&...],
//     e.g. "mysql://app:s3cret@db.example:3307/shop?parseTime=true": the
//     host defaults to 127.0.0.1 and the port to 3306, the network is
//     always tcp, user and password are percent-decoded, and the query
//     parameters are go-sql-driver's (parseTime, loc, tls, ...), checked by
//     mysql.ParseDSN.
//
// Only a dsn that starts with "mysql://" is read as a URL. For a URL the
// errors never hold the password: one that does not parse returns
// url.Parse's error through RedactURLError, and mysql.ParseDSN is given
// the URL's address, database and parameters without user or password.
func MySQLConfig(dsn string) (*mysql.Config, error) {
	if !strings.HasPrefix(dsn, "mysql://") {
		return mysql.ParseDSN(dsn)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, RedactURLError(err)
	}
	host := u.Host
	if host == "" {
		host = "127.0.0.1"
	}
	if u.Port() == "" {
		host += ":3306"
	}
	plain := fmt.Sprintf("tcp(%s)/%s", host, strings.TrimPrefix(u.Path, "/"))
	if u.RawQuery != "" {
		plain += "?" + u.RawQuery
	}
	cfg, err := mysql.ParseDSN(plain)
	if err != nil {
		return nil, err
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	return cfg, nil
}

// RedactURLError returns err without the URL that url.Parse puts in its
// errors, which may hold a password: for a *url.Error, or an error
// wrapping one, it returns that *url.Error's Err, the reason alone
// (`invalid URL escape "%zz"`; the wrapping's text goes too); any other
// error, and nil, it returns as it is. Use it wherever the error of a URL
// that failed to parse would be logged or shown.
func RedactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// SQLite returns the project's DSN for the SQLite database file at path,
// for modernc.org/sqlite (driver name "sqlite"):
// "file:PATH?_pragma=...&_txlock=immediate", the parameters URL-encoded
// and PATH as given, not escaped (relative to the working directory if
// relative; SQLite reads a '?', '#' or '%' in it as URI syntax). The
// recipe, in modernc.org/sqlite's parameters:
//
//   - _pragma=busy_timeout(10000): a connection that finds the database
//     locked waits up to 10 s for it instead of failing at once with
//     SQLITE_BUSY;
//   - _pragma=journal_mode(WAL): readers do not block the writer nor it
//     them (the relay reads while applications commit);
//   - _pragma=synchronous(NORMAL): the setting SQLite recommends with WAL
//     (no fsync per commit): a commit survives the application crashing;
//     after a power loss or an OS crash the last commits may roll back,
//     each whole (its business rows with its outbox rows), and the
//     database is not corrupted;
//   - _pragma=foreign_keys(1): foreign keys are enforced (SQLite's default
//     is off);
//   - _txlock=immediate: every transaction begins with BEGIN IMMEDIATE,
//     taking the write lock at BEGIN, so concurrent writers queue for it
//     (within the busy timeout) instead of failing to upgrade a read lock
//     with SQLITE_BUSY in the middle of a transaction, which the busy
//     timeout cannot help.
//
// Parameters in user (may be nil) are kept. A _pragma of user replaces
// the recipe's pragma of the same name (the text before '(' or '=',
// case-insensitive: busy_timeout(500) replaces busy_timeout(10000)) and
// is added after the recipe's otherwise; the replacement is needed
// because modernc.org/sqlite runs a DSN's pragmas sorted (busy_timeout
// first, the others by their text), not in the order given, so of two
// pragmas of one name either could run last. Any other parameter of
// user replaces the recipe's (_txlock=deferred turns BEGIN IMMEDIATE
// off). SQLite checks nothing: an invalid parameter fails when
// modernc.org/sqlite opens a connection with the DSN.
func SQLite(path string, user url.Values) string {
	v := url.Values{}
	v.Add("_pragma", "busy_timeout(10000)")
	v.Add("_pragma", "journal_mode(WAL)")
	v.Add("_pragma", "synchronous(NORMAL)")
	v.Add("_pragma", "foreign_keys(1)")
	v.Set("_txlock", "immediate")
	for k, vals := range user {
		if k != "_pragma" {
			v[k] = vals
			continue
		}
		for _, p := range vals {
			v[k] = slices.DeleteFunc(v[k], func(q string) bool { return pragmaName(q) == pragmaName(p) })
			v[k] = append(v[k], p)
		}
	}
	return "file:" + path + "?" + v.Encode()
}

// pragmaName is the name a _pragma value sets, lower-cased:
// "journal_mode" for "journal_mode(WAL)" or "JOURNAL_MODE = wal".
func pragmaName(p string) string {
	name, _, _ := strings.Cut(p, "(")
	name, _, _ = strings.Cut(name, "=")
	return strings.ToLower(strings.TrimSpace(name))
}
