package admin

import (
	"strings"
	"time"
)

// Statement is one statement the page issues, with realistic arguments,
// for the plan tests.
type Statement struct {
	Name, SQL string
	Args      []any
}

// Statements returns every statement the handler runs against the outbox
// table, built by the handler's own code: ids are dead letters' row ids
// (a confirmation of that many), aggType/aggID an aggregate that has rows.
func (h *Handler) Statements(ids []int64, aggType, aggID, messageID string) []Statement {
	capN := int64(h.cfg.CountCap)
	out := []Statement{
		{"counts", h.d.Bind(h.d.Query("admin_counts")), []any{capN + 1, capN + 1, capN + 1}},
		{"backlog", h.d.Bind(h.d.Query("admin_backlog")), []any{capN}},
		{"held partitions", h.d.Bind(h.d.Query("admin_held_partitions")), []any{capN}},
		{"event body", h.d.Bind(h.d.Query("admin_event_body")), []any{ids[0]}},
	}
	for _, f := range []struct {
		name string
		f    deadFilter
	}{
		{"dead list", deadFilter{}},
		{"dead list, next page", deadFilter{After: ids[len(ids)/2]}},
		{"dead list by aggregate", deadFilter{AggregateType: aggType, AggregateID: aggID}},
		{"dead list by event type", deadFilter{EventType: "acct.changed"}},
		{"dead list by error text", deadFilter{Error: "refuses"}},
		{"dead list by age", deadFilter{OlderThan: time.Minute}},
		{"dead list, every filter", deadFilter{AggregateType: aggType, AggregateID: aggID, EventType: "acct.changed", Error: "x", OlderThan: time.Second, After: 1}},
	} {
		w, a := h.where(f.f, statusDead)
		out = append(out, Statement{f.name, h.eventsSQL(w, f.f.hint(), h.cfg.PageSize+1), a})
	}
	in := "status = 2 AND id IN (" + strings.TrimSuffix(strings.Repeat("?,", len(ids)), ",") + ")"
	args := make([]any, len(ids))
	for i, id := range ids {
		args[i] = id
	}
	out = append(out,
		Statement{"confirmation of a selection", h.eventsSQL(in, hintNone, 501), args},
		Statement{"confirmation of an aggregate", h.eventsSQL("status = 2 AND aggregate_type = ? AND aggregate_id = ?", hintAggregate, 501), []any{aggType, aggID}},
		Statement{"lookup by message ID", h.eventsSQL("message_id = ?", hintNone, 1), []any{messageID}},
		Statement{"row by id", h.eventsSQL("id = ?", hintNone, 1), []any{ids[0]}},
		Statement{"lookup by aggregate", h.eventsSQL("aggregate_type = ? AND aggregate_id = ? AND id > ?", hintAggregate, h.cfg.PageSize+1), []any{aggType, aggID, int64(0)}},
		Statement{"apply: the ids still dead", h.d.WithSelectorIndex("dead_ids", "id IN ("+strings.TrimSuffix(strings.Repeat("?,", len(ids)), ",")+")", hintNone, 0), args},
		Statement{"apply: retry by primary key", h.d.WithIDs("dead_retry", len(ids)), args},
		Statement{"apply: skip by primary key", h.d.WithIDs("dead_skip", len(ids)), args},
	)
	// The CLI's and relay.DeadLetters' own statements (outbox dead list,
	// retry, skip), with each kind of selector.
	// (The where clauses and hints are relay.Selector's.)
	for _, sel := range []struct {
		name, where, hint string
		args              []any
	}{
		{"all", "1 = 1", hintStatus, nil},
		{"an aggregate", "aggregate_type = ? AND aggregate_id = ?", hintAggregate, []any{aggType, aggID}},
		{"a message ID", "message_id = ?", hintNone, []any{messageID}},
	} {
		out = append(out,
			Statement{"outbox dead list, " + sel.name, h.d.WithSelectorIndex("dead_list", sel.where, sel.hint, 100), sel.args},
			Statement{"outbox dead retry, " + sel.name, h.d.WithSelectorIndex("dead_ids", sel.where, sel.hint, 0), sel.args})
	}
	return out
}
