// Package orm tests the outbox driver under real ORMs and query builders
// (GORM, bun, sqlx) over the wrapped *sql.DB, on every dialect each
// supports: an event emitted inside a nested transaction (a savepoint) that
// is rolled back is never written nor published, while the enclosing
// transaction's events are (docs/guarantees.md, no ghost).
//
// The package has tests only; it lives in the nested module
// github.com/sqloutbox/outbox/integration so that the ORMs are not
// dependencies of the library.
package orm
