package driver

import (
	"strings"
	"unicode/utf8"
)

// stmtKind is what a statement does to the transaction it runs in, as far
// as the commit hook is concerned.
type stmtKind uint8

const (
	// kindPlain: no effect on the transaction's extent or savepoints.
	kindPlain stmtKind = iota
	// kindSavepoint: SAVEPOINT name.
	kindSavepoint
	// kindRelease: RELEASE [SAVEPOINT] name.
	kindRelease
	// kindRollbackTo: ROLLBACK [WORK|TRANSACTION] TO [SAVEPOINT] name.
	kindRollbackTo
	// kindTxControl: ends, restarts or implicitly commits the transaction
	// (COMMIT, END, ROLLBACK, BEGIN, START TRANSACTION, ABORT, PREPARE
	// TRANSACTION, XA, SET autocommit, and on MySQL/MariaDB every statement
	// that causes an implicit commit).
	kindTxControl
	// kindUncertain: the wrapper cannot tell with certainty (several
	// statements of which one is not plain, a MySQL procedure call or
	// executable comment, unterminated quotes, a malformed savepoint
	// command).
	kindUncertain
)

// stmtClass is a classified statement: its kind, the folded savepoint
// name for the three savepoint kinds, and for kindTxControl and
// kindUncertain a short reason for the error message.
type stmtClass struct {
	kind      stmtKind
	name      string
	reason    string
	procedure bool // a MySQL CALL (kindUncertain unless Config.AllowProcedureCalls)
}

// token is one lexical unit of SQL text: a bare word, a quoted identifier
// (with its quotes stripped and doubled quotes undone), a string literal,
// a semicolon, or any other punctuation.
type token struct {
	typ  tokType
	text string // as written; for quoted tokens the text between the quotes
	esc  byte   // for quoted tokens: the quote doubled inside, or 0
	bs   bool   // for quoted tokens: backslash escapes apply
}

// unquoted returns a quoted token's value: doubled quotes (and, where they
// apply, backslash escapes) undone.
func (t token) unquoted() string {
	if t.esc == 0 && !(t.bs && strings.IndexByte(t.text, '\\') >= 0) {
		return t.text
	}
	var b strings.Builder
	for i := 0; i < len(t.text); i++ {
		c := t.text[i]
		switch {
		case t.bs && c == '\\' && i+1 < len(t.text):
			i++
			b.WriteByte(t.text[i])
		case c == t.esc && i+1 < len(t.text) && t.text[i+1] == t.esc:
			i++
			b.WriteByte(c)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

type tokType uint8

const (
	tokWord tokType = iota
	tokQuotedIdent
	tokString
	tokSemicolon
	tokOther
)

// lexer splits SQL text into statements of tokens. It knows each dialect's
// quotes and comments: '...' strings (” doubled; with backslash escapes
// when backslash is set), PostgreSQL E'...' and $tag$...$tag$ strings,
// "..." and `...` and (SQLite) [...] identifiers, -- and /* */ comments
// (nested on PostgreSQL), MySQL's # comments and its /*! */ executable
// comments, which it reports instead of skipping.
type lexer struct {
	d         Dialect
	backslash bool // backslash escapes inside '...' (MySQL default, PostgreSQL E'')
	src       string
	pos       int
	execCmt   bool // saw a MySQL /*! */ or /*M! */ executable comment
	open      bool // text ended inside a quote or comment
}

func isWordByte(c byte) bool {
	return c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= utf8.RuneSelf
}

// next returns the next token, or false at the end of the text.
func (l *lexer) next() (token, bool) {
	for l.pos < len(l.src) {
		c := l.src[l.pos]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			l.pos++
		case c == '-' && l.pos+1 < len(l.src) && l.src[l.pos+1] == '-' &&
			(l.d != MySQL || l.pos+2 >= len(l.src) || l.src[l.pos+2] <= ' '):
			l.skipLine()
		case c == '#' && l.d == MySQL:
			l.skipLine()
		case c == '/' && l.pos+1 < len(l.src) && l.src[l.pos+1] == '*':
			if l.d == MySQL && (strings.HasPrefix(l.src[l.pos:], "/*!") || strings.HasPrefix(l.src[l.pos:], "/*M!")) {
				l.execCmt = true
			}
			l.skipBlockComment()
		case c == ';':
			l.pos++
			return token{typ: tokSemicolon, text: ";"}, true
		case c == '\'':
			return l.quoted('\'', tokString, l.backslash), true
		case (c == 'E' || c == 'e') && l.d == Postgres && l.pos+1 < len(l.src) && l.src[l.pos+1] == '\'' &&
			(l.pos == 0 || !isWordByte(l.src[l.pos-1])):
			l.pos++
			return l.quoted('\'', tokString, true), true
		case c == '"':
			// A string on MySQL without ANSI_QUOTES; an identifier for the
			// purpose of a savepoint name either way.
			return l.quoted('"', tokQuotedIdent, l.d == MySQL && l.backslash), true
		case c == '`' && l.d != Postgres:
			return l.quoted('`', tokQuotedIdent, false), true
		case c == '[' && l.d == SQLite:
			return l.bracketed(), true
		case c == '$' && l.d == Postgres && (l.pos == 0 || !isWordByte(l.src[l.pos-1])):
			if t, ok := l.dollarQuoted(); ok {
				return t, true
			}
			l.pos++
			return token{typ: tokOther, text: "$"}, true
		case isWordByte(c):
			start := l.pos
			for l.pos < len(l.src) && isWordByte(l.src[l.pos]) {
				l.pos++
			}
			return token{typ: tokWord, text: l.src[start:l.pos]}, true
		default:
			l.pos++
			return token{typ: tokOther, text: l.src[l.pos-1 : l.pos]}, true
		}
	}
	return token{}, false
}

func (l *lexer) skipLine() {
	for l.pos < len(l.src) && l.src[l.pos] != '\n' {
		l.pos++
	}
}

func (l *lexer) skipBlockComment() {
	depth := 0
	for l.pos < len(l.src) {
		switch {
		case strings.HasPrefix(l.src[l.pos:], "/*"):
			if depth == 0 || l.d == Postgres {
				depth++
			}
			l.pos += 2
		case strings.HasPrefix(l.src[l.pos:], "*/"):
			depth--
			l.pos += 2
			if depth == 0 {
				return
			}
		default:
			l.pos++
		}
	}
	l.open = true
}

// quoted reads a token quoted by q, where a doubled quote (and a
// backslash, when backslash is set) escapes; the value is undone lazily
// (token.unquoted), so lexing allocates nothing.
func (l *lexer) quoted(q byte, typ tokType, backslash bool) token {
	l.pos++ // opening quote
	start := l.pos
	t := token{typ: typ, bs: backslash}
	for l.pos < len(l.src) {
		c := l.src[l.pos]
		switch {
		case backslash && c == '\\' && l.pos+1 < len(l.src):
			l.pos += 2
		case c == q && l.pos+1 < len(l.src) && l.src[l.pos+1] == q:
			t.esc = q
			l.pos += 2
		case c == q:
			t.text = l.src[start:l.pos]
			l.pos++
			return t
		default:
			l.pos++
		}
	}
	l.open = true
	t.text = l.src[start:]
	return t
}

func (l *lexer) bracketed() token {
	end := strings.IndexByte(l.src[l.pos+1:], ']')
	if end < 0 {
		l.open = true
		t := token{typ: tokQuotedIdent, text: l.src[l.pos+1:]}
		l.pos = len(l.src)
		return t
	}
	t := token{typ: tokQuotedIdent, text: l.src[l.pos+1 : l.pos+1+end]}
	l.pos += end + 2
	return t
}

// dollarQuoted reads a PostgreSQL $tag$...$tag$ string at l.pos, or
// reports false for a $ that does not open one (a $1 parameter).
func (l *lexer) dollarQuoted() (token, bool) {
	end := l.pos + 1
	for end < len(l.src) && l.src[end] != '$' {
		c := l.src[end]
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= utf8.RuneSelf || end > l.pos+1 && c >= '0' && c <= '9') {
			return token{}, false
		}
		end++
	}
	if end >= len(l.src) {
		return token{}, false
	}
	delim := l.src[l.pos : end+1]
	body := l.src[end+1:]
	close := strings.Index(body, delim)
	if close < 0 {
		l.open = true
		l.pos = len(l.src)
		return token{typ: tokString, text: body}, true
	}
	l.pos = end + 1 + close + len(delim)
	return token{typ: tokString, text: body[:close]}, true
}

// stmtHead is one statement's first tokens (enough for every command
// classify recognises) and its token count.
type stmtHead struct {
	toks       [headTokens]token
	n          int
	start, end int // the statement's extent in the text (from the end of the previous one)
}

const headTokens = 7

func (h *stmtHead) add(t token) {
	if h.n < headTokens {
		h.toks[h.n] = t
	}
	h.n++
}

// statements lexes src into the heads of its statements (split at
// top-level semicolons, empty ones dropped). Most texts are one statement:
// the first head lives in first, so that case allocates nothing.
func (l *lexer) statements(first *stmtHead) (more []stmtHead) {
	cur, count := first, 0
	var next stmtHead
	for {
		at := l.pos
		t, ok := l.next()
		if !ok {
			break
		}
		if t.typ == tokSemicolon {
			if cur.n > 0 {
				if count > 0 {
					more = append(more, *cur)
				}
				count++
				cur = &next
				next = stmtHead{}
			}
			continue
		}
		if cur.n == 0 {
			cur.start = at
		}
		cur.add(t)
		cur.end = l.pos
	}
	if cur.n > 0 && count > 0 {
		more = append(more, *cur)
	}
	return more
}

// classify tells what query does to the transaction it runs in on dialect
// d. It never guesses toward keeping events that a rollback removed: what
// it cannot tell is kindUncertain.
//
// Where a backslash could change where a string ends (MySQL without
// NO_BACKSLASH_ESCAPES, PostgreSQL with standard_conforming_strings off),
// the text is lexed both ways, and a disagreement is kindUncertain.
func classify(d Dialect, query string) stmtClass {
	c, open := classifyLexed(d, query, d == MySQL)
	if d != SQLite && strings.IndexByte(query, '\\') >= 0 {
		alt, altOpen := classifyLexed(d, query, d != MySQL)
		if alt != c || altOpen != open {
			return stmtClass{kind: kindUncertain, reason: "a backslash makes the statement's extent depend on the server's string settings"}
		}
	}
	return c
}

func classifyLexed(d Dialect, query string, backslash bool) (stmtClass, bool) {
	l := &lexer{d: d, src: query, backslash: backslash}
	var first stmtHead
	more := l.statements(&first)
	switch {
	case l.open:
		return stmtClass{kind: kindUncertain, reason: "unterminated quote or comment"}, true
	case l.execCmt:
		return stmtClass{kind: kindUncertain, reason: "MySQL executable comment (/*! ... */)"}, false
	case first.n == 0:
		return stmtClass{}, false
	case len(more) == 0:
		return classifyOne(d, query, &first), false
	}
	for i := -1; i < len(more); i++ {
		h := &first
		if i >= 0 {
			h = &more[i]
		}
		if c := classifyOne(d, query, h); c.kind != kindPlain {
			return stmtClass{kind: kindUncertain, reason: "several statements in one string, one of them not plain (" + describe(c) + ")"}, false
		}
	}
	return stmtClass{}, false
}

func describe(c stmtClass) string {
	switch c.kind {
	case kindSavepoint, kindRelease, kindRollbackTo:
		return "a savepoint command"
	}
	return c.reason
}

// mysqlImplicitCommit lists the first words of MySQL/MariaDB statements
// that commit the current transaction implicitly (MySQL 8.0 manual,
// "Statements That Cause an Implicit Commit"; MariaDB's list is the same in
// substance). CREATE and DROP with TEMPORARY are excepted by the caller.
var mysqlImplicitCommit = map[string]bool{
	"ALTER": true, "CREATE": true, "DROP": true, "RENAME": true, "TRUNCATE": true,
	"LOCK": true, "UNLOCK": true, "GRANT": true, "REVOKE": true, "FLUSH": true,
	"RESET": true, "ANALYZE": true, "OPTIMIZE": true, "REPAIR": true, "CACHE": true,
	"INSTALL": true, "UNINSTALL": true, "CHANGE": true, "STOP": true, "BACKUP": true,
	"PURGE": true,
}

func classifyOne(d Dialect, src string, h *stmtHead) stmtClass {
	s := h.toks[:min(h.n, headTokens)]
	if s[0].typ != tokWord {
		return stmtClass{}
	}
	word := func(i int) string {
		if i < len(s) && s[i].typ == tokWord {
			return keyword(s[i].text)
		}
		return ""
	}
	control := func(reason string) stmtClass { return stmtClass{kind: kindTxControl, reason: reason} }
	first := word(0)
	switch first {
	case "SAVEPOINT":
		return savepointCmd(d, kindSavepoint, h, 1)
	case "RELEASE":
		i := 1
		if word(i) == "SAVEPOINT" {
			i++
		}
		return savepointCmd(d, kindRelease, h, i)
	case "ROLLBACK":
		i := 1
		if w := word(i); w == "WORK" || w == "TRANSACTION" || w == "TRAN" {
			i++
		}
		if word(i) != "TO" {
			return control("ROLLBACK ends the transaction: call tx.Rollback()")
		}
		i++
		if word(i) == "SAVEPOINT" {
			i++
		}
		return savepointCmd(d, kindRollbackTo, h, i)
	case "COMMIT", "END":
		return control(first + " ends the transaction: call tx.Commit()")
	case "BEGIN", "START":
		return control(first + " would end or nest a transaction: begin transactions with db.BeginTx")
	case "ABORT":
		if d == Postgres {
			return control("ABORT ends the transaction: call tx.Rollback()")
		}
	case "PREPARE":
		if d == Postgres && word(1) == "TRANSACTION" {
			return control("PREPARE TRANSACTION ends the transaction")
		}
	case "XA":
		if d == MySQL {
			return control("XA statements end or start transactions")
		}
	}
	if d != MySQL {
		return stmtClass{}
	}
	switch {
	case first == "CALL":
		return stmtClass{kind: kindUncertain, procedure: true, reason: "a MySQL stored procedure may COMMIT, ROLLBACK or roll back to a savepoint (see Config.AllowProcedureCalls)"}
	case first == "SET":
		if word(1) == "PASSWORD" {
			return control("SET PASSWORD commits the transaction implicitly on MySQL/MariaDB")
		}
		// autocommit anywhere in the assignment list (SET autocommit,
		// @@autocommit, @@session.autocommit, SET x = 1, autocommit = 0):
		// the statement's head may not reach it, so search the text.
		if containsFold(src[h.start:h.end], "autocommit") {
			return control("SET autocommit commits or changes the transaction mode")
		}
	case (first == "CREATE" || first == "DROP") && word(1) == "TEMPORARY":
		return stmtClass{}
	case first == "CHECK" && word(1) != "TABLE",
		first == "LOAD" && word(1) != "INDEX":
		return stmtClass{}
	case first == "CHECK", first == "LOAD", mysqlImplicitCommit[first]:
		return control(first + " commits the transaction implicitly on MySQL/MariaDB")
	}
	return stmtClass{}
}

// savepointCmd reads the savepoint name at s[i], which must end the
// statement, folded as d compares names: PostgreSQL folds unquoted names
// to lower case and keeps quoted ones; MySQL and SQLite compare names
// case-insensitively.
func savepointCmd(d Dialect, kind stmtKind, h *stmtHead, i int) stmtClass {
	if i != h.n-1 || i >= headTokens {
		return stmtClass{kind: kindUncertain, reason: "malformed savepoint command"}
	}
	t := h.toks[i]
	var name string
	switch {
	case t.typ == tokWord && d == Postgres:
		name = asciiLower(t.text)
	case t.typ == tokWord:
		name = strings.ToLower(t.text)
	case t.typ == tokQuotedIdent && d == Postgres:
		name = t.unquoted()
	case t.typ == tokQuotedIdent, t.typ == tokString && d == SQLite:
		name = strings.ToLower(t.unquoted())
	default:
		return stmtClass{kind: kindUncertain, reason: "malformed savepoint command"}
	}
	return stmtClass{kind: kind, name: name}
}

// keywords are the words classify looks at, upper case.
var keywords = []string{
	"SAVEPOINT", "RELEASE", "ROLLBACK", "WORK", "TRANSACTION", "TRAN", "TO", "COMMIT", "END",
	"BEGIN", "START", "ABORT", "PREPARE", "XA", "CALL", "SET", "PASSWORD", "TEMPORARY",
	"CHECK", "TABLE", "LOAD", "INDEX",
	"ALTER", "CREATE", "DROP", "RENAME", "TRUNCATE", "LOCK", "UNLOCK", "GRANT", "REVOKE", "FLUSH",
	"RESET", "ANALYZE", "OPTIMIZE", "REPAIR", "CACHE", "INSTALL", "UNINSTALL", "CHANGE", "STOP",
	"BACKUP", "PURGE",
}

// keyword returns w's upper-case form if it is one of keywords, else ""
// (without allocating: most statements' first word is SELECT, INSERT or
// UPDATE).
func keyword(w string) string {
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

// containsFold reports whether s contains the lower-case ASCII word w in
// any case.
func containsFold(s, w string) bool {
	for i := 0; i+len(w) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(w)], w) {
			return true
		}
	}
	return false
}

func asciiLower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if c := b[j]; c >= 'A' && c <= 'Z' {
					b[j] = c + 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
