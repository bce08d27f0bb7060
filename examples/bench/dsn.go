package main

// The DSN handling below is a copy of the outbox repository's
// internal/conninfo (which an example may not import: you copy examples
// into your own module). Keep the copies alike.

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// mysqlConfig parses a go-sql-driver DSN, or a
// mysql://user:pass@host:port/db?params URL.
func mysqlConfig(dsn string) (*mysql.Config, error) {
	if !strings.HasPrefix(dsn, "mysql://") {
		return mysql.ParseDSN(dsn)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return nil, redactURLError(err)
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

// redactURLError drops the URL, which may hold a password, from a
// url.Parse error.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// sqliteDSN returns the project's DSN for the SQLite file at path (modernc.org/sqlite):
// WAL, a 10 s busy timeout, foreign keys on, and BEGIN IMMEDIATE for every
// transaction, so writers queue for the write lock instead of failing to
// upgrade a read lock. Parameters in user (may be nil) are kept: their
// pragmas run after the recipe's (so they win), other parameters replace
// the recipe's.
func sqliteDSN(path string, user url.Values) string {
	v := url.Values{}
	v.Add("_pragma", "busy_timeout(10000)")
	v.Add("_pragma", "journal_mode(WAL)")
	v.Add("_pragma", "synchronous(NORMAL)")
	v.Add("_pragma", "foreign_keys(1)")
	v.Set("_txlock", "immediate")
	for k, vals := range user {
		if k == "_pragma" {
			v[k] = append(v[k], vals...)
		} else {
			v[k] = vals
		}
	}
	return "file:" + path + "?" + v.Encode()
}
