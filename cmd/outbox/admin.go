package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sqloutbox/outbox/admin"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/inbox"
	"github.com/sqloutbox/outbox/relay"
)

// Environment variables of the admin page's token (never a flag value:
// a command line is visible to every user of the host).
const (
	envAdminToken     = "OUTBOX_ADMIN_TOKEN"
	envAdminTokenFile = "OUTBOX_ADMIN_TOKEN_FILE"
)

// defaultAdminListen binds the page to loopback: it changes production
// data, so reaching it from elsewhere is a decision (an SSH tunnel, or a
// reverse proxy with TLS in front of --admin-listen 0.0.0.0:8090).
const defaultAdminListen = "127.0.0.1:8090"

// adminFlags configure the admin page, served by `outbox admin` or beside
// a relay (`outbox relay --admin-listen`).
type adminFlags struct {
	listen       string
	tokenFile    string
	readOnly     bool
	hidePayloads bool
	inboxTables  []string
	endpoints    []string
	secureCookie bool
	trusted      []string
	inboxOnly    bool // set by runAdmin: no outbox table, --inbox-table given
	// wal names the WAL source's slot and publication the overview shows:
	// --wal-slot and --wal-publication of outbox admin, or the relay's own.
	wal relay.WALConfig
}

// register adds the flags; prefix is "" for `outbox admin` and "admin-"
// for the relay, whose --http is another listener.
func (f *adminFlags) register(fs *pflag.FlagSet, prefix, listenDefault string) {
	fs.StringVar(&f.listen, prefix+"listen", listenDefault, "listen address of the admin page (its own listener, never the metrics one); loopback by default: put a TLS proxy in front to reach it from elsewhere")
	fs.StringVar(&f.tokenFile, prefix+"token-file", "", "file holding the admin page's login token (at least 16 bytes; one trailing newline is ignored); or set "+envAdminToken)
	envFlag(fs, prefix+"token-file", envAdminTokenFile)
	fs.BoolVar(&f.readOnly, prefix+"read-only", false, "serve the admin page without any mutation (no retry, skip or retry request)")
	fs.BoolVar(&f.hidePayloads, prefix+"hide-payloads", false, "never show payloads or headers on the admin page (they may hold personal data)")
	fs.StringSliceVar(&f.inboxTables, prefix+"inbox-table", nil, "inbox table(s) whose parked and held messages the admin page shows, comma-separated (same database)")
	fs.StringSliceVar(&f.endpoints, prefix+"relay-endpoint", nil, "base URL of a relay's --http server (http://relay-1:9464), comma-separated or repeated: the admin page shows its broker and its /readyz")
	fs.BoolVar(&f.secureCookie, prefix+"secure-cookie", false, "mark the admin session cookie Secure (behind a TLS-terminating proxy; direct TLS requests always get it)")
	fs.StringSliceVar(&f.trusted, prefix+"trusted-proxy", nil, "address or CIDR prefix of a reverse proxy in front of the admin page, comma-separated or repeated: from it, the client's address is taken from X-Forwarded-For (login throttle, audit log) and the scheme from X-Forwarded-Proto")
}

// token reads the login token: --token-file or OUTBOX_ADMIN_TOKEN, one of
// them.
func (a *app) adminToken(f *adminFlags, flag string) (string, error) {
	env := a.getenv(envAdminToken)
	switch {
	case f.tokenFile != "" && env != "":
		return "", usageErrorf("give the admin token in --%s or %s, not both", flag, envAdminToken)
	case f.tokenFile != "":
		tok, err := readSecretFile(flag, f.tokenFile)
		if err != nil {
			return "", &exitError{code: exitRuntime, msg: err.Error()}
		}
		if len(tok) < admin.MinTokenBytes {
			return "", usageErrorf("the admin token in --%s has %d bytes, want at least %d (e.g. openssl rand -hex 24)", flag, len(tok), admin.MinTokenBytes)
		}
		return tok, nil
	case env != "":
		if len(env) < admin.MinTokenBytes {
			return "", usageErrorf("%s has %d bytes, want at least %d (e.g. openssl rand -hex 24)", envAdminToken, len(env), admin.MinTokenBytes)
		}
		return env, nil
	}
	return "", usageErrorf("the admin page needs a login token: --%s FILE or %s", flag, envAdminToken)
}

// adminServer is the admin page on its own listener.
type adminServer struct {
	srv  *http.Server
	ln   net.Listener
	h    *admin.Handler
	done chan error
}

// startAdmin listens on f.listen and serves the page for ob's table
// through db. It returns a usage error for a busy or bad address.
func (a *app) startAdmin(ctx context.Context, f *adminFlags, flag, token string, ob *driver.Outbox, db *sql.DB, log *slog.Logger, relays func() []admin.RelayStatus) (*adminServer, error) {
	host, port, err := net.SplitHostPort(f.listen)
	if err != nil {
		return nil, usageErrorf("--%s %q: want host:port, e.g. 127.0.0.1:8090", flag, f.listen)
	}
	cfg := admin.Config{Outbox: ob, DB: db, Token: token, InboxTables: f.inboxTables, ReadOnly: f.readOnly,
		HidePayloads: f.hidePayloads, SecureCookie: f.secureCookie, TrustedProxies: f.trusted, InboxOnly: f.inboxOnly, Relays: relays, RelayEndpoints: f.endpoints, Logger: log,
		WAL:   f.wal,
		Audit: log.With("component", "outbox.admin.audit"),
		// Cookies do not tell ports apart: one name per port.
		CookieName: "outbox_admin_" + port}
	if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
		// On loopback, only loopback names: a DNS-rebinding page in the
		// operator's browser names its own host.
		// The listen address itself too (127.0.0.2, [::1]): the page
		// answers to the address it was told to serve.
		cfg.AllowedHosts = []string{"127.0.0.1", "::1", "localhost"}
		if !slices.Contains(cfg.AllowedHosts, strings.ToLower(host)) {
			cfg.AllowedHosts = append(cfg.AllowedHosts, host)
		}
	}
	h, err := admin.New(cfg)
	if err != nil {
		return nil, usageErrorf("%v", err)
	}
	// Every inbox table must exist, so that a typo is told at start.
	for _, table := range f.inboxTables {
		in, err := inbox.New(inbox.Config{Dialect: ob.Config().Dialect, Table: table, Consumer: "outbox-admin"})
		if err != nil {
			return nil, usageErrorf("--inbox-table %q: %v", table, err)
		}
		if err := in.Check(ctx, db); err != nil {
			return nil, fmt.Errorf("--inbox-table %s: %w", table, err)
		}
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return nil, &exitError{code: exitRuntime, msg: fmt.Sprintf("cannot serve the admin page on %s (--%s): %v", f.listen, flag, err)}
	}
	s := &adminServer{h: h, ln: ln, done: make(chan error, 1),
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute, WriteTimeout: time.Minute}}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

func (s *adminServer) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.srv.Shutdown(ctx)
}

func (a *app) adminCmd() *cobra.Command {
	var f adminFlags
	cmd := &cobra.Command{
		Use:   "admin",
		Short: "Serve the web admin page: backlog, partitions, dead letters, lookups, consumers",
		Long: `Serve the web admin page for the outbox table named by --table: pending
rows and their age, partitions and their owners, relays' heartbeats, dead
letters (filter, inspect, retry or skip with a confirmation that lists the
exact rows), lookups by message ID or aggregate, and, with --inbox-table,
the consumers' parked and held messages (skip, or a retry request that the
consumer's runner serves). On a database with no outbox table (a consumer
service's own), --inbox-table serves the consumers page alone.

Security: the page listens on 127.0.0.1:8090 by default. Every page needs
a login: a name (for the audit log) and the token from --token-file or
OUTBOX_ADMIN_TOKEN, exchanged for an HttpOnly, SameSite=Strict session
cookie; every change needs that session, its CSRF token and a same-origin
request, and is written to the audit log on stderr (JSON, "component":
"outbox.admin.audit"). --read-only serves no change at all;
--hide-payloads never shows payloads or headers.

The page reads through a pool of 2 connections, with capped counts and
keyset pages; see docs/admin.md for what each view costs.`,
		Example: `  openssl rand -hex 24 > /run/secrets/outbox-admin
  OUTBOX_DSN=postgres://ops@db/app outbox admin --token-file /run/secrets/outbox-admin
  ssh -L 8090:127.0.0.1:8090 db-host   # then open http://127.0.0.1:8090/`,
		Args: cobra.NoArgs,
		RunE: a.wrap(func(cmd *cobra.Command, _ []string) error { return a.runAdmin(cmd, &f) }),
	}
	f.register(cmd.Flags(), "", defaultAdminListen)
	cmd.Flags().StringVar(&f.wal.Slot, "wal-slot", "", "PostgreSQL: the WAL source's replication slot the overview shows, if the relays name one (default outbox_<database>_<table>, the relays' default)")
	cmd.Flags().StringVar(&f.wal.Publication, "wal-publication", "", "PostgreSQL: the WAL source's publication the overview shows (default <table>_outbox_pub)")
	return cmd
}

func (a *app) runAdmin(cmd *cobra.Command, f *adminFlags) error {
	token, err := a.adminToken(f, "token-file")
	if err != nil {
		return err
	}
	t, err := parseDSN(a.dsn)
	if err != nil {
		return err
	}
	baseLog, log := a.logs(t)
	ob, err := driver.New(driver.Config{Dialect: t.dialect, Table: a.table})
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	sctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	_, db, err := a.open(sctx, true)
	if err != nil {
		return err
	}
	defer db.Close()
	if t.dialect != driver.SQLite {
		db.SetMaxOpenConns(2) // the page never starves the application
	}
	// A consumer service's own database has inbox tables and no outbox
	// table: with --inbox-table the page serves the consumers alone.
	inboxOnly := false
	if cur, _, err := driver.SchemaVersion(sctx, db, ob.Config()); err == nil && cur == 0 && len(f.inboxTables) > 0 {
		inboxOnly = true
		log.Info("no outbox table: serving the consumers page only", "table", a.table, "inbox_tables", f.inboxTables)
	} else if err := checkSchema(sctx, db, t, a.table, true); err != nil {
		return err
	}
	f.inboxOnly = inboxOnly
	s, err := a.startAdmin(sctx, f, "listen", token, ob, db, baseLog, nil)
	if err != nil {
		return err
	}
	defer s.stop()
	log.Info("serving the admin page", "addr", "http://"+s.ln.Addr().String()+"/", "dsn", redactDSN(a.dsn), "table", a.table,
		"read_only", f.readOnly, "hide_payloads", f.hidePayloads, "inbox_tables", f.inboxTables)
	bg, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = s.h.Run(bg, 10*time.Second) }()
	select {
	case <-ctx.Done():
		log.Info("shutting down")
		return nil
	case err := <-s.done:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("admin page on %s failed: %w", f.listen, err)
	}
}
