package admin

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/relay"
)

var funcs = template.FuncMap{
	"ago": func(d time.Duration) string {
		if d <= 0 {
			return "-"
		}
		if d < time.Second {
			return d.Round(time.Millisecond).String()
		}
		return d.Round(time.Second).String()
	},
	"ts": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05.000 UTC")
	},
	"count": func(n, capN int64) string {
		if capN > 0 && n > capN {
			return group(capN) + "+"
		}
		return group(n)
	},
	"num": func(n int64) string { return group(n) },
	"bytes": func(n int64) string {
		switch {
		case n >= 1<<30:
			return strconv.FormatFloat(float64(n)/(1<<30), 'f', 1, 64) + " GiB"
		case n >= 1<<20:
			return strconv.FormatFloat(float64(n)/(1<<20), 'f', 1, 64) + " MiB"
		case n >= 1<<10:
			return strconv.FormatFloat(float64(n)/(1<<10), 'f', 1, 64) + " KiB"
		}
		return group(n) + " B"
	},
	"rate": func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
}

// group writes n with thousands separators (12,345).
func group(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

func parseTemplates() (map[string]*template.Template, error) {
	pages, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	out := map[string]*template.Template{}
	for _, p := range pages {
		name := strings.TrimSuffix(path.Base(p), ".html")
		if name == "layout" {
			continue
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", p)
		if err != nil {
			return nil, fmt.Errorf("outbox admin: template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

// view is what every template gets.
type view struct {
	Prefix   string
	Page     string
	Who      string
	CSRF     string
	ReadOnly bool
	Inbox    bool // inbox tables configured: the Consumers page is in the menu
	Outbox   bool // an outbox table (not Config.InboxOnly): its pages are in the menu
	Message  string
	Data     any
}

// render writes a page, or only its "body" block for a fragment request
// (?fragment=1: the page's refresh).
func (h *Handler) render(w http.ResponseWriter, r *http.Request, page string, s *session, data any) {
	v := view{Prefix: h.cfg.Prefix, Page: page, ReadOnly: h.cfg.ReadOnly, Data: data, Inbox: len(h.cfg.InboxTables) > 0, Outbox: !h.cfg.InboxOnly}
	name := "layout.html"
	if r.URL.Query().Get("fragment") != "" {
		name = "body"
	}
	if s != nil {
		v.Who, v.CSRF = s.who, s.csrf
		if name == "layout.html" {
			v.Message = h.auth.takeFlash(s)
		}
	}
	var buf bytes.Buffer
	if err := h.tmpl[page].ExecuteTemplate(&buf, name, v); err != nil {
		h.log.Error("rendering the admin page", "page", page, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(buf.Bytes())
}

// fail answers a request whose reading failed: the error's text (database
// errors carry no DSN) and a 500.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	h.log.Error("admin page", "path", r.URL.Path, "err", err)
	http.Error(w, "error: "+err.Error(), http.StatusInternalServerError)
}

func (h *Handler) overviewPage(w http.ResponseWriter, r *http.Request, s *session) {
	o, err := h.readOverview(r.Context(), false)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var relays []RelayStatus
	if h.cfg.Relays != nil {
		relays = h.cfg.Relays()
	}
	h.render(w, r, "overview", s, map[string]any{"O": o, "Chart": h.throughput(), "Relays": relays,
		"Table": h.cfg.Outbox.Config().Table, "StuckAfter": h.cfg.StuckAfter})
}

func (h *Handler) partitionsPage(w http.ResponseWriter, r *http.Request, s *session) {
	o, err := h.readOverview(r.Context(), false)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.render(w, r, "partitions", s, map[string]any{"O": o, "StuckAfter": h.cfg.StuckAfter})
}

func (h *Handler) deadPage(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	f := deadFilter{AggregateType: q.Get("aggregate_type"), AggregateID: q.Get("aggregate_id"),
		EventType: q.Get("event_type"), Error: q.Get("error")}
	var problems []string
	if v := q.Get("older_than"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			problems = append(problems, "older than: want a duration such as 10m or 2h")
		}
		f.OlderThan = d
	}
	if v := q.Get("after"); v != "" {
		f.After, _ = strconv.ParseInt(v, 10, 64)
	}
	var list []event
	if len(problems) == 0 { // a filter that does not parse lists nothing, never everything
		where, args := h.where(f, statusDead)
		var err error
		if list, err = h.events(r.Context(), where, args, h.cfg.PageSize+1, f.hint()); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	next := ""
	if len(list) > h.cfg.PageSize {
		list = list[:h.cfg.PageSize]
		nq := url.Values{}
		for k, v := range q {
			if k != "after" && k != "fragment" {
				nq[k] = v
			}
		}
		nq.Set("after", strconv.FormatInt(list[len(list)-1].ID, 10))
		next = "dead?" + nq.Encode()
	}
	filtered := f.AggregateType != "" || f.AggregateID != "" || f.EventType != "" || f.Error != "" || q.Get("older_than") != ""
	h.render(w, r, "dead", s, map[string]any{"List": list, "F": f, "OlderThan": q.Get("older_than"),
		"Next": next, "Problems": problems, "PageSize": h.cfg.PageSize, "Filtered": filtered})
}

// payloadView is the detail view's payload: as text (if UTF-8), as JSON
// pretty-printed (if JSON), and as a hex dump.
type payloadView struct {
	Size       int
	Text, JSON string
	IsText     bool
	IsJSON     bool
	Hex        string
	Truncated  bool
}

// maxShownPayload bounds what the detail view renders of one payload.
const maxShownPayload = 256 << 10

func viewPayload(p []byte) payloadView {
	v := payloadView{Size: len(p)}
	if len(p) > maxShownPayload {
		p, v.Truncated = p[:maxShownPayload], true
	}
	if utf8.Valid(p) {
		v.IsText, v.Text = true, string(p)
	}
	if !v.Truncated && json.Valid(p) {
		var b bytes.Buffer
		if json.Indent(&b, p, "", "  ") == nil {
			v.IsJSON, v.JSON = true, b.String()
		}
	}
	hp := p
	if len(hp) > 64<<10 {
		hp = hp[:64<<10]
		v.Truncated = true
	}
	v.Hex = hex.Dump(hp)
	return v
}

func (h *Handler) rowByID(r *http.Request, id int64) (*event, error) {
	list, err := h.events(r.Context(), "id = ?", []any{id}, 1, hintNone)
	if err != nil || len(list) == 0 {
		return nil, err
	}
	return &list[0], nil
}

func (h *Handler) deadDetail(w http.ResponseWriter, r *http.Request, s *session) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	e, err := h.rowByID(r, id)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if e == nil {
		http.NotFound(w, r)
		return
	}
	data := map[string]any{"E": e, "Hidden": h.cfg.HidePayloads}
	if !h.cfg.HidePayloads {
		b, err := h.body(r.Context(), id)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		data["Body"], data["Payload"] = b, viewPayload(b.Payload)
	}
	h.render(w, r, "detail", s, data)
}

// selection is what a confirmation lists: the rows an action will touch.
type selection struct {
	Action, Kind string
	Rows         []event
	Ignored      int // rows listed that the action leaves alone
	More         bool
	Table        string // inbox
	Consumer     string // inbox
	Parked       []inbox.Parked
	Aggregate    [2]string
	MessageID    string
	Pending      []relay.PendingEvent // pending
}

func (h *Handler) deadConfirm(w http.ResponseWriter, r *http.Request, s *session) {
	if h.cfg.ReadOnly {
		h.refuse(w, r, "read-only mode")
		return
	}
	action := r.PostForm.Get("action")
	if action != "retry" && action != "skip" {
		http.Error(w, "unknown action", http.StatusBadRequest)
		return
	}
	sel := selection{Action: action}
	var where, hint string
	var args []any
	if at, ai := r.PostForm.Get("aggregate_type"), r.PostForm.Get("aggregate_id"); at != "" || ai != "" {
		sel.Kind, sel.Aggregate = "aggregate", [2]string{at, ai}
		where, args, hint = "status = 2 AND aggregate_type = ? AND aggregate_id = ?", []any{at, ai}, hintAggregate
	} else {
		ids, err := formIDs(r)
		if err != nil || len(ids) == 0 {
			h.auth.setFlash(s, "Select at least one dead letter.")
			http.Redirect(w, r, h.cfg.Prefix+"dead", http.StatusSeeOther)
			return
		}
		sel.Kind = "selection"
		where = "status = 2 AND id IN (" + strings.TrimSuffix(strings.Repeat("?,", len(ids)), ",") + ")"
		for _, id := range ids {
			args = append(args, id)
		}
	}
	rows, err := h.events(r.Context(), where, args, relay.MaxSelectorIDs+1, hint)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if len(rows) > relay.MaxSelectorIDs {
		rows, sel.More = rows[:relay.MaxSelectorIDs], true
	}
	for _, e := range rows {
		if action == "skip" && !e.Held {
			sel.Ignored++ // already released: skip leaves it alone
			continue
		}
		sel.Rows = append(sel.Rows, e)
	}
	h.render(w, r, "confirm", s, sel)
}

// formIDs reads the form's id fields: row ids, at most MaxSelectorIDs.
func formIDs(r *http.Request) ([]int64, error) {
	vals := r.PostForm["id"]
	if len(vals) > relay.MaxSelectorIDs {
		return nil, fmt.Errorf("at most %d rows at once", relay.MaxSelectorIDs)
	}
	var ids []int64
	for _, v := range vals {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id <= 0 {
			return nil, fmt.Errorf("bad row id %q", v)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// deadApply acts on exactly the rows the confirmation listed (their ids
// come back in the form), never on what a filter matches now: rows that
// stopped being dead meanwhile are left alone.
func (h *Handler) deadApply(w http.ResponseWriter, r *http.Request, s *session) {
	if h.cfg.ReadOnly {
		h.refuse(w, r, "read-only mode")
		return
	}
	action := r.PostForm.Get("action")
	ids, err := formIDs(r)
	if err != nil || len(ids) == 0 || (action != "retry" && action != "skip") {
		http.Error(w, "bad request: want action retry or skip and 1 to 500 row ids", http.StatusBadRequest)
		return
	}
	var n int64
	if action == "retry" {
		n, err = h.dl.Retry(r.Context(), relay.Selector{IDs: ids})
	} else {
		n, err = h.dl.Skip(r.Context(), relay.Selector{IDs: ids})
	}
	attrs := append(s.actor(r), "action", "dead "+action, "table", h.cfg.Outbox.Config().Table, "ids", ids, "confirmed", len(ids), "changed", n)
	if err != nil {
		h.audit.Error("admin mutation failed", append(attrs, "err", err)...)
		h.fail(w, r, err)
		return
	}
	h.audit.Info("admin mutation", attrs...)
	h.invalidate()
	verb := map[string]string{"retry": "Retried", "skip": "Released"}[action]
	msg := fmt.Sprintf("%s %d of the %d dead letters confirmed.", verb, n, len(ids))
	if int(n) < len(ids) {
		msg += " The others had changed since the confirmation and were left alone."
	}
	h.auth.setFlash(s, msg)
	http.Redirect(w, r, h.cfg.Prefix+"dead", http.StatusSeeOther)
}

// pendingConfirm lists the pending events a dead-lettering would change
// (the rows selected on the lookup page, or an aggregate's pending
// events), for pendingApply: action "dead" holds their aggregates,
// "skip" releases them.
func (h *Handler) pendingConfirm(w http.ResponseWriter, r *http.Request, s *session) {
	if h.cfg.ReadOnly {
		h.refuse(w, r, "read-only mode")
		return
	}
	action := r.PostForm.Get("action")
	if action != "dead" && action != "skip" {
		http.Error(w, "unknown action", http.StatusBadRequest)
		return
	}
	sel := selection{Action: action, Kind: "pending"}
	var rs relay.Selector
	if at, ai := r.PostForm.Get("aggregate_type"), r.PostForm.Get("aggregate_id"); at != "" || ai != "" {
		sel.Aggregate = [2]string{at, ai}
		rs = relay.Selector{AggregateType: at, AggregateID: ai}
	} else {
		ids, err := formIDs(r)
		if err != nil || len(ids) == 0 {
			h.auth.setFlash(s, "Select at least one pending event.")
			http.Redirect(w, r, h.cfg.Prefix+"lookup", http.StatusSeeOther)
			return
		}
		rs = relay.Selector{IDs: ids}
	}
	list, err := h.dl.ListPending(r.Context(), rs, relay.MaxSelectorIDs+1)
	if errors.Is(err, relay.ErrInvalidSelector) {
		http.Error(w, "bad request: give both the aggregate type and ID, or row ids", http.StatusBadRequest)
		return
	}
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if len(list) > relay.MaxSelectorIDs {
		list, sel.More = list[:relay.MaxSelectorIDs], true
	}
	sel.Pending = list
	h.render(w, r, "confirm", s, sel)
}

// pendingApply dead-letters exactly the pending events the confirmation
// listed (their ids come back in the form), and only those still
// pending: one the relay published meanwhile is left alone.
func (h *Handler) pendingApply(w http.ResponseWriter, r *http.Request, s *session) {
	if h.cfg.ReadOnly {
		h.refuse(w, r, "read-only mode")
		return
	}
	action := r.PostForm.Get("action")
	ids, err := formIDs(r)
	if err != nil || len(ids) == 0 || (action != "dead" && action != "skip") {
		http.Error(w, "bad request: want action dead or skip and 1 to 500 row ids", http.StatusBadRequest)
		return
	}
	policy, reason := relay.HoldAggregate, "dead-lettered while pending by "+s.who+" on the admin page"
	if action == "skip" {
		policy, reason = relay.SkipDead, "dead-lettered while pending by "+s.who+" on the admin page, aggregate released"
	}
	n, err := h.dl.DeadLetterPending(r.Context(), ids, policy, reason)
	attrs := append(s.actor(r), "action", "pending "+action, "table", h.cfg.Outbox.Config().Table, "ids", ids, "confirmed", len(ids), "changed", n)
	if err != nil {
		h.audit.Error("admin mutation failed", append(attrs, "err", err)...)
		h.fail(w, r, err)
		return
	}
	h.audit.Info("admin mutation", attrs...)
	h.invalidate()
	msg := fmt.Sprintf("Dead-lettered %d of the %d pending events confirmed", n, len(ids))
	if action == "skip" {
		msg += "; their aggregates are released"
	}
	msg += "."
	if int(n) < len(ids) {
		msg += " The others were published or changed since the confirmation and were left alone."
	}
	h.auth.setFlash(s, msg+" Retry them here once their route exists.")
	http.Redirect(w, r, h.cfg.Prefix+"dead", http.StatusSeeOther)
}

// hasPending reports whether list holds a pending event (the lookup page
// then offers to dead-letter it).
func hasPending(list []event) bool {
	for _, e := range list {
		if e.Status == statusPending {
			return true
		}
	}
	return false
}

// invalidate drops the cached overview after a mutation.
func (h *Handler) invalidate() {
	h.mu.Lock()
	h.overview = nil
	h.mu.Unlock()
}

func (h *Handler) lookupPage(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	data := map[string]any{"MessageID": q.Get("message_id"), "AggregateType": q.Get("aggregate_type"), "AggregateID": q.Get("aggregate_id")}
	switch {
	case q.Get("message_id") != "":
		list, err := h.events(r.Context(), "message_id = ?", []any{q.Get("message_id")}, 1, hintNone)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		data["List"], data["Searched"], data["HasPending"] = list, true, hasPending(list)
	case (q.Get("aggregate_type") != "") != (q.Get("aggregate_id") != ""):
		data["Problem"] = "Give both the aggregate type and the aggregate ID."
	case q.Get("aggregate_type") != "":
		ok, err := h.aggregateIndex(r.Context())
		if err != nil {
			h.fail(w, r, err)
			return
		}
		if !ok {
			data["NoIndex"] = h.d.Query("admin_aggregate_index_ddl")
			break
		}
		after, _ := strconv.ParseInt(q.Get("after"), 10, 64)
		list, err := h.events(r.Context(), "aggregate_type = ? AND aggregate_id = ? AND id > ?",
			[]any{q.Get("aggregate_type"), q.Get("aggregate_id"), after}, h.cfg.PageSize+1, hintAggregate)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		if len(list) > h.cfg.PageSize {
			list = list[:h.cfg.PageSize]
			data["Next"] = "lookup?" + url.Values{"aggregate_type": {q.Get("aggregate_type")}, "aggregate_id": {q.Get("aggregate_id")},
				"after": {strconv.FormatInt(list[len(list)-1].ID, 10)}}.Encode()
		}
		data["List"], data["Searched"], data["HasPending"] = list, true, hasPending(list)
	}
	h.render(w, r, "lookup", s, data)
}

// requestSeen is a retry request this page recorded, and when the page
// first saw it served (gone from the requests table).
type requestSeen struct {
	Table, Consumer string
	Target          string
	Requested       time.Time
	Applied         time.Time
}

type consumerGroup struct {
	Table     string
	Consumers []inbox.ConsumerParked
	Err       string
}

func (h *Handler) inboxPage(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	dia := h.cfg.Outbox.Config().Dialect
	var groups []consumerGroup
	for _, t := range h.cfg.InboxTables {
		cs, err := inbox.Consumers(r.Context(), h.cfg.DB, inbox.Config{Dialect: dia, Table: t})
		g := consumerGroup{Table: t, Consumers: cs}
		if err != nil {
			g.Err = err.Error()
		}
		groups = append(groups, g)
	}
	data := map[string]any{"Groups": groups, "Hidden": h.cfg.HidePayloads}
	table, consumer := q.Get("table"), q.Get("consumer")
	if table != "" && consumer != "" && h.knownInbox(table) {
		in, err := inboxOf(dia, table, consumer)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f := inbox.ParkedFilter{Limit: h.cfg.PageSize + 1, AggregateType: q.Get("aggregate_type"), AggregateID: q.Get("aggregate_id")}
		parked, err := in.ListParked(r.Context(), h.cfg.DB, f)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		if len(parked) > h.cfg.PageSize {
			parked, data["More"] = parked[:h.cfg.PageSize], true
		}
		pending, err := in.PendingRequests(r.Context(), h.cfg.DB)
		if err != nil {
			h.fail(w, r, err)
			return
		}
		data["Table"], data["Consumer"], data["Parked"], data["Pending"] = table, consumer, parked, pending
		data["AggregateType"], data["AggregateID"] = f.AggregateType, f.AggregateID
		data["Seen"] = h.observeRequests(table, consumer, pending)
	}
	h.render(w, r, "inbox", s, data)
}

func (h *Handler) knownInbox(table string) bool {
	for _, t := range h.cfg.InboxTables {
		if t == table {
			return true
		}
	}
	return false
}

func requestKey(table, consumer, target string) string {
	return table + "\x00" + consumer + "\x00" + target
}

func requestTarget(aggType, aggID, messageID string) string {
	if aggType != "" || aggID != "" {
		return "aggregate " + aggType + "/" + aggID
	}
	return "message " + messageID
}

// observeRequests marks the requests this page recorded that are no
// longer pending as applied (first seen gone now) and returns the
// consumer's, newest first.
func (h *Handler) observeRequests(table, consumer string, pending []inbox.Request) []requestSeen {
	still := map[string]bool{}
	for _, p := range pending {
		still[requestKey(table, consumer, requestTarget(p.AggregateType, p.AggregateID, p.MessageID))] = true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []requestSeen
	for k, rs := range h.requests {
		if rs.Table != table || rs.Consumer != consumer {
			continue
		}
		if !still[k] && rs.Applied.IsZero() {
			rs.Applied = time.Now().UTC()
		}
		out = append(out, *rs)
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].Requested.After(out[j-1].Requested); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

func (h *Handler) inboxTarget(r *http.Request) (*inbox.Inbox, inbox.ParkedFilter, string, string, error) {
	table, consumer := r.PostForm.Get("table"), r.PostForm.Get("consumer")
	if !h.knownInbox(table) {
		return nil, inbox.ParkedFilter{}, "", "", errors.New("unknown inbox table")
	}
	in, err := inboxOf(h.cfg.Outbox.Config().Dialect, table, consumer)
	if err != nil {
		return nil, inbox.ParkedFilter{}, "", "", err
	}
	f := inbox.ParkedFilter{ID: r.PostForm.Get("message_id"), AggregateType: r.PostForm.Get("aggregate_type"), AggregateID: r.PostForm.Get("aggregate_id")}
	if f.ID == "" && f.AggregateType == "" && f.AggregateID == "" {
		return nil, f, "", "", errors.New("name a message or an aggregate")
	}
	return in, f, table, consumer, nil
}

func (h *Handler) inboxConfirm(w http.ResponseWriter, r *http.Request, s *session) {
	if h.cfg.ReadOnly {
		h.refuse(w, r, "read-only mode")
		return
	}
	action := r.PostForm.Get("action")
	in, f, table, consumer, err := h.inboxTarget(r)
	if err != nil || (action != "skip" && action != "retry") {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	f.Limit = relay.MaxSelectorIDs + 1
	parked, err := in.ListParked(r.Context(), h.cfg.DB, f)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	sel := selection{Action: "inbox-" + action, Kind: "inbox", Table: table, Consumer: consumer,
		Aggregate: [2]string{f.AggregateType, f.AggregateID}, MessageID: f.ID}
	if len(parked) > relay.MaxSelectorIDs {
		parked, sel.More = parked[:relay.MaxSelectorIDs], true
	}
	for _, p := range parked {
		if action == "skip" && p.Held {
			sel.Ignored++ // skip acts on parked messages; held ones wait for the runner
			continue
		}
		sel.Parked = append(sel.Parked, p)
	}
	h.render(w, r, "confirm", s, sel)
}

// inboxApply skips exactly the parked messages the confirmation listed
// (one Skip per message ID), or records a retry request for the aggregate
// or message, which the consumer's runner serves with its own handler.
func (h *Handler) inboxApply(w http.ResponseWriter, r *http.Request, s *session) {
	if h.cfg.ReadOnly {
		h.refuse(w, r, "read-only mode")
		return
	}
	action := r.PostForm.Get("action")
	in, f, table, consumer, err := h.inboxTarget(r)
	if err != nil {
		http.Error(w, "bad request: "+err.Error(), http.StatusBadRequest)
		return
	}
	attrs := append(s.actor(r), "action", "inbox "+action, "table", table, "consumer", consumer)
	back := h.cfg.Prefix + "inbox?" + url.Values{"table": {table}, "consumer": {consumer}}.Encode()
	switch action {
	case "skip":
		ids := r.PostForm["skip_id"]
		if len(ids) == 0 || len(ids) > relay.MaxSelectorIDs {
			http.Error(w, "bad request: 1 to 500 message IDs", http.StatusBadRequest)
			return
		}
		n := 0
		for _, id := range ids {
			k, err := in.Skip(r.Context(), h.cfg.DB, inbox.ParkedFilter{ID: id})
			if err != nil && !errors.Is(err, inbox.ErrNothingMatched) {
				h.audit.Error("admin mutation failed", append(attrs, "message_ids", ids, "changed", n, "err", err)...)
				h.fail(w, r, err)
				return
			}
			n += k
		}
		h.audit.Info("admin mutation", append(attrs, "message_ids", ids, "confirmed", len(ids), "changed", n)...)
		h.auth.setFlash(s, fmt.Sprintf("Skipped %d of the %d parked messages confirmed; the runner releases their aggregates at its next request interval.", n, len(ids)))
		http.Redirect(w, r, back, http.StatusSeeOther)
	case "retry":
		// What the request covers now (the runner applies what is parked
		// or held when it serves it): for the audit log, capped.
		now, err := in.ListParked(r.Context(), h.cfg.DB, inbox.ParkedFilter{ID: f.ID, AggregateType: f.AggregateType, AggregateID: f.AggregateID, Limit: relay.MaxSelectorIDs + 1})
		if err != nil {
			h.fail(w, r, err)
			return
		}
		attrs = append(attrs, "parked_or_held_now", len(now))
		n, err := in.RequestRetry(r.Context(), h.cfg.DB, f)
		if err != nil && !errors.Is(err, inbox.ErrNothingMatched) {
			h.audit.Error("admin mutation failed", append(attrs, "target", requestTarget(f.AggregateType, f.AggregateID, f.ID), "err", err)...)
			h.fail(w, r, err)
			return
		}
		h.audit.Info("admin mutation", append(attrs, "target", requestTarget(f.AggregateType, f.AggregateID, f.ID), "requests", n)...)
		if n > 0 {
			t := requestTarget(f.AggregateType, f.AggregateID, f.ID)
			if f.ID != "" && f.AggregateType == "" && f.AggregateID == "" {
				// A message with an aggregate is requested by its aggregate.
				if ps, err := in.ListParked(r.Context(), h.cfg.DB, inbox.ParkedFilter{ID: f.ID, Limit: 1}); err == nil && len(ps) == 1 {
					t = requestTarget(ps[0].AggregateType, ps[0].AggregateID, ps[0].ID)
				}
			}
			h.mu.Lock()
			h.requests[requestKey(table, consumer, t)] = &requestSeen{Table: table, Consumer: consumer, Target: t, Requested: time.Now().UTC()}
			h.mu.Unlock()
		}
		h.auth.setFlash(s, fmt.Sprintf("Recorded %d retry request(s); the consumer's runner applies them with its own handler.", n))
		http.Redirect(w, r, back, http.StatusSeeOther)
	default:
		http.Error(w, "unknown action", http.StatusBadRequest)
	}
}
