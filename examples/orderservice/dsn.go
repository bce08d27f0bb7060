package main

// sqliteDSN is a copy of the outbox repository's internal/conninfo.SQLite
// (which an example may not import: you copy examples into your own
// module). Keep the copies alike.

import "net/url"

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
