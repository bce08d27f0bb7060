package driver

import (
	"context"
	sqldriver "database/sql/driver"
	"reflect"
	"strings"
	"sync"
)

// StatementCacheSize is how many prepared event INSERTs one connection
// keeps (least recently used first out). A statement is keyed by its row
// count, so a workload whose transactions emit 1 to 16 events uses at most
// 16; INSERTs of more than 256 rows are never cached. An evicted statement is closed (one round
// trip on lib/pq and pgx; go-sql-driver/mysql's close is not answered).
const StatementCacheSize = 16

// cacheable reports whether connections of o get the statement cache:
//
//   - not with Config.DisableStatementCache;
//   - not on pgx's stdlib connections: pgx keeps its own statement cache
//     (its default QueryExecModeCacheStatement; BenchmarkCommit measured
//     emit10 the same with and without ours), and a user who chose another
//     mode, such as simple protocol for PgBouncer, chose not to prepare;
//   - not on MySQL/MariaDB with an unqualified Config.Table: a MySQL
//     prepared statement keeps the database that was current when it was
//     prepared, so after USE on a pooled connection the cached INSERT
//     would write events into the previous database's outbox while the
//     transaction's own statements follow USE. PostgreSQL re-resolves a
//     prepared statement's names when search_path changes, and SQLite
//     re-prepares on a schema change.
func (o *Outbox) cacheable(conn sqldriver.Conn) bool {
	switch {
	case o.cfg.DisableStatementCache:
		return false
	case o.cfg.Dialect == MySQL && !strings.Contains(o.cfg.Table, "."):
		return false
	}
	t := reflect.TypeOf(conn)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return !strings.HasPrefix(t.PkgPath(), "github.com/jackc/pgx/")
}

// stmtCache keeps the commit hook's prepared INSERTs for one
// connection's lifetime (see conn.cache).
//
// On SQLite, close finalizes the statements before the connection closes
// (sqlite3_close_v2 would otherwise keep the database open as a zombie).
// On the servers it drops them unclosed: the server frees a session's
// statements when the session ends, and closing them first would wait on
// the network, without a deadline on lib/pq, for a connection that is
// usually being closed because it broke. For the same reason a statement
// whose execution failed is forgotten, not closed, on the servers (on MySQL
// it counts toward max_prepared_stmt_count until its connection closes).
type stmtCache struct {
	finalize bool // close statements on close and on failure (SQLite)

	mu    sync.Mutex
	stmts []cachedStmt // most recently used last
}

type cachedStmt struct {
	key  int
	stmt sqldriver.Stmt
}

// exec runs query (the INSERT with cache key key) with args on conn, through
// the connection's prepared statement for key, preparing it on first use.
// A statement whose Exec fails (or panics) is dropped, closed on SQLite
// only (see cachingConn), so the next commit prepares it again (after
// DEALLOCATE ALL or DISCARD ALL, for instance).
func (c *stmtCache) exec(ctx context.Context, conn *conn, key int, query string, args []sqldriver.NamedValue) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var stmt sqldriver.Stmt
	err := recovered(func() (err error) {
		stmt, err = c.stmtLocked(ctx, conn, key, query)
		return err
	})
	if err != nil {
		return err
	}
	if err := recovered(func() error { return stmtExec(ctx, stmt, args) }); err != nil {
		c.dropLocked(key)
		return err
	}
	return nil
}

// stmtLocked returns the cached statement for key, moved to the
// most-recently-used end, or prepares and caches it, closing the least
// recently used statement when the cache is full.
func (c *stmtCache) stmtLocked(ctx context.Context, conn *conn, key int, query string) (sqldriver.Stmt, error) {
	for i := len(c.stmts) - 1; i >= 0; i-- {
		if e := c.stmts[i]; e.key == key {
			copy(c.stmts[i:], c.stmts[i+1:])
			c.stmts[len(c.stmts)-1] = e
			return e.stmt, nil
		}
	}
	stmt, err := conn.prepareParent(ctx, query)
	if err != nil {
		return nil, err
	}
	if len(c.stmts) == StatementCacheSize {
		// Close errors of an evicted statement do not concern this
		// transaction; a broken connection fails the Exec that follows.
		_ = c.stmts[0].stmt.Close()
		c.stmts = append(c.stmts[:0], c.stmts[1:]...)
	}
	c.stmts = append(c.stmts, cachedStmt{key: key, stmt: stmt})
	return stmt, nil
}

func (c *stmtCache) dropLocked(key int) {
	for i, e := range c.stmts {
		if e.key == key {
			if c.finalize {
				_ = recovered(e.stmt.Close) // the Exec error is the one to report
			}
			c.stmts = append(c.stmts[:i], c.stmts[i+1:]...)
			return
		}
	}
}

// stmtExec executes a prepared statement, dropping its result.
func stmtExec(ctx context.Context, stmt sqldriver.Stmt, args []sqldriver.NamedValue) error {
	_, err := stmtExecResult(ctx, stmt, args)
	return err
}

// close closes the cached statements on SQLite (see stmtCache) and
// forgets them. A statement's Close error is dropped, as database/sql drops
// those of the statements it closes before a connection.
func (c *stmtCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.finalize {
		for _, e := range c.stmts {
			_ = recovered(e.stmt.Close)
		}
	}
	c.stmts = nil
}
