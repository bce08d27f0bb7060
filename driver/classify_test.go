package driver

import "testing"

func TestClassify(t *testing.T) {
	t.Parallel()
	const (
		pg = Postgres
		my = MySQL
		sl = SQLite
	)
	all := []Dialect{pg, my, sl}
	type want struct {
		kind stmtKind
		name string
	}
	plain := want{kind: kindPlain}
	control := want{kind: kindTxControl}
	uncertain := want{kind: kindUncertain}
	for _, c := range []struct {
		q        string
		dialects []Dialect
		want     want
	}{
		{"SAVEPOINT a", all, want{kindSavepoint, "a"}},
		{"savepoint A", all, want{kindSavepoint, "a"}},
		{"  \n\t SAVEPOINT a ;  ", all, want{kindSavepoint, "a"}},
		{"/* c */ -- d\nSAVEPOINT a", all, want{kindSavepoint, "a"}},
		{"/* outer /* nested */ still comment */ SAVEPOINT a", []Dialect{pg}, want{kindSavepoint, "a"}},
		{"# comment\nSAVEPOINT a", []Dialect{my}, want{kindSavepoint, "a"}},
		{`SAVEPOINT "A b"`, []Dialect{pg}, want{kindSavepoint, "A b"}},
		{`SAVEPOINT "A""b"`, []Dialect{pg}, want{kindSavepoint, `A"b`}},
		{`SAVEPOINT "A b"`, []Dialect{sl}, want{kindSavepoint, "a b"}},
		{"SAVEPOINT `A``b`", []Dialect{my, sl}, want{kindSavepoint, "a`b"}},
		{"SAVEPOINT [A b]", []Dialect{sl}, want{kindSavepoint, "a b"}},
		{"SAVEPOINT 'A'", []Dialect{sl}, want{kindSavepoint, "a"}},
		{"SAVEPOINT Ärger", []Dialect{pg}, want{kindSavepoint, "Ärger"}},
		{"RELEASE a", all, want{kindRelease, "a"}},
		{"RELEASE SAVEPOINT a", all, want{kindRelease, "a"}},
		{"ROLLBACK TO a", all, want{kindRollbackTo, "a"}},
		{"ROLLBACK TO SAVEPOINT a", all, want{kindRollbackTo, "a"}},
		{"rollback work to savepoint a", all, want{kindRollbackTo, "a"}},
		{"ROLLBACK TRANSACTION TO SAVEPOINT a", all, want{kindRollbackTo, "a"}},
		{"SAVEPOINT", all, uncertain},
		{"SAVEPOINT a b", all, uncertain},
		{"ROLLBACK TO", all, uncertain},
		{"SAVEPOINT 'a'", []Dialect{pg, my}, uncertain},

		{"COMMIT", all, control},
		{"commit work", all, control},
		{"END", all, control},
		{"ROLLBACK", all, control},
		{"ROLLBACK AND CHAIN", []Dialect{pg, my}, control},
		{"BEGIN", all, control},
		{"START TRANSACTION", all, control},
		{"ABORT", []Dialect{pg}, control},
		{"PREPARE TRANSACTION 'x'", []Dialect{pg}, control},
		{"PREPARE q AS SELECT 1", []Dialect{pg}, plain},
		{"XA START 'x'", []Dialect{my}, control},
		{"SET autocommit = 1", []Dialect{my}, control},
		{"SET @@session.autocommit = 0", []Dialect{my}, control},
		{"SET SESSION sql_mode = 'x', autocommit = 1", []Dialect{my}, control},
		{"SET TRANSACTION ISOLATION LEVEL READ COMMITTED", []Dialect{my, pg}, plain},
		{"SET search_path = a", []Dialect{pg}, plain},
		{"CREATE TABLE t (id INT)", []Dialect{my}, control},
		{"CREATE TABLE t (id INT)", []Dialect{pg, sl}, plain},
		{"CREATE TEMPORARY TABLE t (id INT)", []Dialect{my}, plain},
		{"DROP TEMPORARY TABLE t", []Dialect{my}, plain},
		{"ALTER TABLE t ADD c INT", []Dialect{my}, control},
		{"TRUNCATE t", []Dialect{my}, control},
		{"LOCK TABLES t WRITE", []Dialect{my}, control},
		{"LOCK TABLE t IN SHARE MODE", []Dialect{pg}, plain},
		{"ANALYZE TABLE t", []Dialect{my}, control},
		{"CHECK TABLE t", []Dialect{my}, control},
		{"LOAD DATA INFILE 'x' INTO TABLE t", []Dialect{my}, plain},
		{"LOAD INDEX INTO CACHE t", []Dialect{my}, control},
		{"CALL p()", []Dialect{my}, uncertain},
		{"CALL p()", []Dialect{pg}, plain},
		{"/*!40101 COMMIT */", []Dialect{my}, uncertain},
		{"SELECT 1 /*M! , 2 */", []Dialect{my}, uncertain},
		{"/*!40101 COMMIT */", []Dialect{pg, sl}, plain},

		{"INSERT INTO t VALUES ('a;b', 'it''s')", all, plain},
		{"SELECT 1; SELECT 2", all, plain},
		{"SELECT 1; SAVEPOINT a", all, uncertain},
		{"SELECT 1; COMMIT", all, uncertain},
		{"SELECT 'x; COMMIT'", all, plain},
		{`SELECT "x; COMMIT"`, all, plain},
		{"SELECT 1 -- ; COMMIT", all, plain},
		{"SELECT 1 /* ; COMMIT */", all, plain},
		{"SELECT $$a; COMMIT$$", []Dialect{pg}, plain},
		{"SELECT $tag$ $$; COMMIT $tag$", []Dialect{pg}, plain},
		{"SELECT $1::int; COMMIT", []Dialect{pg}, uncertain},
		{"SELECT E'\\'; COMMIT'", []Dialect{pg}, plain},
		{"SELECT 'a' --x\n; COMMIT", []Dialect{my}, uncertain},
		// MySQL: '\'' ends after the second quote with backslash escapes,
		// at the first without (NO_BACKSLASH_ESCAPES): undecidable.
		{`SELECT 'a\'; SAVEPOINT x; '`, []Dialect{my}, uncertain},
		{`SELECT 'a\\'`, []Dialect{my}, plain},
		{`SELECT 'a\'; SAVEPOINT x; '`, []Dialect{pg}, uncertain},
		{`SELECT 'C:\dir'`, all, plain},
		{"SELECT 'unterminated", all, uncertain},
		{"SELECT 1 /* unterminated", all, uncertain},
		{"", all, plain},
		{" ; ;", all, plain},
		{"UPDATE savepoint_log SET n = n + 1", all, plain},
		{"SELECT * FROM commits", all, plain},
		{"WITH x AS (SELECT 1) SELECT * FROM x", all, plain},
	} {
		for _, d := range c.dialects {
			got := classify(d, c.q)
			if got.kind != c.want.kind || got.name != c.want.name {
				t.Errorf("%s: classify(%q) = kind %d name %q (%s), want kind %d name %q",
					d, c.q, got.kind, got.name, got.reason, c.want.kind, c.want.name)
			}
		}
	}
}

// FuzzClassify: classify never panics, and a string it calls plain stays
// plain with a savepoint command appended after a semicolon only if the
// lexer saw that semicolon inside a quote or comment (never silently).
func FuzzClassify(f *testing.F) {
	for _, s := range []string{"SELECT 1", "SAVEPOINT a", "SELECT 'a;b'", "/* x */ COMMIT", "SELECT $$;$$", "[a", `"a""b"`, "`a`", "E'\\''"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		for _, d := range []Dialect{Postgres, MySQL, SQLite} {
			c := classify(d, q)
			if c.kind > kindUncertain {
				t.Fatalf("kind %d", c.kind)
			}
			if c.kind == kindPlain {
				l := &lexer{d: d, src: q, backslash: d == MySQL}
				l.statements(new(stmtHead))
				if !l.open && classify(d, q+"\n;SAVEPOINT zz").kind == kindPlain {
					t.Fatalf("%s: %q + SAVEPOINT classified plain", d, q)
				}
			}
		}
	})
}

// BenchmarkClassify: the cost the wrapper adds to each statement run
// inside a bound transaction (a typical ORM UPDATE and a savepoint).
func BenchmarkClassify(b *testing.B) {
	for _, c := range []struct{ name, q string }{
		{"update", `UPDATE "orders" SET "status" = $1, "updated_at" = $2 WHERE "orders"."id" = $3 AND "orders"."deleted_at" IS NULL`},
		{"savepoint", `SAVEPOINT sp0x1234abcd`},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				classify(Postgres, c.q)
			}
		})
	}
}
