// Package dialect holds the SQL of each supported database, rendered for one
// outbox table. The SQL itself lives in sql/<dialect>/*.sql (embedded): the
// numbered files are schema migrations, queries.sql holds the named
// statements the commit hook and the relay run. Go code here only renders
// table names and placeholders.
package dialect

import (
	"bytes"
	"embed"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/sqloutbox/outbox/partition"
)

// Name is a dialect's name.
type Name string

// The supported dialects.
const (
	Postgres Name = "postgres"
	MySQL    Name = "mysql"
	SQLite   Name = "sqlite"
)

// Errors.
var (
	ErrUnknownDialect = errors.New("unknown dialect")
	ErrInvalidTable   = errors.New("invalid table name")
)

// Row-insert columns per event, and the most bind parameters one statement
// may carry per dialect (PostgreSQL and MySQL: 65,535, a 16-bit count in
// their wire protocols; SQLite: SQLITE_MAX_VARIABLE_NUMBER, 32,766 since 3.32).
const InsertColumns = 9

// MaxStatementBytes caps the payload and header bytes of one multi-row
// INSERT, well below MySQL's smallest common max_allowed_packet (16 MiB on
// MariaDB, 64 MiB on MySQL 8), so no statement is refused for its size.
const MaxStatementBytes = 4 << 20

//go:embed sql
var files embed.FS

// Dialect is the SQL of one dialect rendered for one table. It is immutable
// and safe for concurrent use.
type Dialect struct {
	name        Name
	table       string // as configured, e.g. "public.outbox_message"
	schema      string
	base        string
	quoted      string
	queries     map[string]string
	migrations  []Migration
	insertHead  string
	insertRow   string // with ? placeholders
	insertFirst string // the first row's template (insert_row_first), or insertRow
	partitions  int    // the count the meta migration stores on a fresh install
}

// Migration is one schema version.
type Migration struct {
	Version    int
	Name       string
	Statements []string
	// Optional: writers and relays run without it (an index only the
	// admin page reads); the file says so with a line "-- optional".
	Optional bool
}

var (
	schemaPart = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)
	basePart   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,39}$`)
)

// MaxTableNameBytes is the longest table name (without schema): index and
// helper-table names append up to 23 bytes and PostgreSQL truncates
// identifiers at 63.
const MaxTableNameBytes = 40

// New renders the SQL of dialect name for table, which is "name" or
// "schema.name"; each part starts with a letter or underscore and holds
// letters, digits and underscores (name at most MaxTableNameBytes, schema at
// most 63). It returns ErrUnknownDialect or ErrInvalidTable (wrapped).
func New(name Name, table string) (*Dialect, error) {
	return NewPartitioned(name, table, partition.DefaultCount)
}

// NewPartitioned is New for a table whose meta migration stores partitions
// as the relay partition count when the lease table is empty (a fresh
// install, or one whose relays never ran). partitions must be valid for
// partition.Validate; New uses partition.DefaultCount.
func NewPartitioned(name Name, table string, partitions int) (*Dialect, error) {
	if err := partition.Validate(partitions); err != nil {
		return nil, err
	}
	switch name {
	case Postgres, MySQL, SQLite:
	default:
		return nil, fmt.Errorf("%w %q (want postgres, mysql or sqlite)", ErrUnknownDialect, name)
	}
	d := &Dialect{name: name, table: table, partitions: partitions}
	parts := strings.Split(table, ".")
	switch {
	case len(parts) == 1 && basePart.MatchString(parts[0]):
		d.base = parts[0]
	case len(parts) == 2 && schemaPart.MatchString(parts[0]) && basePart.MatchString(parts[1]):
		d.schema, d.base = parts[0], parts[1]
	default:
		return nil, fmt.Errorf("%w %q: want name or schema.name of letters, digits and underscores, not starting with a digit, name at most %d bytes", ErrInvalidTable, table, MaxTableNameBytes)
	}
	d.quoted = d.qualify(d.base)
	if err := d.load(); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Dialect) quote(id string) string {
	if d.name == MySQL {
		return "`" + id + "`"
	}
	return `"` + id + `"`
}

func (d *Dialect) qualify(id string) string {
	if d.schema == "" {
		return d.quote(id)
	}
	return d.quote(d.schema) + "." + d.quote(id)
}

// templateData is what the .sql templates see.
type templateData struct{ d *Dialect }

// Table is the quoted, schema-qualified table.
func (t templateData) Table() string { return t.d.quoted }

// Migrations is the quoted, schema-qualified migrations table.
func (t templateData) Migrations() string { return t.d.qualify(t.d.base + "_migrations") }

// Lease is the quoted, schema-qualified partition lease table.
func (t templateData) Lease() string { return t.d.qualify(t.d.base + "_lease") }

// Archive is the quoted, schema-qualified archive table for retention.
func (t templateData) Archive() string { return t.d.qualify(t.d.base + "_archive") }

// Members is the quoted, schema-qualified relay instance table.
func (t templateData) Members() string { return t.d.qualify(t.d.base + "_relay") }

// MembersName is the relay instance table's name without schema,
// unquoted, as information_schema.COLUMNS.TABLE_NAME holds it.
func (t templateData) MembersName() string { return t.d.base + "_relay" }

// IndexBase is an index's name without schema, unquoted, as a catalog
// (sqlite_master, pg_indexes) holds it.
func (t templateData) IndexBase(suffix string) string { return t.d.base + "_" + suffix }

// SchemaExpr is a SQL expression for the table's schema as
// information_schema holds it (MySQL): the schema as a string literal, or
// DATABASE() for an unqualified table. Table names are validated
// identifiers (letters, digits, underscores), so the literal needs no
// escaping.
func (t templateData) SchemaExpr() string {
	if t.d.schema == "" {
		return "DATABASE()"
	}
	return "'" + t.d.schema + "'"
}

// Pending is the quoted, schema-qualified pending set (schema version 9 on
// PostgreSQL, 8 on SQLite, 6 on MySQL/MariaDB): one row (id, partition_key)
// per event waiting to be published, kept by the outbox table's triggers.
func (t templateData) Pending() string { return t.d.qualify(t.d.base + "_pending") }

// PendingLocal is the pending set's quoted name without schema, as
// SQLite wants it inside a trigger body (qualified names are refused there).
func (t templateData) PendingLocal() string { return t.d.quote(t.d.base + "_pending") }

// TableLocal is the outbox table's quoted name without schema (SQLite:
// CREATE TRIGGER ... ON wants it unqualified).
func (t templateData) TableLocal() string { return t.d.quote(t.d.base) }

// PendingFunction is the quoted, schema-qualified name of one of the
// PostgreSQL trigger functions that keep the pending set:
// <table>_pending_<suffix>.
func (t templateData) PendingFunction(suffix string) string {
	return t.d.qualify(t.d.base + "_pending_" + suffix)
}

// Trigger names a trigger on the outbox table, <table>_<suffix>: unquoted
// and unqualified on PostgreSQL (a trigger's name is the table's own) and
// MySQL (DROP TRIGGER wants the schema: see QualifiedTrigger), schema-qualified on
// SQLite.
func (t templateData) Trigger(suffix string) string {
	if t.d.name == SQLite && t.d.schema != "" {
		return t.d.quote(t.d.schema) + "." + t.d.quote(t.d.base+"_"+suffix)
	}
	return t.d.quote(t.d.base + "_" + suffix)
}

// QualifiedTrigger is a trigger's name as MySQL's CREATE and DROP TRIGGER
// want it: in the table's schema.
func (t templateData) QualifiedTrigger(suffix string) string {
	return t.d.qualify(t.d.base + "_" + suffix)
}

// Meta is the quoted, schema-qualified settings table (one row: the relay
// partition count).
func (t templateData) Meta() string { return t.d.qualify(t.d.base + "_meta") }

// Sequence is the quoted, schema-qualified id sequence (PostgreSQL: the
// identity column's, named <table>_id_seq by schema version 6).
func (t templateData) Sequence() string { return t.d.qualify(t.d.base + "_id_seq") }

// SequenceName is the id sequence's name without schema, unquoted.
func (t templateData) SequenceName() string { return t.d.base + "_id_seq" }

// ClaimFunction is the quoted, schema-qualified claim function
// (PostgreSQL, schema version 6).
func (t templateData) ClaimFunction() string { return t.d.qualify(t.d.base + "_claim") }

// Partitions is the relay partition count a fresh install stores.
func (t templateData) Partitions() int { return t.d.partitions }

// Index names an index or constraint after the table: PostgreSQL puts it in
// the table's schema by itself; SQLite wants the schema on the index name.
func (t templateData) Index(suffix string) string {
	if t.d.name == SQLite && t.d.schema != "" {
		return t.d.quote(t.d.schema) + "." + t.d.quote(t.d.base+"_"+suffix)
	}
	return t.d.quote(t.d.base + "_" + suffix)
}

// IndexName is an index name without schema, as SQLite's INDEXED BY and
// MySQL's FORCE INDEX want it.
func (t templateData) IndexName(suffix string) string { return t.d.quote(t.d.base + "_" + suffix) }

// QualifiedIndex is an index name as DROP INDEX wants it: in the table's
// schema on PostgreSQL and SQLite (MySQL drops indexes through ALTER TABLE).
func (t templateData) QualifiedIndex(suffix string) string {
	if t.d.name == Postgres {
		return t.d.qualify(t.d.base + "_" + suffix)
	}
	return t.Index(suffix)
}

// IndexTable is the table as CREATE INDEX ... ON wants it (unqualified on
// SQLite, where the index name carries the schema).
func (t templateData) IndexTable() string {
	if t.d.name == SQLite {
		return t.d.quote(t.d.base)
	}
	return t.d.quoted
}

func (d *Dialect) render(name, text string) (string, error) {
	tmpl, err := template.New(name).Parse(text)
	if err != nil {
		return "", fmt.Errorf("outbox: %s: %w", name, err)
	}
	var b bytes.Buffer
	if err := tmpl.Execute(&b, templateData{d}); err != nil {
		return "", fmt.Errorf("outbox: %s: %w", name, err)
	}
	return b.String(), nil
}

var (
	migrationFile     = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.sql$`)
	optionalMigration = regexp.MustCompile(`(?m)^-- optional$`)
)

func (d *Dialect) load() error {
	dir := "sql/" + string(d.name)
	entries, err := fs.ReadDir(files, dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		raw, err := fs.ReadFile(files, dir+"/"+e.Name())
		if err != nil {
			return err
		}
		text, err := d.render(e.Name(), string(raw))
		if err != nil {
			return err
		}
		if m := migrationFile.FindStringSubmatch(e.Name()); m != nil {
			v, _ := strconv.Atoi(m[1])
			d.migrations = append(d.migrations, Migration{Version: v, Name: m[2], Statements: splitStatements(text),
				Optional: optionalMigration.MatchString(text)})
			continue
		}
		if e.Name() == "queries.sql" {
			d.queries = parseQueries(text)
		}
	}
	sort.Slice(d.migrations, func(i, j int) bool { return d.migrations[i].Version < d.migrations[j].Version })
	d.insertHead = d.queries["insert"]
	d.insertRow = d.queries["insert_row"]
	d.insertFirst = d.insertRow
	if q, ok := d.queries["insert_row_first"]; ok {
		d.insertFirst = q
	}
	return nil
}

// splitStatements splits a migration on semicolons that end a line, after
// dropping comment lines, except inside a dollar-quoted body ($$ ... $$:
// a function's or a DO block's).
func splitStatements(text string) []string {
	var out []string
	var cur strings.Builder
	for _, part := range strings.SplitAfter(stripComments(text), ";\n") {
		cur.WriteString(part)
		if strings.Count(cur.String(), "$$")%2 == 1 {
			continue // inside a body: the statement goes on
		}
		if s := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(cur.String()), ";")); s != "" {
			out = append(out, s)
		}
		cur.Reset()
	}
	if s := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(cur.String()), ";")); s != "" {
		out = append(out, s)
	}
	return out
}

func stripComments(text string) string {
	var b strings.Builder
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String()
}

// parseQueries reads "-- name: X" sections.
func parseQueries(text string) map[string]string {
	q := map[string]string{}
	var name string
	var body strings.Builder
	flush := func() {
		if name != "" {
			q[name] = strings.TrimSpace(stripComments(body.String()))
		}
		body.Reset()
	}
	for _, line := range strings.Split(text, "\n") {
		if n, ok := strings.CutPrefix(strings.TrimSpace(line), "-- name:"); ok {
			flush()
			name = strings.TrimSpace(n)
			continue
		}
		body.WriteString(line)
		body.WriteByte('\n')
	}
	flush()
	return q
}

// Name returns the dialect's name.
func (d *Dialect) Name() Name { return d.name }

// Table returns the table name as configured (unquoted).
func (d *Dialect) Table() string { return d.table }

// QuotedTable returns the quoted, schema-qualified table name.
func (d *Dialect) QuotedTable() string { return d.quoted }

// Query returns the named statement from queries.sql, with placeholders in
// the dialect's own style. It panics on an unknown name: names are
// constants of this module, so that is a programming error caught by tests.
func (d *Dialect) Query(name string) string {
	q, ok := d.queries[name]
	if !ok {
		panic("outbox: dialect " + string(d.name) + " has no query " + name)
	}
	return q
}

// MaxParams is the most bind parameters one statement may carry.
func (d *Dialect) MaxParams() int {
	if d.name == SQLite {
		return 32766
	}
	return 65535
}

// MaxInsertRows is the most events one INSERT may carry.
func (d *Dialect) MaxInsertRows() int { return d.MaxParams() / InsertColumns }

// Insert returns a multi-row INSERT for rows events, InsertColumns
// parameters per event in the order message_id, aggregate_type,
// aggregate_id, event_type, topic, partition_key, content_type, payload,
// headers.
func (d *Dialect) Insert(rows int) string {
	var b strings.Builder
	b.Grow(len(d.insertHead) + rows*(len(d.insertRow)+16))
	head, _, _ := strings.Cut(d.insertHead, "{{ROWS}}")
	b.WriteString(head)
	n := 0
	for r := 0; r < rows; r++ {
		row := d.insertRow
		if r == 0 {
			row = d.insertFirst
		}
		if r > 0 {
			b.WriteString(", ")
		}
		n = d.writePlaceholders(&b, row, n)
	}
	return b.String()
}

// writePlaceholders copies s to b, turning each ? into the dialect's
// placeholder numbered from n+1; it returns the last number used.
func (d *Dialect) writePlaceholders(b *strings.Builder, s string, n int) int {
	for i := 0; i < len(s); i++ {
		if s[i] == '?' {
			n++
			if d.name == Postgres {
				b.WriteByte('$')
				b.WriteString(strconv.Itoa(n))
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return n
}

// MySQLMaxIDs is the most ids one MySQL/MariaDB multi-table DELETE or
// INSERT ... SELECT lists (see MaxIDs).
const MySQLMaxIDs = 500

// MaxIDs is the most ids the named id-list statement (mark_sent,
// mark_sent_retried, delete_sent, retention_archive, retention_delete)
// may list at once; 0 means any number. On MySQL/MariaDB these statements
// read by primary key (FORCE INDEX (PRIMARY)), but MariaDB turns an IN
// list of 1,000 or more values (in_predicate_conversion_threshold) of a
// multi-table DELETE (mark_sent, delete_sent, retention_delete) or an
// INSERT ... SELECT into a join with a derived table and scans the whole
// table again, locking every row: callers split longer lists. A
// single-table UPDATE (mark_sent_retried) keeps a range for any length.
func (d *Dialect) MaxIDs(name string) int {
	if d.name != MySQL {
		return 0
	}
	switch name {
	case "delete_sent", "retention_archive", "retention_delete", "mark_sent":
		return MySQLMaxIDs
	}
	return 0
}

// Chunks splits n ids into consecutive [start, end) ranges of at most
// max ids (one range if max is 0).
func Chunks(n, max int) [][2]int {
	if max <= 0 || n <= max {
		return [][2]int{{0, n}}
	}
	out := make([][2]int, 0, (n+max-1)/max)
	for s := 0; s < n; s += max {
		out = append(out, [2]int{s, min(s+max, n)})
	}
	return out
}

// MarkSent returns the statement marking ids sent and its arguments,
// fenced by owner's leases unless owner is "": since the pending set
// (schema version 9 on PostgreSQL, 8 on SQLite, 6 on MySQL/MariaDB) a
// DELETE of their rows there, which leaves the outbox rows as they are.
// Its RowsAffected is the number of ids that were pending and are sent now.
// Ids of messages that had failed before (attempts > 0) go through
// MarkRetriedSent first.
func (d *Dialect) MarkSent(ids []int64, owner string) (string, []any) {
	return d.markSent("mark_sent", ids, owner)
}

// MarkRetriedSent returns the statement marking sent those of ids whose
// rows counted failed attempts (attempts > 0), and its arguments, fenced
// by owner's leases unless owner is "": an UPDATE of the outbox rows
// (status 1, next_retry_at cleared, sent_at set) whose trigger removes
// them from the pending set. The relay runs it before MarkSent for the
// messages of a batch that had failed before, whose retry time would
// otherwise stay in the hold index.
func (d *Dialect) MarkRetriedSent(ids []int64, owner string) (string, []any) {
	return d.markSent("mark_sent_retried", ids, owner)
}

// MarkSentDurable is MarkSent whose transaction waits for the commit to
// be durable: on PostgreSQL MarkSent commits with synchronous_commit off
// (a database crash may lose the last marks, whose messages are then sent
// again); this one does not. The relay's exactly-once mode marks with it.
// Elsewhere it is MarkSent.
func (d *Dialect) MarkSentDurable(ids []int64, owner string) (string, []any) {
	if d.name != Postgres {
		return d.MarkSent(ids, owner)
	}
	return d.markSent("mark_sent_durable", ids, owner)
}

// MarkRetriedSentDurable is MarkRetriedSent as MarkSentDurable is MarkSent.
func (d *Dialect) MarkRetriedSentDurable(ids []int64, owner string) (string, []any) {
	if d.name != Postgres {
		return d.MarkRetriedSent(ids, owner)
	}
	return d.markSent("mark_sent_retried_durable", ids, owner)
}

// DeleteSent is MarkSent for DeleteOnPublish: it deletes the rows instead.
func (d *Dialect) DeleteSent(ids []int64, owner string) (string, []any) {
	return d.markSent("delete_sent", ids, owner)
}

func (d *Dialect) markSent(name string, ids []int64, owner string) (string, []any) {
	q := d.Fenced(name, owner != "")
	if d.name == Postgres {
		args := []any{int64Array(ids)}
		if owner != "" {
			args = append(args, owner)
		}
		return q, args
	}
	args := make([]any, len(ids), len(ids)+1)
	for i, id := range ids {
		args[i] = id
	}
	if owner != "" {
		args = append(args, owner)
	}
	return strings.Replace(q, "{{IDS}}", strings.TrimSuffix(strings.Repeat("?,", len(ids)), ","), 1), args
}

// Migrations returns the schema versions in order.
func (d *Dialect) Migrations() []Migration { return d.migrations }

// LatestVersion is the newest schema version this build knows.
func (d *Dialect) LatestVersion() int { return d.migrations[len(d.migrations)-1].Version }

// RequiredVersion is the schema version writers and relays need: the
// newest migration not marked optional. A table between it and
// LatestVersion works; Migrate brings it up to date.
func (d *Dialect) RequiredVersion() int {
	for i := len(d.migrations) - 1; i >= 0; i-- {
		if !d.migrations[i].Optional {
			return d.migrations[i].Version
		}
	}
	return 0
}

// MigrationsTable is the quoted name of the table recording applied versions.
func (d *Dialect) MigrationsTable() string { return templateData{d}.Migrations() }

// LockKey is a stable 64-bit key for this table's migration lock.
func (d *Dialect) LockKey() int64 {
	h := fnv.New64a()
	h.Write([]byte("outbox-migrate:" + d.table))
	return int64(h.Sum64())
}

// WithSelector returns the named query with {{WHERE}} replaced by where
// (column names and ? placeholders only, never user text) and {{LIMIT}} by
// limit, its ? turned into the dialect's placeholders.
func (d *Dialect) WithSelector(name, where string, limit int) string {
	q := strings.Replace(d.Query(name), "{{WHERE}}", where, 1)
	q = strings.Replace(q, "{{LIMIT}}", strconv.Itoa(limit), 1)
	var b strings.Builder
	d.writePlaceholders(&b, q, 0)
	return b.String()
}

// WithSelectorIndex is WithSelector for a statement with an {{INDEX}}
// slot (a listing's index hint): index names the hint's query
// ("index_status", "index_aggregate"), or "" for none. MySQL/MariaDB's
// hints are FORCE INDEX clauses: with ORDER BY id LIMIT n under a status
// or aggregate filter, their optimizer otherwise walks the primary key
// through the sent history when the table has no statistics; the other
// dialects' hints are comments (their planners take the partial index).
func (d *Dialect) WithSelectorIndex(name, where, index string, limit int) string {
	q := d.WithSelector(name, where, limit)
	hint := ""
	if index != "" {
		hint = d.Query(index)
	}
	return strings.Replace(q, "{{INDEX}}", hint, 1)
}

// Bind turns the ? placeholders of q into the dialect's own, numbered
// from 1 (PostgreSQL's $n); other dialects keep ?.
func (d *Dialect) Bind(q string) string {
	var b strings.Builder
	d.writePlaceholders(&b, q, 0)
	return b.String()
}

// Fenced returns the named relay write with the lease fence appended when
// fenced is true (one more argument: the instance ID, last), or removed.
// A statement with a {{FENCE}} slot gets the per-row fence (query
// "fence"), one with {{FENCE_BATCH}} the fence of a statement over many
// rows (query "fence_batch": on PostgreSQL and SQLite the leased
// partitions read once per statement).
func (d *Dialect) Fenced(name string, fenced bool) string {
	q := d.Query(name)
	slot, fenceName := "{{FENCE}}", "fence"
	if strings.Contains(q, "{{FENCE_BATCH}}") {
		slot, fenceName = "{{FENCE_BATCH}}", "fence_batch"
	}
	if !fenced {
		return strings.Replace(q, slot, "", 1)
	}
	// Number the fence's placeholder after the statement's own.
	n := strings.Count(q, "?")
	if d.name == Postgres {
		n = strings.Count(q, "$")
	}
	fence := d.Query(fenceName)
	var b strings.Builder
	d.writePlaceholders(&b, fence, n)
	return strings.Replace(q, slot, b.String(), 1)
}

// Claim returns the claim restricted to the given relay partitions, or
// unrestricted when partitions is nil, skipping no rows (MySQL/MariaDB and
// SQLite; PostgreSQL claims through ClaimFloor). Its one argument is the
// batch size.
func (d *Dialect) Claim(partitions []int) string {
	q, _ := d.ClaimSkipping(partitions, nil)
	return q
}

// ClaimSkipping is Claim that also leaves out the rows with the given ids
// (a batch whose mark-sent is still running: pending in the table, but
// already published), so the database neither reads nor returns them.
// It returns the statement and its arguments after the batch size: none,
// the ids being written into the text as integer literals
// (go-sql-driver/mysql and SQLite prepare every statement anyway). Not on
// PostgreSQL (see HasClaimFloor).
func (d *Dialect) ClaimSkipping(partitions []int, skip []int64) (string, []any) {
	return d.ClaimExcluding(partitions, skip, nil)
}

// ClaimExcluding is ClaimSkipping that also leaves out the id ranges in
// sent (inclusive [lo, hi] pairs): ranges in which the caller's own
// mark-sent (or delete-on-publish) changed every row, so none of their
// ids can be pending again. Only MySQL/MariaDB uses them (PostgreSQL
// claims through ClaimFloor): there a row marked sent leaves a
// delete-marked record in the pending set's primary key until InnoDB's
// purge removes it, and a claim walks every such record (hundreds per
// claim under 16 writers, every row sent since a long transaction began
// when purge is held back). Excluded ranges become gaps in the scan's
// index range, so those records are not visited at all.
// PostgreSQL and SQLite ignore sent.
//
// On MySQL/MariaDB the excluded ids are written as ranges of
// consecutive ids (NOT BETWEEN) and single ids (<>), never as one long
// IN list: MariaDB turns an IN list of 1,000 or more values
// (in_predicate_conversion_threshold) into a join with a derived table,
// which reads every skipped row by primary key instead of leaving it out
// of the index range. On SQLite they are one NOT IN list (a chain of
// 1,000 conditions exceeds its expression depth limit). Not on
// PostgreSQL (see HasClaimFloor).
func (d *Dialect) ClaimExcluding(partitions []int, skip []int64, sent [][2]int64) (string, []any) {
	return d.claimText(partitions, skip, sent, 0)
}

// claimText is ClaimExcluding that, on MySQL/MariaDB with below > 0, also
// leaves out every id from below up (ClaimLate).
func (d *Dialect) claimText(partitions []int, skip []int64, sent [][2]int64, below int64) (string, []any) {
	q := d.Query("claim")
	var b strings.Builder
	if partitions != nil {
		b.WriteString("AND p.partition_key IN (")
		for i, p := range partitions {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(strconv.Itoa(p))
		}
		b.WriteString(")")
	}
	if d.name != MySQL {
		sent = nil
	}
	if d.name == SQLite {
		// One NOT IN list: SQLite parses a chain of ANDs into a tree as
		// deep as the chain and refuses a claim with 1,000 or more
		// conditions ("Expression tree is too large (maximum depth
		// 1000)", SQLITE_MAX_EXPR_DEPTH), which ids that do not merge
		// into ranges (other relays' partitions, held aggregates between
		// them) reach at MaxBatchSize 2,000. Its planner does not cut
		// excluded ids out of the scanned index range either way.
		if len(skip) > 0 {
			b.WriteString(" AND p.id NOT IN (")
			writeIDs(&b, skip)
			b.WriteString(")")
		}
		return strings.Replace(q, "{{PARTITIONS}}", b.String(), 1), nil
	}
	if below > 0 {
		fmt.Fprintf(&b, " AND p.id < %d", below)
	}
	for _, r := range IDRanges(skip, sent) {
		if below > 0 && r[0] >= below {
			break // above the bound already
		}
		if r[0] == r[1] {
			fmt.Fprintf(&b, " AND p.id <> %d", r[0])
		} else {
			fmt.Fprintf(&b, " AND p.id NOT BETWEEN %d AND %d", r[0], r[1])
		}
	}
	return strings.Replace(q, "{{PARTITIONS}}", b.String(), 1), nil
}

// ClaimLate returns the MySQL/MariaDB claim's second statement (the relay
// runs it after every claim that returned rows; relay/doc.go, "Late
// rows"): the claim of up to batch rows (at least 1) over partitions that
// also leaves out the ids in skip (the claim's own leave-outs and the rows
// it returned) and every id from below up (below: the highest id it
// returned). Its rows are pending rows below that id which the claim's
// read view did not show: rows whose transaction committed after the
// claim's snapshot, or, on MariaDB, before it but listed in it as still
// active (its read views are not atomic snapshots). The statement has no
// arguments. An empty string on PostgreSQL and SQLite, whose claims need
// no second look (PostgreSQL proves its scan floor; SQLite has one writer
// at a time).
func (d *Dialect) ClaimLate(batch int, partitions []int, skip []int64, sent [][2]int64, below int64) string {
	if d.name != MySQL {
		return ""
	}
	q, _ := d.claimText(partitions, skip, sent, max(below, 1))
	return strings.Replace(q, "LIMIT ?", "LIMIT "+strconv.Itoa(max(batch, 1)), 1)
}

// ClaimBatch is ClaimExcluding with the batch size bound: it returns the
// statement and all of its arguments, ready for QueryContext (MySQL/MariaDB
// and SQLite; PostgreSQL claims through ClaimFloor). On MySQL/MariaDB the
// batch size is written into the text and there are no arguments:
// go-sql-driver/mysql runs a statement with arguments as prepare, execute
// and close (three round trips, unless the DSN sets interpolateParams), and
// the text differs from claim to claim anyway. SQLite takes it as the one
// argument. A batch below 1 is claimed as 1.
func (d *Dialect) ClaimBatch(batch int, partitions []int, skip []int64, sent [][2]int64) (string, []any) {
	batch = max(batch, 1)
	q, extra := d.ClaimExcluding(partitions, skip, sent)
	if d.name == MySQL && len(extra) == 0 {
		return strings.Replace(q, "LIMIT ?", "LIMIT "+strconv.Itoa(batch), 1), nil
	}
	return q, append([]any{batch}, extra...)
}

// HasClaimFloor reports whether the relay claims through ClaimFloor, the
// claim function whose index walk starts at a proven scan floor
// (PostgreSQL, schema version 6). Elsewhere it uses ClaimSkipping.
func (d *Dialect) HasClaimFloor() bool { return d.name == Postgres }

// ClaimFloor returns the claim-function call (PostgreSQL only; see
// HasClaimFloor). Its arguments, in order: floor (int64), floor epoch
// (int64), batch size, the ids to leave out (IDArray), the relay's
// partitions (IntArray), the pending proof's transaction ID (int64, or nil
// for none), whether to take a new proof (bool). It returns rows of
// kind (0: the proof's figures, once; 1: a claimed message) and the
// columns of 0006_claim_floor.sql.
func (d *Dialect) ClaimFloor() string { return d.Query("claim_floor") }

// IDArray is ids as a PostgreSQL bigint[] literal: '{1,2,3}'.
func IDArray(ids []int64) string { return int64Array(ids) }

// TextArray is ss as a PostgreSQL text[] literal: every element in double
// quotes, with backslash and double quote escaped by a backslash
// ('{"a","b \\"c\\""}'), so any text (commas, braces, spaces, the word
// NULL) reads back as itself.
func TextArray(ss []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for j := 0; j < len(s); j++ {
			if s[j] == '"' || s[j] == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(s[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// IntArray is ns as a PostgreSQL integer[] literal: '{1,2,3}'.
func IntArray(ns []int) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, n := range ns {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(n))
	}
	b.WriteByte('}')
	return b.String()
}

// IDRanges returns the union of ids and ranges (inclusive [lo, hi] pairs,
// lo <= hi) as sorted, disjoint, non-adjacent inclusive ranges: exactly
// the same ids, written compactly.
func IDRanges(ids []int64, ranges [][2]int64) [][2]int64 {
	if len(ids) == 0 && len(ranges) == 0 {
		return nil
	}
	all := make([][2]int64, 0, len(ids)+len(ranges))
	for _, id := range ids {
		all = append(all, [2]int64{id, id})
	}
	all = append(all, ranges...)
	sort.Slice(all, func(i, j int) bool { return all[i][0] < all[j][0] })
	out := all[:1]
	for _, r := range all[1:] {
		last := &out[len(out)-1]
		if r[0] <= last[1]+1 {
			last[1] = max(last[1], r[1])
			continue
		}
		out = append(out, r)
	}
	return out
}

// int64Array is ids as a PostgreSQL array literal: '{1,2,3}'.
func int64Array(ids []int64) string {
	var b strings.Builder
	b.Grow(2 + 8*len(ids))
	b.WriteByte('{')
	writeIDs(&b, ids)
	b.WriteByte('}')
	return b.String()
}

// writeIDs writes ids as comma-separated decimal integers.
func writeIDs(b *strings.Builder, ids []int64) {
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
}

// LeaseInit returns the statement creating lease rows for partitions
// 0..n-1 (n arguments: the partition numbers).
func (d *Dialect) LeaseInit(n int) string {
	q := strings.Replace(d.Query("lease_init"), "{{ROWS}}", strings.TrimSuffix(strings.Repeat("(?, 0), ", n), ", "), 1)
	return d.Bind(q)
}

// LeaseAcquire returns the statement that takes n free partitions in one
// round trip (arguments: instance ID, TTL in microseconds, then the n
// partition numbers; RowsAffected is how many it took), or "" for n < 1.
// On MySQL/MariaDB it must run in a transaction, after LeaseLockFree
// locked the partitions it lists.
func (d *Dialect) LeaseAcquire(n int) string {
	if n < 1 {
		return ""
	}
	return d.Bind(strings.Replace(d.Query("lease_acquire_many"), "{{PARTITIONS}}", placeholders(n), 1))
}

// LeaseLockFree returns, on MySQL/MariaDB, the SELECT ... FOR UPDATE SKIP
// LOCKED that locks which of n listed partitions (the arguments) are free
// and not locked by another transaction, to run first in the transaction
// of LeaseAcquire: that transaction then never waits while holding a
// lease row (see RenewsLeasesOneByOne for the deadlock that would close).
// It returns "" elsewhere, and for n < 1.
func (d *Dialect) LeaseLockFree(n int) string {
	if n < 1 || d.name != MySQL {
		return ""
	}
	return d.Bind(strings.Replace(d.Query("lease_lock_free"), "{{PARTITIONS}}", placeholders(n), 1))
}

// placeholders is n comma-separated "?".
func placeholders(n int) string { return strings.TrimSuffix(strings.Repeat("?, ", n), ", ") }

// RenewsLeasesOneByOne reports whether the lease heartbeat must renew
// each partition in a statement of its own (lease_renew_one: TTL,
// partition, instance) rather than all of an instance's at once
// (lease_renew: TTL, instance). MySQL/MariaDB: the mark-sent fence reads
// lease rows with shared locks (an UPDATE's subquery under REPEATABLE
// READ) in its rows' order, and a renewal holding one lease row while
// waiting for another closed deadlock cycles with it
// (TestNoDeadlocksAcrossLeaseHandovers). PostgreSQL's fence is a plain
// read and SQLite has one writer: one statement serves there.
func (d *Dialect) RenewsLeasesOneByOne() bool { return d.name == MySQL }

// Lease returns a named lease query with the dialect's placeholders.
func (d *Dialect) Lease(name string) string { return d.Bind(d.Query(name)) }

// PendingTable is the quoted pending set (see templateData.Pending).
func (d *Dialect) PendingTable() string { return templateData{d}.Pending() }

// MetaTable is the quoted settings table holding the relay partition count.
func (d *Dialect) MetaTable() string { return templateData{d}.Meta() }

// WALLogTable is the quoted, schema-qualified state table of the relay's
// WAL source in log-only mode (<table>_wal_log, PostgreSQL; created by the
// relay, not by Migrate: relay/walstate.go).
func (d *Dialect) WALLogTable() string { return d.qualify(d.base + "_wal_log") }

// LeaseTable is the quoted partition lease table.
func (d *Dialect) LeaseTable() string { return templateData{d}.Lease() }

// MembersTable is the relay group's membership table, qualified and quoted.
func (d *Dialect) MembersTable() string { return templateData{d}.Members() }

// maxChannelBytes is the longest PostgreSQL channel name: an identifier,
// NAMEDATALEN - 1 = 63 bytes (pg_notify refuses a longer one).
const maxChannelBytes = 63

// Channel is the PostgreSQL LISTEN/NOTIFY channel relays of this table
// listen on and the driver's notifier sends on after commits, its case
// kept: "<name>_wakeup" for a table named without a schema,
// "<schema>.<name>_wakeup" for a schema-qualified one, so that tables of
// one name in different schemas of one database (a schema per tenant, a
// schema per test) do not wake each other's relays. Before 2026-12-06 a
// qualified table's channel left the schema out. A qualified channel
// longer than 63 bytes (maxChannelBytes) is its first 46 bytes, "_" and
// the 16 hex digits of the FNV-64a hash of the whole. LISTEN must quote
// it (ListenStatement): unquoted, the dot is a syntax error and the
// server folds the name to lower case, which pg_notify does not.
func (d *Dialect) Channel() string {
	if d.schema == "" {
		return d.base + "_wakeup"
	}
	ch := d.schema + "." + d.base + "_wakeup"
	if len(ch) <= maxChannelBytes {
		return ch
	}
	h := fnv.New64a()
	h.Write([]byte(ch))
	return fmt.Sprintf("%s_%016x", ch[:maxChannelBytes-17], h.Sum64())
}

// ListenStatement returns the statement that LISTENs on channel, quoted
// as an identifier (its case and any dot kept).
func ListenStatement(channel string) string {
	return `LISTEN "` + strings.ReplaceAll(channel, `"`, `""`) + `"`
}

// WithIDs returns the named statement with {{IDS}} expanded to n
// placeholders in the dialect's style.
func (d *Dialect) WithIDs(name string, n int) string {
	q := strings.Replace(d.Query(name), "{{IDS}}", strings.TrimSuffix(strings.Repeat("?,", n), ","), 1)
	return d.Bind(q)
}
