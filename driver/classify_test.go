package driver

import (
	"strings"
	"testing"
)

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
// inside a bound transaction (a typical ORM UPDATE and a savepoint): per
// statement (classify, which takes plainFast's pass where it can), through
// the lexer alone (classifyFull, what every statement cost before issue
// 34), and repeated on one connection (conn.classify, answered from its
// memo of plain statements).
func BenchmarkClassify(b *testing.B) {
	o, err := New(Config{Dialect: Postgres})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct{ name, q string }{
		{"update", `UPDATE "orders" SET "status" = $1, "updated_at" = $2 WHERE "orders"."id" = $3 AND "orders"."deleted_at" IS NULL`},
		{"savepoint", `SAVEPOINT sp0x1234abcd`},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				classify(Postgres, c.q)
			}
		})
		b.Run(c.name+"_lexed", func(b *testing.B) {
			for b.Loop() {
				classifyFull(Postgres, c.q)
			}
		})
		b.Run(c.name+"_conn", func(b *testing.B) {
			cn := &conn{o: o}
			for b.Loop() {
				cn.classify(c.q)
			}
		})
	}
}

// TestClassifyFast: plainFast takes the common statements without the
// lexer and leaves the doubtful ones to it, and what it calls plain the
// lexer calls plain.
func TestClassifyFast(t *testing.T) {
	t.Parallel()
	const (
		pg = Postgres
		my = MySQL
		sl = SQLite
	)
	all := []Dialect{pg, my, sl}
	for _, c := range []struct {
		q        string
		dialects []Dialect
		fast     bool
	}{
		{"INSERT INTO s.orders (id, status, amount_cents) VALUES ($1, 'paid', $2)", []Dialect{pg}, true},
		{"INSERT INTO orders (id, status) VALUES (?, 'it''s')", all, true},
		{`UPDATE "orders" SET "status" = $1 WHERE "orders"."id" = $2 AND "orders"."deleted_at" IS NULL`, []Dialect{pg}, true},
		{"UPDATE `orders` SET `status` = ? WHERE `id` = ?", []Dialect{my, sl}, true},
		{"SELECT [a b] FROM t", []Dialect{sl}, true},
		{"SELECT 1 /*traceparent='00-abc-01'*/", all, true},
		{"/* app */ SELECT 1", all, true},
		{"-- app\nDELETE FROM t WHERE a = 1 -- trailing", all, true},
		{"# app\nSELECT 1", []Dialect{my}, true},
		{"  (SELECT 1) UNION (SELECT 2)", all, true},
		{"WITH x AS (SELECT 1) SELECT * FROM x", all, true},
		{"SELECT a$b, E'x', x'00' FROM t", all, true},
		{"SELECT $1::int - 1, a-b, a/b", []Dialect{pg}, true},
		{"SELECT 1 /*/ x */", all, true},
		{"", all, true},

		// Left to the lexer.
		{"SAVEPOINT a", all, false},
		{"commit", all, false},
		{"INSERT INTO t VALUES (1);", all, false},
		{"SELECT 1; SELECT 2", all, false},
		{"SELECT 'a\\'b'", all, false},
		{"SELECT 'unterminated", all, false},
		{"SELECT 1 /* unterminated", all, false},
		{"SELECT 1 /* a /* nested */ */", all, false},
		{"SELECT 1 /* /*/ x */", all, false},
		{"SELECT $$a$$", []Dialect{pg}, false},
		{"SELECT $tag$a$tag$", []Dialect{pg}, false},
		{"$1", []Dialect{pg}, false},
		{"SELECT 1 /*!40101 , 2 */", []Dialect{my}, false},
		{"SELECT 1 /*M! , 2 */", []Dialect{my}, false},
		{" ; SELECT 1", all, false},
		{"SELECT `a", []Dialect{my, sl}, false},
		{"SELECT [a", []Dialect{sl}, false},
	} {
		for _, d := range c.dialects {
			if got := plainFast(d, c.q); got != c.fast {
				t.Errorf("%s: plainFast(%q) = %v, want %v", d, c.q, got, c.fast)
			}
			if c.fast {
				if full := classifyFull(d, c.q); full != (stmtClass{}) {
					t.Errorf("%s: plainFast(%q) but classifyFull = %+v", d, c.q, full)
				}
			}
		}
	}
}

// FuzzClassifyFast: whatever plainFast calls plain, the lexer calls
// plain, on every dialect.
func FuzzClassifyFast(f *testing.F) {
	for _, s := range []string{"SELECT 1", "INSERT INTO t VALUES ($1, 'a''b')", "SELECT 1 -- x\n", "SELECT 1 /* x */",
		"SELECT $1$a$", "SELECT a$$b$$", "E'x'", "SELECT \"a\"\"b\"", "SELECT `a``b`", "SELECT [a]", "/*/ */ SELECT 1",
		"# x\nCOMMIT", "--x\nCOMMIT", "SELECT 1 #x\n; COMMIT", "SELECT 1 --x\n; COMMIT"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		for _, d := range []Dialect{Postgres, MySQL, SQLite} {
			if plainFast(d, q) {
				if c := classifyFull(d, q); c != (stmtClass{}) {
					t.Fatalf("%s: plainFast(%q), but classifyFull = %+v", d, q, c)
				}
			}
		}
	})
}

// keywordFold is keyword as it was before its ASCII fast path: the
// reference TestKeyword and FuzzKeyword compare it with.
func keywordFold(w string) string {
	if len(w) > len("TRANSACTION") {
		return ""
	}
	for _, k := range keywords {
		if len(k) == len(w) && strings.EqualFold(k, w) {
			return k
		}
	}
	return ""
}

func TestKeyword(t *testing.T) {
	t.Parallel()
	words := []string{"", "a", "to", "TO", "xa", "Savepoint", "transaction", "TRANSACTIONS", "INSERT", "select",
		"ſavepoint", "\u212Aill", "comm1t", "commit_", "COMMIT$", "Rollback", "é"}
	for _, k := range keywords {
		words = append(words, k, strings.ToLower(k), strings.ToUpper(k[:1])+strings.ToLower(k[1:]))
	}
	for _, w := range words {
		if got, want := keyword(w), keywordFold(w); got != want {
			t.Errorf("keyword(%q) = %q, want %q", w, got, want)
		}
	}
}

func FuzzKeyword(f *testing.F) {
	for _, s := range []string{"savepoint", "ſavepoint", "Kill", "TO"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, w string) {
		if got, want := keyword(w), keywordFold(w); got != want {
			t.Fatalf("keyword(%q) = %q, want %q", w, got, want)
		}
	})
}

// TestClassifyFastExhaustive holds plainFast to classifyFull on every
// string of up to four bytes from the characters that matter to either,
// alone and after a plain first word.
func TestClassifyFastExhaustive(t *testing.T) {
	t.Parallel()
	const alphabet = "a1E$;'\"`[]-/*#!M \n"
	var walk func(prefix string, n int)
	checked := 0
	walk = func(s string, n int) {
		for _, p := range []string{"", "SELECT "} {
			q := p + s
			for _, d := range []Dialect{Postgres, MySQL, SQLite} {
				if plainFast(d, q) {
					checked++
					if c := classifyFull(d, q); c != (stmtClass{}) {
						t.Fatalf("%s: plainFast(%q), but classifyFull = %+v", d, q, c)
					}
				}
			}
		}
		if n == 0 {
			return
		}
		for i := 0; i < len(alphabet); i++ {
			walk(s+alphabet[i:i+1], n-1)
		}
	}
	walk("", 4)
	if checked == 0 {
		t.Fatal("plainFast accepted nothing")
	}
}

// TestConnClassifyRemembersOnlyPlain: a connection's memo of plain
// statements answers as classify does, through more statements than it
// holds, repeated, interleaved with savepoint and control statements (never
// remembered) and with a statement too long to remember.
func TestConnClassifyRemembersOnlyPlain(t *testing.T) {
	t.Parallel()
	long := "SELECT '" + strings.Repeat("x", plainMemoBytes) + "'"
	var qs []string
	for i := range plainMemo + 3 {
		qs = append(qs, "SELECT "+strings.Repeat("1, ", i)+"1")
	}
	qs = append(qs, "SAVEPOINT a", "ROLLBACK TO a", "COMMIT", "SELECT 1; COMMIT", long, "")
	for _, d := range []Dialect{Postgres, MySQL, SQLite} {
		o, err := New(Config{Dialect: d})
		if err != nil {
			t.Fatal(err)
		}
		c := &conn{o: o}
		for round := range 3 {
			for _, q := range append(qs, qs...) {
				if got, want := c.classify(q), classify(d, q); got != want {
					t.Fatalf("%s round %d: conn.classify(%q) = %+v, want %+v", d, round, q, got, want)
				}
			}
		}
		for _, q := range c.plain {
			if classify(d, q).kind != kindPlain || len(q) > plainMemoBytes {
				t.Errorf("%s: remembered %q", d, q)
			}
		}
	}
}
