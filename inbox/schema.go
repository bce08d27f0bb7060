package inbox

import (
	"bytes"
	"context"
	"database/sql"
	"embed"
	"fmt"
	"hash/fnv"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/migrate"
)

//go:embed sql
var sqlFiles embed.FS

// MaxTableNameBytes is the longest table name (without schema), the
// outbox's rule: index and helper-table names append up to 21 bytes and
// PostgreSQL truncates identifiers at 63.
const MaxTableNameBytes = 40

var (
	schemaPart = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)
	basePart   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,39}$`)
)

// migration is one schema version.
type migration struct {
	version    int
	name       string
	statements []string
}

// schema is the inbox's SQL rendered for one dialect and table.
type schema struct {
	dialect    driver.Dialect
	table      string // as configured
	sch, base  string
	migrations []migration
	queries    map[string]string // rendered, placeholders still "?"
}

func newSchema(d driver.Dialect, table string) (*schema, error) {
	switch d {
	case driver.Postgres, driver.MySQL, driver.SQLite:
	default:
		return nil, fmt.Errorf("%w: unknown Dialect %q (want driver.Postgres, driver.MySQL or driver.SQLite)", ErrInvalidConfig, d)
	}
	s := &schema{dialect: d, table: table}
	parts := strings.Split(table, ".")
	switch {
	case len(parts) == 1 && basePart.MatchString(parts[0]):
		s.base = parts[0]
	case len(parts) == 2 && schemaPart.MatchString(parts[0]) && basePart.MatchString(parts[1]):
		s.sch, s.base = parts[0], parts[1]
	default:
		return nil, fmt.Errorf("%w: Table %q: want name or schema.name of letters, digits and underscores, not starting with a digit, name at most %d bytes, schema at most 63", ErrInvalidConfig, table, MaxTableNameBytes)
	}
	if err := s.load(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *schema) quote(id string) string {
	if s.dialect == driver.MySQL {
		return "`" + id + "`"
	}
	return `"` + id + `"`
}

func (s *schema) qualify(id string) string {
	if s.sch == "" {
		return s.quote(id)
	}
	return s.quote(s.sch) + "." + s.quote(id)
}

// tmpl is what the .sql templates see.
type tmpl struct{ s *schema }

func (t tmpl) Table() string { return t.s.qualify(t.s.base) }

// Requests is the retry-request table, <table>_requests.
func (t tmpl) Requests() string { return t.s.qualify(t.s.base + "_requests") }

func (t tmpl) Index(suffix string) string {
	if t.s.dialect == driver.SQLite && t.s.sch != "" {
		return t.s.quote(t.s.sch) + "." + t.s.quote(t.s.base+"_"+suffix)
	}
	return t.s.quote(t.s.base + "_" + suffix)
}

func (t tmpl) IndexTable() string {
	if t.s.dialect == driver.SQLite {
		return t.s.quote(t.s.base)
	}
	return t.s.qualify(t.s.base)
}

func (t tmpl) Now() string {
	switch t.s.dialect {
	case driver.Postgres:
		return "clock_timestamp()"
	case driver.MySQL:
		return "UTC_TIMESTAMP(6)"
	}
	return "CAST(unixepoch('subsec') * 1000000 AS INTEGER)"
}

func (t tmpl) Ago() string {
	switch t.s.dialect {
	case driver.Postgres:
		return "clock_timestamp() - CAST(? AS BIGINT) * INTERVAL '1 microsecond'"
	case driver.MySQL:
		return "UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND"
	}
	return "(CAST(unixepoch('subsec') * 1000000 AS INTEGER) - ?)"
}

func (t tmpl) Micros(col string) string {
	switch t.s.dialect {
	case driver.Postgres:
		return "CAST(EXTRACT(EPOCH FROM " + col + ") * 1000000 AS BIGINT)"
	case driver.MySQL:
		return "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', " + col + ")"
	}
	return col
}

func (t tmpl) FromDual() string {
	if t.s.dialect == driver.MySQL {
		return " FROM DUAL"
	}
	return ""
}

func (t tmpl) InsertIgnore() string {
	if t.s.dialect == driver.MySQL {
		return "INSERT IGNORE"
	}
	return "INSERT"
}

func (t tmpl) OnConflict() string {
	if t.s.dialect == driver.MySQL {
		return ""
	}
	return " ON CONFLICT (consumer, message_id) DO NOTHING"
}

func (t tmpl) ForUpdate() string {
	if t.s.dialect == driver.SQLite {
		return ""
	}
	return " FOR UPDATE"
}

// ParkedIndex is the index hint of the statements that read a consumer's
// parked and held rows across aggregates: on MySQL/MariaDB retention_idx
// (consumer, processed_at), whose processed_at IS NULL range holds only
// those rows (parked and held rows have no processed_at); without it the
// optimizer walks hold_idx or the primary key through the processed
// history. Empty on the other dialects, whose hold_idx is partial.
func (t tmpl) ParkedIndex() string {
	if t.s.dialect == driver.MySQL {
		return " FORCE INDEX (" + t.Index("retention_idx") + ")"
	}
	return ""
}

func (t tmpl) ForShare() string {
	if t.s.dialect == driver.MySQL {
		return " LOCK IN SHARE MODE"
	}
	return ""
}

func (s *schema) render(name, text string) (string, error) {
	tp, err := template.New(name).Parse(text)
	if err != nil {
		return "", fmt.Errorf("inbox: %s: %w", name, err)
	}
	var b bytes.Buffer
	if err := tp.Execute(&b, tmpl{s}); err != nil {
		return "", fmt.Errorf("inbox: %s: %w", name, err)
	}
	return b.String(), nil
}

var migrationFile = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.sql$`)

func (s *schema) load() error {
	dir := "sql/" + string(s.dialect)
	entries, err := fs.ReadDir(sqlFiles, dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		m := migrationFile.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		raw, err := fs.ReadFile(sqlFiles, dir+"/"+e.Name())
		if err != nil {
			return err
		}
		text, err := s.render(e.Name(), string(raw))
		if err != nil {
			return err
		}
		v, _ := strconv.Atoi(m[1])
		s.migrations = append(s.migrations, migration{version: v, name: m[2], statements: splitStatements(text)})
	}
	sort.Slice(s.migrations, func(i, j int) bool { return s.migrations[i].version < s.migrations[j].version })
	raw, err := fs.ReadFile(sqlFiles, "sql/queries.sql")
	if err != nil {
		return err
	}
	text, err := s.render("queries.sql", string(raw))
	if err != nil {
		return err
	}
	s.queries = map[string]string{}
	var name string
	var cur strings.Builder
	flush := func() {
		if name != "" {
			s.queries[name] = strings.TrimSpace(cur.String())
		}
		cur.Reset()
	}
	for _, line := range strings.Split(text, "\n") {
		if n, ok := strings.CutPrefix(line, "-- name: "); ok {
			flush()
			name = strings.TrimSpace(n)
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
	}
	flush()
	return nil
}

// q returns the named query with extra appended, placeholders rendered for
// the dialect.
func (s *schema) q(name string, extra ...string) string {
	text := s.queries[name]
	if len(extra) > 0 {
		text += strings.Join(extra, "")
	}
	return s.placeholders(text)
}

// placeholders renders text's ? placeholders for the dialect ($1, $2, ...
// on PostgreSQL).
func (s *schema) placeholders(text string) string {
	if s.dialect != driver.Postgres {
		return text
	}
	var b strings.Builder
	n := 0
	for _, r := range text {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// splitStatements splits a migration on semicolons that end a line, after
// dropping comment lines.
func splitStatements(text string) []string {
	var b strings.Builder
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	var out []string
	for _, part := range strings.Split(b.String(), ";\n") {
		if st := strings.TrimSpace(part); st != "" {
			out = append(out, st)
		}
	}
	return out
}

// ignoreConflict ends an INSERT ... SELECT that skips rows whose key is
// taken (MySQL's INSERT IGNORE is in the statement's head instead).
func (s *schema) ignoreConflict() string {
	if s.dialect == driver.MySQL {
		return ""
	}
	return " ON CONFLICT DO NOTHING"
}

func (s *schema) migrationsTable() string { return s.qualify(s.base + "_migrations") }

func (s *schema) latest() int {
	if len(s.migrations) == 0 {
		return 0
	}
	return s.migrations[len(s.migrations)-1].version
}

// ddl returns every migration's statements as one script.
func (s *schema) ddl() string {
	var b strings.Builder
	for _, m := range s.migrations {
		fmt.Fprintf(&b, "-- inbox schema version %d: %s (%s, table %s)\n", m.version, m.name, s.dialect, s.table)
		for _, st := range m.statements {
			b.WriteString(st)
			b.WriteString(";\n")
		}
	}
	return b.String()
}

// lockKey is the advisory lock that serializes migrations of one table.
func (s *schema) lockKey() int64 {
	h := fnv.New64a()
	h.Write([]byte("inbox:" + s.table))
	return int64(h.Sum64() >> 1)
}

// migrate applies every migration not yet recorded, under a lock that
// serializes concurrent callers (PostgreSQL: a transaction-scoped advisory
// lock, with transactional DDL; MySQL/MariaDB: GET_LOCK on one connection,
// every statement idempotent since DDL commits implicitly; SQLite: BEGIN
// IMMEDIATE): the outbox's runner, internal/migrate, with the inbox's
// table, lock and versions (applied_at in microseconds on SQLite, as
// every inbox time there).
func (s *schema) migrate(ctx context.Context, db *sql.DB) error {
	ms := make([]migrate.Migration, len(s.migrations))
	for i, m := range s.migrations {
		ms[i] = migrate.Migration{Version: m.version, Name: m.name, Statements: m.statements}
	}
	err := migrate.Run(ctx, db, migrate.Plan{
		Flavor:          string(s.dialect),
		Table:           s.migrationsTable(),
		LockKey:         s.lockKey(),
		LockName:        migrate.LockName("inbox_migrate_", s.lockKey()),
		SQLiteAppliedAt: "CAST(unixepoch('subsec') * 1000000 AS INTEGER)",
		Migrations:      ms,
		TooNew:          ErrSchemaTooNew,
	})
	if err != nil {
		return fmt.Errorf("inbox: migrate %s table %s: %w", s.dialect, s.table, err)
	}
	return nil
}
