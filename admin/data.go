package admin

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/relay"
)

// Row statuses, as the outbox table stores them (docs/schema.md).
const (
	statusPending = 0
	statusSent    = 1
	statusDead    = 2
)

// member is a relay instance's heartbeat row.
type member struct {
	Instance, Mode string
	Left           time.Duration // negative: expired
}

// Expired is how long ago the row expired (0 if it has not).
func (m member) Expired() time.Duration { return max(0, -m.Left) }

type partitionRow struct {
	Partition     int
	Owner         string
	Epoch         int64
	LeaseLeft     time.Duration
	Backlog       int64
	OldestPending time.Duration
	HeldDead      int64
	Stuck         bool
	Why           string
}

// overviewData is one reading of the table, cached for Config.CacheFor.
type overviewData struct {
	At                          time.Time
	Pending, Dead, Held         int64
	Cap                         int64
	MinID, MaxID                int64
	SentEstimate                int64
	OldestPending               time.Duration
	SchemaVersion, SchemaLatest int
	PartitionCount              int
	Partitions                  []partitionRow
	BacklogCapped               bool
	Members                     []member
	Endpoints                   []endpointStatus
	Stuck                       int
	// WAL is the WAL source's slot and publication (PostgreSQL, when
	// either exists), WALError why they could not be read.
	WAL      *relay.WALStatus
	WALError string
}

// readOverview returns the cached reading, or reads the table again when
// it is older than CacheFor (always with force). Each reading is a
// throughput sample.
func (h *Handler) readOverview(ctx context.Context, force bool) (*overviewData, error) {
	// One reading at a time: the pages that ask meanwhile take its result.
	h.reading.Lock()
	defer h.reading.Unlock()
	h.mu.Lock()
	if !force && h.overview != nil && time.Since(h.at) < h.cfg.CacheFor {
		o := h.overview
		h.mu.Unlock()
		return o, nil
	}
	h.mu.Unlock()
	o, err := h.read(ctx)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.overview, h.at = o, time.Now()
	h.addSample(sample{At: o.At, MaxID: o.MaxID, Pending: o.Pending, Dead: o.Dead})
	return o, nil
}

// ErrSchemaOutdated is returned (wrapped) by the page's readings while
// the table is below the schema version this build knows: the dead
// letters' indexes (PostgreSQL 8 and 10, SQLite 7) may be missing, and
// the page would read the sent history. It is driver.ErrSchemaOutdated.
var ErrSchemaOutdated = driver.ErrSchemaOutdated

// schemaReady returns nil once the table is at the latest schema version
// (remembered), else an error wrapping ErrSchemaOutdated (checked again
// at the next call).
func (h *Handler) schemaReady(ctx context.Context) error {
	if h.schemaOK.Load() || h.cfg.InboxOnly {
		return nil
	}
	cur, latest, err := driver.SchemaVersion(ctx, h.cfg.DB, h.cfg.Outbox.Config())
	if err != nil {
		return err
	}
	if cur < latest {
		return fmt.Errorf("%w: table %s is at schema version %d, the admin page needs %d (its dead letters' indexes): run `outbox migrate apply` or Migrate",
			ErrSchemaOutdated, h.cfg.Outbox.Config().Table, cur, latest)
	}
	h.schemaOK.Store(true)
	return nil
}

func (h *Handler) read(ctx context.Context) (*overviewData, error) {
	if err := h.schemaReady(ctx); err != nil {
		return nil, err
	}
	db, capN := h.cfg.DB, int64(h.cfg.CountCap)
	o := &overviewData{At: time.Now(), Cap: capN}
	var ageUS int64
	if err := db.QueryRowContext(ctx, h.d.Bind(h.d.Query("admin_counts")), capN+1, capN+1, capN+1).Scan(
		&o.Pending, &o.Dead, &o.Held, &o.MinID, &o.MaxID, &ageUS); err != nil {
		return nil, fmt.Errorf("outbox admin: counting rows: %w", err)
	}
	o.OldestPending = time.Duration(ageUS) * time.Microsecond
	if o.MaxID > 0 {
		o.SentEstimate = max(0, o.MaxID-o.MinID+1-o.Pending-o.Dead)
	}
	cur, latest, err := driver.SchemaVersion(ctx, db, h.cfg.Outbox.Config())
	if err != nil {
		return nil, err
	}
	o.SchemaVersion, o.SchemaLatest = cur, latest
	if err := db.QueryRowContext(ctx, h.d.Query("partitions")).Scan(&o.PartitionCount); err != nil {
		return nil, fmt.Errorf("outbox admin: reading the partition count: %w", err)
	}
	parts := map[int]*partitionRow{}
	part := func(p int) *partitionRow {
		if parts[p] == nil {
			parts[p] = &partitionRow{Partition: p}
		}
		return parts[p]
	}
	for p := 0; p < o.PartitionCount && p < 4096; p++ {
		part(p)
	}
	var seen int64
	err = h.each(ctx, h.d.Bind(h.d.Query("admin_backlog")), []any{capN}, func(rows *sql.Rows) error {
		var p int
		var n, age int64
		if err := rows.Scan(&p, &n, &age); err != nil {
			return err
		}
		pr := part(p)
		pr.Backlog, pr.OldestPending = n, time.Duration(age)*time.Microsecond
		seen += n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox admin: reading the backlog: %w", err)
	}
	o.BacklogCapped = seen >= capN
	if err := h.each(ctx, h.d.Bind(h.d.Query("admin_held_partitions")), []any{capN}, func(rows *sql.Rows) error {
		var p int
		var n int64
		if err := rows.Scan(&p, &n); err != nil {
			return err
		}
		part(p).HeldDead = n
		return nil
	}); err != nil {
		return nil, fmt.Errorf("outbox admin: reading held dead letters: %w", err)
	}
	if err := h.each(ctx, h.d.Lease("lease_owners"), nil, func(rows *sql.Rows) error {
		var p int
		var owner string
		var epoch, leftMS int64
		if err := rows.Scan(&p, &owner, &epoch, &leftMS); err != nil {
			return err
		}
		pr := part(p)
		pr.Epoch = epoch
		if owner != "" && leftMS > 0 {
			pr.Owner, pr.LeaseLeft = owner, time.Duration(leftMS)*time.Millisecond
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("outbox admin: reading the leases: %w", err)
	}
	for _, pr := range parts {
		switch {
		case pr.HeldDead > 0:
			pr.Stuck, pr.Why = true, "a dead letter holds an aggregate"
		case pr.Backlog > 0 && pr.Owner == "":
			pr.Stuck, pr.Why = true, "pending rows and no relay owns it"
		case pr.Backlog > 0 && pr.OldestPending > h.cfg.StuckAfter:
			pr.Stuck, pr.Why = true, "oldest pending older than "+h.cfg.StuckAfter.String()
		}
		if pr.Stuck {
			o.Stuck++
		}
		o.Partitions = append(o.Partitions, *pr)
	}
	sort.Slice(o.Partitions, func(i, j int) bool { return o.Partitions[i].Partition < o.Partitions[j].Partition })
	if err := h.each(ctx, h.d.Query("admin_members"), nil, func(rows *sql.Rows) error {
		var m member
		var us int64
		if err := rows.Scan(&m.Instance, &m.Mode, &us); err != nil {
			return err
		}
		m.Left = time.Duration(us) * time.Microsecond
		o.Members = append(o.Members, m)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("outbox admin: reading the relays' heartbeats: %w", err)
	}
	o.Endpoints = h.readEndpoints(ctx)
	h.readWAL(ctx, o)
	return o, nil
}

// readWAL reads the WAL source's slot and publication into o on
// PostgreSQL; a failure is shown on the page, not returned (the rest of
// the overview stands).
func (h *Handler) readWAL(ctx context.Context, o *overviewData) {
	if h.cfg.Outbox.Config().Dialect != driver.Postgres {
		return
	}
	st, err := relay.ReadWALStatus(ctx, h.cfg.Outbox, h.cfg.DB, h.cfg.WAL)
	switch {
	case err != nil:
		h.log.Debug("outbox admin: reading the WAL source's slot failed (shown on the overview)", "error", err)
		o.WALError = err.Error()
	case st.SlotExists || st.PublicationExists:
		o.WAL = &st
	}
}

func (h *Handler) each(ctx context.Context, q string, args []any, fn func(*sql.Rows) error) error {
	rows, err := h.cfg.DB.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// event is one outbox row without its payload.
type event struct {
	ID                                    int64
	MessageID, AggregateType, AggregateID string
	EventType, Topic                      string
	Partition, Status, Attempts           int
	LastError                             string
	Held                                  bool
	Created, Updated, Sent                time.Time
}

// StatusName is the row's status as the page shows it.
func (e event) StatusName() string {
	switch e.Status {
	case statusPending:
		if e.Held {
			return "pending (retry scheduled)"
		}
		return "pending"
	case statusSent:
		return "sent"
	case statusDead:
		if e.Held {
			return "dead (holds its aggregate)"
		}
		return "dead (released)"
	}
	return fmt.Sprintf("status %d", e.Status)
}

// deadFilter is the dead-letter list's filter; every field is optional
// and they combine with AND.
type deadFilter struct {
	AggregateType, AggregateID, EventType, Error string
	OlderThan                                    time.Duration
	After                                        int64 // keyset: ids above this
}

// hint is the index a filter's listing reads: the aggregate's, when it
// names one, else the status's.
func (f deadFilter) hint() string {
	if f.AggregateType != "" && f.AggregateID != "" {
		return hintAggregate
	}
	return hintStatus
}

// where builds the filter from column names and placeholders only: what
// the user typed is always a bind argument.
func (h *Handler) where(f deadFilter, status int) (string, []any) {
	w := []string{fmt.Sprintf("status = %d", status)}
	var args []any
	add := func(cond string, a ...any) { w = append(w, cond); args = append(args, a...) }
	if f.AggregateType != "" {
		add("aggregate_type = ?", f.AggregateType)
	}
	if f.AggregateID != "" {
		add("aggregate_id = ?", f.AggregateID)
	}
	if f.EventType != "" {
		add("event_type = ?", f.EventType)
	}
	if f.Error != "" {
		add("last_error LIKE ? ESCAPE '!'", "%"+likeEscape(f.Error)+"%")
	}
	if f.OlderThan > 0 {
		add(h.d.Query("admin_older_than"), f.OlderThan.Microseconds())
	}
	if f.After > 0 {
		add("id > ?", f.After)
	}
	return strings.Join(w, " AND "), args
}

func likeEscape(s string) string {
	return strings.NewReplacer("!", "!!", "%", "!%", "_", "!_").Replace(s)
}

// Index hints of admin_events (MySQL/MariaDB: FORCE INDEX; the other
// dialects' planners pick the partial index by themselves).
const (
	hintNone      = ""
	hintStatus    = "index_status"
	hintAggregate = "index_aggregate"
)

// eventsSQL is admin_events with where, the hint and limit.
func (h *Handler) eventsSQL(where, hint string, limit int) string {
	return h.d.WithSelectorIndex("admin_events", where, hint, limit)
}

// events runs admin_events with where, args and the hint, at most limit
// rows.
func (h *Handler) events(ctx context.Context, where string, args []any, limit int, hint string) ([]event, error) {
	var out []event
	err := h.each(ctx, h.eventsSQL(where, hint, limit), args, func(rows *sql.Rows) error {
		var e event
		var held int
		var c, u, s int64
		if err := rows.Scan(&e.ID, &e.MessageID, &e.AggregateType, &e.AggregateID, &e.EventType, &e.Topic, &e.Partition,
			&e.Status, &e.Attempts, &e.LastError, &held, &c, &u, &s); err != nil {
			return err
		}
		e.Held = held == 1
		e.Created, e.Updated = time.UnixMicro(c).UTC(), time.UnixMicro(u).UTC()
		if s != 0 {
			e.Sent = time.UnixMicro(s).UTC()
		}
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox admin: reading events: %w", err)
	}
	return out, nil
}

// body is one row's content, as the detail view shows it.
type body struct {
	ContentType string
	Payload     []byte
	Headers     map[string]string
	HeadersRaw  string
}

func (h *Handler) body(ctx context.Context, id int64) (body, error) {
	var b body
	if err := h.cfg.DB.QueryRowContext(ctx, h.d.Bind(h.d.Query("admin_event_body")), id).Scan(&b.ContentType, &b.Payload, &b.HeadersRaw); err != nil {
		return b, fmt.Errorf("outbox admin: reading event %d: %w", id, err)
	}
	if b.HeadersRaw != "" {
		if err := json.Unmarshal([]byte(b.HeadersRaw), &b.Headers); err != nil {
			b.Headers = nil
		}
	}
	return b, nil
}

// aggregateIndex reports whether lookups by aggregate have an index.
func (h *Handler) aggregateIndex(ctx context.Context) (bool, error) {
	var n int
	if err := h.cfg.DB.QueryRowContext(ctx, h.d.Query("admin_aggregate_index")).Scan(&n); err != nil {
		return false, fmt.Errorf("outbox admin: looking for the aggregate index: %w", err)
	}
	return n > 0, nil
}

func inboxOf(d driver.Dialect, table, consumer string) (*inbox.Inbox, error) {
	return inbox.New(inbox.Config{Dialect: d, Table: table, Consumer: consumer})
}
