package admin

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

type session struct {
	id, csrf, who string
	expires       time.Time
	flash         string // the result of the last change, shown once (guarded by sessions.mu)
}

// maxSessions bounds the live sessions; a login beyond it ends the oldest.
const maxSessions = 1000

// sessions holds the live sessions in memory: a restart logs everyone out.
type sessions struct {
	mu  sync.Mutex
	ttl time.Duration
	m   map[string]*session
}

func newSessions(ttl time.Duration) *sessions {
	return &sessions{ttl: ttl, m: map[string]*session{}}
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b)
}

func (s *sessions) create(who string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	for id, x := range s.m {
		if now.After(x.expires) {
			delete(s.m, id)
		}
	}
	if len(s.m) >= maxSessions { // drop the oldest
		var oldest *session
		for _, x := range s.m {
			if oldest == nil || x.expires.Before(oldest.expires) {
				oldest = x
			}
		}
		delete(s.m, oldest.id)
	}
	x := &session{id: randomToken(), csrf: randomToken(), who: who, expires: now.Add(s.ttl)}
	s.m[x.id] = x
	return x
}

func (s *sessions) get(id string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	x := s.m[id]
	if x == nil || time.Now().After(x.expires) {
		delete(s.m, id)
		return nil
	}
	return x
}

// setFlash keeps msg for the session's next page; takeFlash returns it
// once. The message never travels in a URL, so no link can put text of
// its choosing on the page.
func (s *sessions) setFlash(x *session, msg string) {
	s.mu.Lock()
	x.flash = msg
	s.mu.Unlock()
}

func (s *sessions) takeFlash(x *session) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	msg := x.flash
	x.flash = ""
	return msg
}

func (s *sessions) drop(id string) {
	s.mu.Lock()
	delete(s.m, id)
	s.mu.Unlock()
}

// equalSecret compares two secrets in constant time (of their hashes, so
// that not even the length leaks).
func equalSecret(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1
}

// clientKey is the request context's key of the client (ServeHTTP sets
// it from Config.TrustedProxies).
type clientKey struct{}

// client is who sent a request: its address and the scheme it used.
type client struct{ ip, scheme string }

// peerIP is the address of the connection's other end.
func peerIP(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

// remoteIP is the client's address: the one ServeHTTP took from
// X-Forwarded-For of a trusted proxy, else the connection's peer.
func remoteIP(r *http.Request) string {
	if c, ok := r.Context().Value(clientKey{}).(client); ok {
		return c.ip
	}
	return peerIP(r)
}

// trusted reports whether ip is one of Config.TrustedProxies.
func (h *Handler) trusted(ip string) bool {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return false
	}
	a = a.Unmap()
	for _, p := range h.trustedProxies {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// clientOf tells who sent r. From a peer that is not a trusted proxy, or
// without trusted proxies, it is the peer, and the scheme is https over
// TLS, else http. From a trusted proxy it is the right-most address of
// X-Forwarded-For that is not itself a trusted proxy (the left-most if
// all are; entries to its left are the client's to choose, so never
// believed), and the scheme is X-Forwarded-Proto's (http or https).
func (h *Handler) clientOf(r *http.Request) client {
	c := client{ip: peerIP(r), scheme: "http"}
	if r.TLS != nil {
		c.scheme = "https"
	}
	if !h.trusted(c.ip) {
		return c
	}
	var hops []string
	for _, v := range r.Header.Values("X-Forwarded-For") {
		for _, a := range strings.Split(v, ",") {
			hops = append(hops, strings.TrimSpace(a))
		}
	}
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(hops[i])
		if err != nil {
			break // a garbled list: believe nothing further left
		}
		c.ip = a.Unmap().String()
		if !h.trusted(c.ip) {
			break
		}
	}
	if p := strings.ToLower(strings.TrimSpace(strings.Split(r.Header.Get("X-Forwarded-Proto"), ",")[0])); p == "http" || p == "https" {
		c.scheme = p
	}
	return c
}

func (h *Handler) session(r *http.Request) *session {
	c, err := r.Cookie(h.cfg.CookieName)
	if err != nil {
		return nil
	}
	return h.auth.get(c.Value)
}

// hostAllowed reports whether the request's Host names this page
// (Config.AllowedHosts; any host when it is empty). A page on loopback
// that answered any Host could be reached by a DNS-rebinding page in the
// operator's browser.
func (h *Handler) hostAllowed(r *http.Request) bool {
	if len(h.cfg.AllowedHosts) == 0 {
		return true
	}
	host := r.Host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		host = hh
	}
	host = strings.Trim(host, "[]")
	for _, a := range h.cfg.AllowedHosts {
		if strings.EqualFold(a, host) {
			return true
		}
	}
	return false
}

// sameOrigin reports whether a state-changing request comes from this
// page: a browser's Sec-Fetch-Site, if sent, must be same-origin (or none:
// typed by the user), and an Origin header, if sent, must name this host
// and the scheme the request came by (https over TLS or from a trusted
// proxy saying so, else http; with Config.SecureCookie, which declares a
// TLS-terminating proxy in front, https too). Browsers send at least one
// of them on every cross-site POST. The scheme matters: a page served
// over https at the same host and port is another origin.
func (h *Handler) sameOrigin(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return false
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return false
		}
		scheme := "http"
		if c, ok := r.Context().Value(clientKey{}).(client); ok {
			scheme = c.scheme
		} else if r.TLS != nil {
			scheme = "https"
		}
		if u.Scheme != scheme && !(u.Scheme == "https" && h.cfg.SecureCookie) {
			return false
		}
	}
	return true
}

func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, why string) {
	h.audit.Info("admin request refused", "why", why, "method", r.Method, "path", r.URL.Path, "remote", remoteIP(r))
	http.Error(w, "forbidden: "+why, http.StatusForbidden)
}

// page wraps a GET handler: a request without a live session is sent to
// the login page.
func (h *Handler) page(fn func(w http.ResponseWriter, r *http.Request, s *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := h.session(r)
		if s == nil {
			if r.URL.Query().Get("fragment") != "" {
				http.Error(w, "session expired", http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, h.cfg.Prefix+"login", http.StatusSeeOther)
			return
		}
		if err := h.schemaReady(r.Context()); err != nil {
			h.log.Warn("admin page refused", "err", err)
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fn(w, r, s)
	}
}

// mutation wraps a POST handler: it needs a live session, the session's
// CSRF token in the form (field csrf), and a same-origin request.
func (h *Handler) mutation(fn func(w http.ResponseWriter, r *http.Request, s *session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		if !h.sameOrigin(r) {
			h.refuse(w, r, "cross-site request")
			return
		}
		s := h.session(r)
		if s == nil {
			h.refuse(w, r, "not logged in")
			return
		}
		if err := r.ParseForm(); err != nil {
			http.Error(w, "bad form", http.StatusBadRequest)
			return
		}
		if !equalSecret(r.PostForm.Get("csrf"), s.csrf) {
			h.refuse(w, r, "missing or wrong CSRF token")
			return
		}
		if err := h.schemaReady(r.Context()); err != nil && r.URL.Path != "/logout" {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fn(w, r, s)
	}
}

// Failed logins per client address (remoteIP: the connection's peer, or
// the client a trusted proxy names in X-Forwarded-For): after loginFailures within
// loginWindow, that address is answered 429 until the window ends, and
// the audit log records the first refusal only.
const (
	loginFailures = 10
	loginWindow   = time.Minute
)

type failures struct {
	mu sync.Mutex
	m  map[string]*failWindow
}

type failWindow struct {
	start time.Time
	n     int
}

// allow reports whether ip may try to log in, and whether this is the
// first refusal of its window (to be audited).
func (f *failures) allow(ip string, now time.Time) (ok, first bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := f.m[ip]
	if w == nil || now.Sub(w.start) > loginWindow {
		return true, false
	}
	return w.n < loginFailures, w.n == loginFailures
}

func (f *failures) fail(ip string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[string]*failWindow{}
	}
	if len(f.m) > 10_000 { // forget old windows rather than grow without bound
		for k, w := range f.m {
			if now.Sub(w.start) > loginWindow {
				delete(f.m, k)
			}
		}
	}
	w := f.m[ip]
	if w == nil || now.Sub(w.start) > loginWindow {
		w = &failWindow{start: now}
		f.m[ip] = w
	}
	w.n++
}

func (h *Handler) loginPage(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, "login", nil, map[string]any{"Next": r.URL.Query().Get("next")})
}

// login exchanges the token for a session cookie. The name typed beside
// it goes into the audit log as who acted.
func (h *Handler) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if !h.sameOrigin(r) {
		h.refuse(w, r, "cross-site login")
		return
	}
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	name := strings.TrimSpace(r.PostForm.Get("name"))
	if name == "" || len(name) > 100 || !utf8.ValidString(name) {
		w.WriteHeader(http.StatusBadRequest)
		h.render(w, r, "login", nil, map[string]any{"Error": "Type your name (for the audit log, at most 100 bytes) and the token."})
		return
	}
	ip, now := remoteIP(r), time.Now()
	if ok, first := h.logins.allow(ip, now); !ok {
		if first {
			h.audit.Info("admin logins throttled", "remote", ip, "failures", loginFailures, "window", loginWindow.String())
			h.logins.fail(ip, now) // past the limit: the next refusals are not audited
		}
		http.Error(w, "too many failed logins from this address; wait a minute", http.StatusTooManyRequests)
		return
	}
	if !equalSecret(r.PostForm.Get("token"), h.cfg.Token) {
		h.logins.fail(ip, now)
		h.audit.Info("admin login refused", "name", name, "remote", remoteIP(r))
		w.WriteHeader(http.StatusUnauthorized)
		h.render(w, r, "login", nil, map[string]any{"Error": "Wrong token."})
		return
	}
	s := h.auth.create(name)
	h.audit.Info("admin login", "who", name, "session", s.id[:8], "remote", remoteIP(r))
	// HttpOnly, SameSite=Strict, Path the Prefix, Secure over TLS (or
	// with Config.SecureCookie).
	http.SetCookie(w, &http.Cookie{Name: h.cfg.CookieName, Value: s.id, Path: h.cfg.Prefix, HttpOnly: true,
		Secure: r.TLS != nil || h.cfg.SecureCookie, SameSite: http.SameSiteStrictMode, Expires: s.expires})
	http.Redirect(w, r, h.cfg.Prefix, http.StatusSeeOther)
}

func (h *Handler) logout(w http.ResponseWriter, r *http.Request, s *session) {
	h.auth.drop(s.id)
	h.audit.Info("admin logout", "who", s.who, "session", s.id[:8], "remote", remoteIP(r))
	http.SetCookie(w, &http.Cookie{Name: h.cfg.CookieName, Value: "", Path: h.cfg.Prefix, MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, h.cfg.Prefix+"login", http.StatusSeeOther)
}

// who is the audit log's actor: the name given at login, the session's
// first characters and the remote address.
func (s *session) actor(r *http.Request) []any {
	return []any{"who", s.who, "session", s.id[:8], "remote", remoteIP(r)}
}
