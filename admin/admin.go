package admin

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/dialect"
	"github.com/sqloutbox/outbox/relay"
)

// ErrInvalidConfig is returned (wrapped) by New for a Config it cannot
// serve: no Outbox or DB, a token shorter than MinTokenBytes, a bad
// Prefix or inbox table.
var ErrInvalidConfig = errors.New("outbox admin: invalid config")

// Defaults and limits of Config.
const (
	// DefaultPageSize is how many rows a listing shows per page.
	DefaultPageSize = 50
	// MaxPageSize is the largest PageSize, and the most rows one
	// confirmation lists and acts on (relay.MaxSelectorIDs, 500).
	MaxPageSize = relay.MaxSelectorIDs
	// DefaultCacheFor is how long a reading of the table is reused.
	DefaultCacheFor = 5 * time.Second
	// DefaultSessionTTL is a session's lifetime.
	DefaultSessionTTL = 12 * time.Hour
	// DefaultStuckAfter is the oldest-pending age that marks a partition
	// stuck: the seed article's alert ("oldest pending > 5 min").
	DefaultStuckAfter = 5 * time.Minute
	// DefaultCountCap bounds each count (pending, dead, held rows).
	DefaultCountCap = 100_000
	// MinTokenBytes is the shortest login token New accepts.
	MinTokenBytes = 16
)

// RelayStatus is what a relay running in this process reports to the
// page (Config.Relays): its instance ID, the broker it publishes to (the
// relay metrics' broker label: "kafka", "nats", "rabbitmq", "redis") and
// its readiness as /readyz reports it (relay.Relay.Ready: nil when ready).
type RelayStatus struct {
	Instance string
	Broker   string
	Ready    error
}

// Config configures the admin Handler.
type Config struct {
	// Outbox names the table and dialect (driver.Register's result, or
	// driver.New for a process that only administers). Required.
	Outbox *driver.Outbox
	// DB reaches the table. Required. Give the page a small pool of its
	// own (SetMaxOpenConns(2)) so that it can never starve the
	// application or the relay.
	DB *sql.DB
	// Token is the secret an operator types at login, exchanged for a
	// session cookie; at least MinTokenBytes bytes. Required: every page
	// needs a session, since payloads and error texts may hold personal
	// data. Read it from a file or the environment, never a command line.
	Token string
	// InboxTables are the inbox tables (inbox.Config.Table) whose parked
	// and held messages the Consumers page shows; nil: none.
	InboxTables []string
	// ReadOnly hides and refuses every mutation (retry, skip, requests).
	ReadOnly bool
	// HidePayloads never shows a payload or headers (they may hold
	// personal data); the rest of a row is shown.
	HidePayloads bool
	// Relays, if set, reports the relays running in this process (the
	// outbox command's relay mounts the page with its own); nil: the page
	// shows the relays' heartbeats from the table only.
	Relays func() []RelayStatus
	// RelayEndpoints are the base URLs of relays' HTTP servers (the
	// outbox command's --http address: "http://relay-1:9464"), asked for
	// /readyz (readiness) and /metrics (the broker label) at each reading,
	// 2 s at most each; nil: none. User information in a URL
	// ("http://ops:secret@relay-1:9464") is sent as HTTP basic
	// authentication, and the page shows and logs the URL with the
	// password replaced by "xxxxx" (url.URL.Redacted).
	RelayEndpoints []string
	// Audit receives one INFO record per mutation and per login or
	// refused request: who (the name given at login, the session and the
	// remote address), what, which rows and how many changed. Default:
	// Logger with "audit" set.
	Audit *slog.Logger
	// Logger receives errors; default slog.Default().
	Logger *slog.Logger
	// Prefix is the URL path the handler is mounted at, starting and
	// ending with "/" (default "/"); the handler strips it itself.
	Prefix string
	// SecureCookie sets the session cookie's Secure attribute even on a
	// plain-HTTP request (behind a TLS-terminating proxy). A request that
	// arrived over TLS always gets it.
	SecureCookie bool
	// PageSize is how many rows a listing shows per page: 1..MaxPageSize,
	// default DefaultPageSize.
	PageSize int
	// CacheFor is how long the overview's and partitions' figures are
	// reused before they are read again; default DefaultCacheFor.
	CacheFor time.Duration
	// CountCap bounds each count (pending, dead, held; the backlog per
	// partition reads the first CountCap pending rows): above it the page
	// shows "CountCap+". Default DefaultCountCap.
	CountCap int
	// AllowedHosts, if set, are the host names (without port) the page
	// answers to; a request naming another Host gets 421. The outbox
	// command sets 127.0.0.1, ::1 and localhost for a loopback listener,
	// so that a DNS-rebinding page cannot reach it. Empty: any host.
	AllowedHosts []string
	// CookieName is the session cookie's name; default
	// "outbox_admin_session". Cookies do not tell ports apart: two pages
	// on one host (outbox admin and a relay's) need different names, or
	// logging in to one logs out of the other.
	CookieName string
	// SessionTTL is a session's lifetime; default DefaultSessionTTL.
	SessionTTL time.Duration
	// StuckAfter is the oldest-pending age from which a partition is
	// marked stuck; default DefaultStuckAfter.
	StuckAfter time.Duration
	// TrustedProxies are the reverse proxies in front of the page, as
	// addresses ("10.0.0.5", "::1") or CIDR prefixes ("10.0.0.0/8"). From
	// a connection whose peer is one of them, the client's address (for
	// the login throttle and the audit log) is the right-most address of
	// X-Forwarded-For that is not a trusted proxy, and the scheme (for
	// the same-origin check) is X-Forwarded-Proto's. Nil: the peer is the
	// client, and the headers are ignored; behind a proxy every operator
	// then shares the proxy's login throttle (10 failed logins a minute).
	// A bad entry makes New return ErrInvalidConfig.
	TrustedProxies []string
	// InboxOnly serves the Consumers page alone, for a database without
	// an outbox table (a consumer service's own): no overview,
	// partitions, dead letters or lookups, and the outbox table is never
	// read. Outbox still names the dialect (driver.New with any table
	// name); InboxTables must name at least one table, else New returns
	// ErrInvalidConfig.
	InboxOnly bool
	// WAL names the WAL source's slot and publication (relay.SourceWAL)
	// when the relays give them; the zero value means the relay's
	// defaults (relay.SlotName, relay.PublicationName). On PostgreSQL the
	// overview shows the slot and the publication when either exists:
	// who reads the slot, its wal_status, and the WAL it keeps.
	WAL relay.WALConfig
}

// Handler is the admin page, an http.Handler. Create it with New.
type Handler struct {
	cfg    Config
	d      *dialect.Dialect
	dl     *relay.DeadLetters
	log    *slog.Logger
	audit  *slog.Logger
	mux    *http.ServeMux
	tmpl   map[string]*template.Template
	auth   *sessions
	logins failures

	reading  sync.Mutex // held while the table is read (readOverview)
	mu       sync.Mutex
	overview *overviewData
	at       time.Time
	samples  []sample
	requests map[string]*requestSeen // inbox retry requests this page recorded
	client   *http.Client
	schemaOK atomic.Bool // the table was seen at the latest schema version

	trustedProxies []netip.Prefix // Config.TrustedProxies
	endpointNames  []string       // Config.RelayEndpoints with passwords redacted
}

var cookieNameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// New validates cfg and returns the Handler. It does not touch the
// database. It returns ErrInvalidConfig (wrapped) for a bad cfg.
func New(cfg Config) (*Handler, error) {
	if cfg.Outbox == nil || cfg.DB == nil {
		return nil, fmt.Errorf("%w: Outbox and DB are required", ErrInvalidConfig)
	}
	if len(cfg.Token) < MinTokenBytes {
		return nil, fmt.Errorf("%w: the token must have at least %d bytes", ErrInvalidConfig, MinTokenBytes)
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "/"
	}
	if !strings.HasPrefix(cfg.Prefix, "/") || !strings.HasSuffix(cfg.Prefix, "/") || strings.ContainsAny(cfg.Prefix, "\"'<> ") {
		return nil, fmt.Errorf("%w: Prefix %q must start and end with /", ErrInvalidConfig, cfg.Prefix)
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = DefaultPageSize
	}
	if cfg.PageSize < 1 || cfg.PageSize > MaxPageSize {
		return nil, fmt.Errorf("%w: PageSize %d, want 1..%d", ErrInvalidConfig, cfg.PageSize, MaxPageSize)
	}
	if cfg.CacheFor <= 0 {
		cfg.CacheFor = DefaultCacheFor
	}
	if cfg.CountCap <= 0 {
		cfg.CountCap = DefaultCountCap
	}
	if cfg.CookieName == "" {
		cfg.CookieName = "outbox_admin_session"
	}
	if !cookieNameRE.MatchString(cfg.CookieName) {
		return nil, fmt.Errorf("%w: CookieName %q: letters, digits, _ and - only", ErrInvalidConfig, cfg.CookieName)
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.StuckAfter <= 0 {
		cfg.StuckAfter = DefaultStuckAfter
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Audit == nil {
		cfg.Audit = cfg.Logger.With("audit", true)
	}
	c := cfg.Outbox.Config()
	d, err := dialect.New(dialect.Name(c.Dialect), c.Table)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	dl, err := relay.NewDeadLetters(cfg.Outbox, cfg.DB)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	for _, u := range cfg.RelayEndpoints {
		if p, err := url.Parse(u); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return nil, fmt.Errorf("%w: relay endpoint %q: want http://host:port", ErrInvalidConfig, u)
		}
	}
	// The endpoints are copied (the caller's slice is left alone); a
	// password in one is used for the requests but never shown or logged:
	// the page and its logs name the endpoint by url.URL.Redacted.
	endpoints, names := make([]string, len(cfg.RelayEndpoints)), make([]string, len(cfg.RelayEndpoints))
	for i, u := range cfg.RelayEndpoints {
		endpoints[i] = strings.TrimSuffix(u, "/")
		p, _ := url.Parse(endpoints[i])
		names[i] = p.Redacted()
	}
	if cfg.RelayEndpoints != nil {
		cfg.RelayEndpoints = endpoints
	}
	if cfg.InboxOnly && len(cfg.InboxTables) == 0 {
		return nil, fmt.Errorf("%w: InboxOnly needs at least one inbox table", ErrInvalidConfig)
	}
	var trusted []netip.Prefix
	for _, p := range cfg.TrustedProxies {
		pfx, err := netip.ParsePrefix(p)
		if err != nil {
			a, aerr := netip.ParseAddr(p)
			if aerr != nil {
				return nil, fmt.Errorf("%w: trusted proxy %q: want an address or a CIDR prefix (10.0.0.0/8)", ErrInvalidConfig, p)
			}
			a = a.Unmap()
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
		trusted = append(trusted, pfx.Masked())
	}
	for _, t := range cfg.InboxTables {
		if _, err := inboxOf(c.Dialect, t, "check"); err != nil {
			return nil, fmt.Errorf("%w: inbox table %q: %w", ErrInvalidConfig, t, err)
		}
	}
	h := &Handler{cfg: cfg, d: d, dl: dl, log: cfg.Logger.With("component", "outbox.admin"),
		audit: cfg.Audit, auth: newSessions(cfg.SessionTTL), requests: map[string]*requestSeen{},
		client: &http.Client{Timeout: endpointTimeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	if h.tmpl, err = parseTemplates(); err != nil {
		return nil, err
	}
	h.trustedProxies, h.endpointNames = trusted, names
	h.routes()
	return h, nil
}

func (h *Handler) routes() {
	m := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServer(http.FS(static))))
	m.HandleFunc("GET /login", h.loginPage)
	m.HandleFunc("POST /login", h.login)
	m.HandleFunc("POST /logout", h.mutation(h.logout))
	if h.cfg.InboxOnly {
		// No outbox table: the consumers are the whole page.
		m.HandleFunc("GET /{$}", h.page(func(w http.ResponseWriter, r *http.Request, _ *session) {
			http.Redirect(w, r, h.cfg.Prefix+"inbox", http.StatusSeeOther)
		}))
	} else {
		m.HandleFunc("GET /{$}", h.page(h.overviewPage))
		m.HandleFunc("GET /partitions", h.page(h.partitionsPage))
		m.HandleFunc("GET /dead", h.page(h.deadPage))
		m.HandleFunc("GET /dead/{id}", h.page(h.deadDetail))
		m.HandleFunc("POST /dead/confirm", h.mutation(h.deadConfirm))
		m.HandleFunc("POST /dead/apply", h.mutation(h.deadApply))
		m.HandleFunc("GET /lookup", h.page(h.lookupPage))
		m.HandleFunc("POST /pending/confirm", h.mutation(h.pendingConfirm))
		m.HandleFunc("POST /pending/apply", h.mutation(h.pendingApply))
	}
	m.HandleFunc("GET /inbox", h.page(h.inboxPage))
	m.HandleFunc("POST /inbox/confirm", h.mutation(h.inboxConfirm))
	m.HandleFunc("POST /inbox/apply", h.mutation(h.inboxApply))
	h.mux = m
}

// ServeHTTP serves the page under Config.Prefix. Every response carries a
// Content-Security-Policy that allows only the page's own scripts and
// styles (no inline script, no other origin), and forbids framing.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	// same-origin, not no-referrer: under no-referrer a browser sends
	// "Origin: null" with the page's own form posts, which the
	// same-origin check must refuse (the browser test caught this).
	hd.Set("Referrer-Policy", "same-origin")
	hd.Set("Cache-Control", "no-store")
	r = r.WithContext(context.WithValue(r.Context(), clientKey{}, h.clientOf(r)))
	if !h.hostAllowed(r) {
		http.Error(w, "misdirected request: this page does not answer to that host name", http.StatusMisdirectedRequest)
		return
	}
	p := strings.TrimSuffix(h.cfg.Prefix, "/")
	if !strings.HasPrefix(r.URL.Path, p+"/") {
		http.NotFound(w, r)
		return
	}
	http.StripPrefix(p, h.mux).ServeHTTP(w, r)
}

// Run samples the overview's figures every interval (default 10 s when
// interval <= 0) until ctx ends, so that the throughput chart covers the
// time no page was open; without Run it is drawn from the samples that
// page views took. With Config.InboxOnly it samples nothing. It returns
// ctx's error.
func (h *Handler) Run(ctx context.Context, interval time.Duration) error {
	if h.cfg.InboxOnly {
		<-ctx.Done()
		return ctx.Err()
	}
	if interval <= 0 {
		interval = 10 * time.Second
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := h.readOverview(ctx, true); err != nil && ctx.Err() == nil {
			h.log.Warn("sampling the outbox table", "err", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
