// Package sqlerr classifies database errors without importing any driver
// (the root module's driver package must not: a driver's own test suite run
// through the wrapper would form an import cycle, and the inbox module
// serves every dialect). Each classifier walks the whole error chain and
// recognises PostgreSQL's SQLSTATE through SQLState() (lib/pq's *pq.Error,
// pgx's *pgconn.PgError), MySQL/MariaDB's error number in the Number field
// of go-sql-driver/mysql's *MySQLError (it offers no method), and SQLite's
// result code through Code() (modernc's *sqlite.Error) or, where SQLite
// has no specific code, its message.
package sqlerr

import (
	"reflect"
	"strings"
)

// Walk calls f on err and every error it wraps (Unwrap() error and
// Unwrap() []error), depth first, until f returns true; it reports whether
// f did.
func Walk(err error, f func(error) bool) bool {
	for err != nil {
		if f(err) {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if Walk(e, f) {
					return true
				}
			}
			return false
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		default:
			return false
		}
	}
	return false
}

// sqlState is e's PostgreSQL SQLSTATE, or "".
func sqlState(e error) string {
	if s, ok := e.(interface{ SQLState() string }); ok {
		return s.SQLState()
	}
	return ""
}

// mysqlNumber is e's MySQL/MariaDB error number, or 0.
func mysqlNumber(e error) uint64 {
	v := reflect.ValueOf(e)
	if v.Kind() == reflect.Pointer {
		v = v.Elem()
	}
	if v.Kind() == reflect.Struct && v.Type().Name() == "MySQLError" {
		if n := v.FieldByName("Number"); n.IsValid() && n.CanUint() {
			return n.Uint()
		}
	}
	return 0
}

// sqliteCode is e's SQLite (extended) result code, or -1.
func sqliteCode(e error) int {
	if c, ok := e.(interface{ Code() int }); ok {
		return c.Code()
	}
	return -1
}

// UniqueViolation reports a unique-key violation: SQLSTATE 23505, MySQL
// error 1062 ER_DUP_ENTRY, SQLite extended code 2067
// SQLITE_CONSTRAINT_UNIQUE.
func UniqueViolation(err error) bool {
	return Walk(err, func(e error) bool {
		return sqlState(e) == "23505" || mysqlNumber(e) == 1062 || sqliteCode(e) == 2067
	})
}

// Deadlock reports a transaction the server rolled back to break a
// deadlock or a serialization conflict, which the whole transaction may
// retry: SQLSTATE 40P01 deadlock_detected or 40001 serialization_failure,
// MySQL error 1213 ER_LOCK_DEADLOCK (InnoDB rolls the whole transaction
// back). A lock wait timeout (MySQL 1205) is not one: InnoDB rolls back
// only the statement.
func Deadlock(err error) bool {
	return Walk(err, func(e error) bool {
		s := sqlState(e)
		return s == "40P01" || s == "40001" || mysqlNumber(e) == 1213
	})
}

// UndefinedTable reports a statement on a table that does not exist:
// SQLSTATE 42P01 undefined_table, MySQL error 1146 ER_NO_SUCH_TABLE, and
// SQLite's "no such table" (its result code, SQLITE_ERROR, is shared with
// every other SQL error, so the message decides).
func UndefinedTable(err error) bool {
	return Walk(err, func(e error) bool {
		if sqlState(e) == "42P01" || mysqlNumber(e) == 1146 {
			return true
		}
		return sqliteCode(e) >= 0 && strings.Contains(e.Error(), "no such table")
	})
}

// PostgresCode returns the first PostgreSQL SQLSTATE in err's chain
// (lib/pq or pgx), or "".
func PostgresCode(err error) string {
	var code string
	Walk(err, func(e error) bool { code = sqlState(e); return code != "" })
	return code
}

// PostgresWhere returns the context (the server's "where" field: the
// call stack of PL/pgSQL functions, or a logical decoding slot's output
// plugin and callback) of the first PostgreSQL error in err's chain
// (lib/pq's and pgx's errors both have a Where field), or "".
func PostgresWhere(err error) string {
	var where string
	Walk(err, func(e error) bool {
		if sqlState(e) == "" {
			return false
		}
		v := reflect.ValueOf(e)
		if v.Kind() == reflect.Pointer {
			v = v.Elem()
		}
		if v.Kind() == reflect.Struct {
			if f := v.FieldByName("Where"); f.IsValid() && f.Kind() == reflect.String {
				where = f.String()
			}
		}
		return true
	})
	return where
}
