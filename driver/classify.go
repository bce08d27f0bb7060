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
//
// Most statements are plain, and plainFast proves that of most of them in
// one pass without tokens; the others are lexed (classifyFull).
func classify(d Dialect, query string) stmtClass {
	if plainFast(d, query) {
		return stmtClass{}
	}
	return classifyFull(d, query)
}

// classifyFull is classify without the fast path: the lexer's verdict,
// which plainFast must agree with (FuzzClassifyFast).
func classifyFull(d Dialect, query string) stmtClass {
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
// UPDATE). Case is folded in ASCII only: a word with another byte cannot
// be a keyword (no keyword has the length of a word in which a non-ASCII
// rune folds to one of its letters, such as U+017F to S).
func keyword(w string) string {
	const longest = len("TRANSACTION")
	if len(w) > longest || len(w) < 2 {
		return ""
	}
	var up [longest]byte
	for i := 0; i < len(w); i++ {
		c := w[i]
		switch {
		case c >= 'a' && c <= 'z':
			c -= 'a' - 'A'
		case c < 'A' || c > 'Z':
			return "" // no keyword has a digit, '_', '$' or a non-ASCII byte
		}
		up[i] = c
	}
	return keywordSet[string(up[:len(w)])] // a map index: not allocated
}

// keywordSet maps each of keywords to itself.
var keywordSet = func() map[string]string {
	m := make(map[string]string, len(keywords))
	for _, k := range keywords {
		m[k] = k
	}
	return m
}()

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

// plainFast reports whether query is certainly plain on dialect d, in one
// pass over its bytes and without tokens: its first token (after blanks and
// comments) is not a keyword, and after it come no top-level semicolon, no
// MySQL executable comment, and no quote or comment left open. Where it is
// not sure (a backslash anywhere, a PostgreSQL dollar quote, a block
// comment holding "/*", a semicolon even at the end) it says false, and
// classify lexes the text. What it calls plain, classifyFull calls plain
// (FuzzClassifyFast holds it to that).
//
// A quote is skipped to the next same quote: a quote doubled inside a
// string reads as that string closed and another opened, which ends where
// the lexer's escape does. Without a backslash in the text,
// PostgreSQL's E'...' and MySQL's backslash escapes end where '...' does.
func plainFast(d Dialect, query string) bool {
	if strings.IndexByte(query, '\\') >= 0 {
		return false
	}
	var special *[256]bool
	switch d {
	case Postgres:
		special = &fastSpecial[0]
	case MySQL:
		special = &fastSpecial[1]
	case SQLite:
		special = &fastSpecial[2]
	default:
		return false
	}
	i := 0
lead:
	for i < len(query) {
		switch c := query[i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
		case c == ';', c == '$' && d == Postgres:
			return false // an empty statement, a dollar quote or parameter: the lexer decides
		case isWordByte(c):
			j := i + 1
			for j < len(query) && isWordByte(query[j]) {
				j++
			}
			// (PostgreSQL's E'...' is a string, not the word E: no keyword either way.)
			if keyword(query[i:j]) != "" {
				return false
			}
			i = j
			break lead
		default:
			end, ok, comment := skipComment(d, query, i)
			if !ok {
				return false
			}
			if !comment {
				break lead // a quote or punctuation first: no command classify knows
			}
			i = end
		}
	}
	for {
		for i < len(query) && !special[query[i]] {
			i++
		}
		if i >= len(query) {
			return true
		}
		switch c := query[i]; c {
		case ';':
			return false
		case '\'', '"', '`', '[':
			closer := c
			if c == '[' {
				closer = ']'
			}
			j := strings.IndexByte(query[i+1:], closer)
			if j < 0 {
				return false
			}
			i += j + 2
		case '$': // PostgreSQL: inside a word (a$b), a parameter ($1), or a dollar quote
			if i > 0 && isWordByte(query[i-1]) || i+1 < len(query) && query[i+1] >= '0' && query[i+1] <= '9' {
				i++
				continue
			}
			return false
		default: // '-', '#', '/': a comment, or an operator
			end, ok, comment := skipComment(d, query, i)
			switch {
			case !ok:
				return false
			case comment:
				i = end
			default:
				i++
			}
		}
	}
}

// fastSpecial marks, per dialect (PostgreSQL, MySQL, SQLite), the bytes
// plainFast stops at: those that may open a quote or a comment, the
// semicolon, and on PostgreSQL the dollar.
var fastSpecial = func() (t [3][256]bool) {
	for i, set := range []string{`;'"-/$`, ";'\"`-#/", ";'\"`[-/"} {
		for _, c := range []byte(set) {
			t[i][c] = true
		}
	}
	return t
}()

// skipComment reads a comment at query[i], as the lexer does: comment is
// false if there is none, and ok false for one plainFast leaves to the
// lexer (a MySQL executable comment, an unterminated block comment, one
// holding "/*", which nests on PostgreSQL and overlaps "*/" in "/*/").
// end is where the comment ends.
func skipComment(d Dialect, query string, i int) (end int, ok, comment bool) {
	c := query[i]
	switch {
	case c == '-' && i+1 < len(query) && query[i+1] == '-' && (d != MySQL || i+2 >= len(query) || query[i+2] <= ' '),
		c == '#' && d == MySQL:
		j := strings.IndexByte(query[i:], '\n')
		if j < 0 {
			return len(query), true, true
		}
		return i + j + 1, true, true
	case c == '/' && i+1 < len(query) && query[i+1] == '*':
		if d == MySQL && (strings.HasPrefix(query[i:], "/*!") || strings.HasPrefix(query[i:], "/*M!")) {
			return 0, false, true
		}
		body := query[i+2:]
		j := strings.Index(body, "*/")
		if j < 0 || strings.Contains(body[:j+1], "/*") {
			return 0, false, true
		}
		return i + 2 + j + 2, true, true
	}
	return i, true, false
}

// classify is classify for c's dialect, answered from c.plain for a
// statement classified plain recently (a statement's class depends on its
// text and the dialect alone). Statements longer than plainMemoBytes are
// not remembered: an idle connection keeps at most plainMemo of them.
func (c *conn) classify(query string) stmtClass {
	for i := range c.plain {
		if c.plain[i] == query {
			return stmtClass{}
		}
	}
	cls := classify(c.o.cfg.Dialect, query)
	if cls.kind == kindPlain && len(query) <= plainMemoBytes {
		c.plain[c.plainNext] = query
		c.plainNext = (c.plainNext + 1) % plainMemo
	}
	return cls
}
