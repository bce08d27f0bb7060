package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"

	"github.com/sqloutbox/outbox/admin"
	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/metrics"
	"github.com/sqloutbox/outbox/partition"
	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// relayFlags are the relay command's settings.
type relayFlags struct {
	admin        adminFlags
	brokers      []string
	topicPrefix  string
	partitions   int
	leaseTTL     time.Duration
	poll         time.Duration
	batchSize    int
	maxBatchSize int
	instanceID   string
	httpAddr     string
	checkEvery   time.Duration
	retention    time.Duration
	archive      bool
	drainTimeout time.Duration

	unhealthyAfter time.Duration
	stallTimeout   time.Duration
	progress       time.Duration

	maxAttempts      int
	retryInitial     time.Duration
	retryMax         time.Duration
	deadLetterPolicy string
	unroutableAfter  time.Duration

	source         string
	walSlot        string
	walPublication string
	logOnly        bool

	broker brokerFlags
	tls    tlsFlags
	kafka  kafkaFlags
}

// deadLetterPolicies are the values of --dead-letter-policy.
var deadLetterPolicies = map[string]relay.DeadLetterPolicy{"hold": relay.HoldAggregate, "skip": relay.SkipDead}

// parseDeadLetterPolicy returns the relay.DeadLetterPolicy named s (hold
// or skip, in any case); another value is a usage error.
func parseDeadLetterPolicy(s string) (relay.DeadLetterPolicy, error) {
	p, ok := deadLetterPolicies[strings.ToLower(s)]
	if !ok {
		return 0, usageErrorf("invalid --dead-letter-policy %q: want hold or skip", s)
	}
	return p, nil
}

func (a *app) relayCmd() *cobra.Command {
	var f relayFlags
	cmd := &cobra.Command{
		Use:   "relay",
		Short: "Run the standalone relay service: publish committed events to Kafka, NATS, RabbitMQ or Redis",
		Long: `Run the relay as a service: claim committed outbox rows of the partitions
this instance leases, publish them to the broker in order per aggregate, mark
them sent, and retry or dead-letter failures. Run one in every replica: instances
share the table's relay partitions through leases. On PostgreSQL it also
LISTENs for the commit notifications of the outbox driver, so other
processes' commits wake it at once; elsewhere it polls adaptively.

A failed publish is retried after --retry-initial, the delay doubling per
attempt up to --retry-max (each delay jittered by 20%), until the message
has been tried --max-attempts times; then, or at once on a permanent error
(a message the broker can never take, such as one too large), it is
dead-lettered (status failed; see 'outbox dead'). Errors of the route or
the broker as a whole (unreachable, authorization, unknown topic) count no
attempt: the relay backs off and tries again. An event whose route is never
created (a mistyped topic) stays pending until an operator dead-letters it
('outbox pending dead'), or, with --dead-letter-unroutable-after D,
is dead-lettered once its route has been refused for D while the broker
took other routes. --dead-letter-policy says what a dead letter does to its
aggregate's later events: hold (the default) keeps them pending until the
dead letter is retried or skipped ('outbox dead retry', 'outbox dead
skip'): strict order; skip lets them go on, so consumers see a gap, and a
dead letter retried later arrives after them.

It also deletes sent rows older than --retention (moving them to
<table>_archive with --archive), in small batches.

--source wal (PostgreSQL, wal_level = logical, a role with REPLICATION)
reads the table's inserts from a logical replication slot (--wal-slot,
created at the first start with its publication) and publishes them
without a claim query; the table stays the source of truth, and the relay
claims from it at start, after any gap in the stream, for retries and
held aggregates, and every --poll. One relay reads the slot; the others
stand by and claim their partitions from the table, and take the slot
over when its reader stops (or terminate a reader whose relay's
membership expired). 'outbox wal status' shows the slot and the WAL it
keeps; 'outbox wal drop' removes it when the relay is retired
(docs/wal.md). With writers in the log-only mode (driver.Config.LogOnly:
events written to the WAL only), add --log-only: the relay then records
the slot's position and reports a slot dropped or invalidated while it
held events ('outbox wal ack-loss').

The relay partition count is read from the table (stored by 'migrate apply';
only relay.Repartition changes it). --partitions, if given, asserts it: the
relay refuses to start when it differs. While running, the relay checks at
every lease heartbeat that the lease table matches the stored count and,
every --partition-check, that no pending row sits in a partition no relay
can own; a mismatch is logged (ERROR), exported as
outbox_relay_partition_mismatch and makes /readyz fail.

The broker is chosen by the scheme of --broker (or OUTBOX_BROKER):
  kafka://host1:9092,host2:9092     Kafka (the same as --brokers host1:9092,...)
  nats://host:4222[,host2:4222]     NATS JetStream; tls://... over TLS
  amqp://user@host:5672/vhost       RabbitMQ; amqps://... over TLS
  redis://user@host:6379/0          Redis Streams; rediss://... over TLS
--brokers (OUTBOX_BROKERS) stays Kafka's flag; giving it and --broker is a
usage error. Where an event goes unless it names its own topic:
  Kafka     topic --topic-prefix + aggregate type
  NATS      subject --topic-prefix + aggregate type + "." + the aggregate
            ID as one subject token (natspub.SubjectToken); bind a stream
            to "<prefix><type>.>"
  RabbitMQ  exchange --exchange (default outbox.event, which must exist),
            routing key <aggregate type>.<aggregate ID token>;
            --topic-prefix does not apply
  Redis     stream --topic-prefix + aggregate type
--topic-prefix defaults to outbox.event., each package's default.

Credentials. A password (or a NATS token) inside --broker given on the
command line is refused: the command line is visible to every user of the
host. Put the whole URL in OUTBOX_BROKER, or the user in the URL and the
password in --broker-password-file or OUTBOX_BROKER_PASSWORD (NATS without
a user: the token). NATS also takes --nats-creds-file or --nats-nkey-file.
Kafka: --sasl-mechanism (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) with
--sasl-user and the password from --sasl-password-file or the
OUTBOX_SASL_PASSWORD variable (never a flag), --client-id, --kafka-version
and --compression. Flags of another broker than the chosen one are usage
errors. URLs are logged with their password redacted, and broker passwords
(3 bytes or longer) are scrubbed from every message.

TLS, for every broker: --tls, --tls-ca-file, --tls-cert-file and
--tls-key-file (mutual TLS), --tls-server-name, --tls-insecure-skip-verify
(tests only). For Kafka they switch TLS on; for the others the scheme does
(tls://, amqps://, rediss://) and the flags configure it: a --tls flag with
nats://, amqp:// or redis:// is a usage error.

Every flag has an OUTBOX_* variable (shown in its help); a flag given wins
over its variable.

HTTP (--http, default :9464; give each relay on a host its own port):
  /metrics  Prometheus metrics; outbox_relay_up follows readiness (1 ready, 0 not).
            The relay's series (outbox_published_total, outbox_relay_up, ...)
            carry broker="kafka", "nats", "rabbitmq" or "redis".
  /livez    liveness: 200 unless the relay loop is stuck in one cycle for
            longer than --stall-timeout (then 503). It never fails because
            the database or the broker is down: restarting would not help.
            /healthz is the same check.
  /readyz   readiness: 200 while the relay runs, its database and broker
            answer (Kafka: a metadata request; NATS: a JetStream account
            info; RabbitMQ: a passive declare of the exchange; Redis:
            PING) and its cycles succeed; 503 with the reason once one of
            them has been failing for longer than --unhealthy-after, while
            the loop is stuck (see /livez), when a partition mismatch is
            detected, and while starting or stopping.

While it has work, the relay logs a progress line every --progress
(published since the last line, backlog, oldest pending age); idle, it is
silent.

SIGTERM or SIGINT stops it cleanly: no new claims, the in-flight batch is
given --drain-timeout to finish and record its outcomes, then the publisher
and the HTTP server are closed. It exits 1 if the database, the schema or
the broker are unusable at start (the message names the broker, its
password redacted).`,
		Example: `  OUTBOX_DSN=postgres://relay:secret@db:5432/app outbox relay --brokers kafka-1:9092,kafka-2:9092
  outbox relay --broker nats://nats-1:4222,nats-2:4222 --nats-creds-file /run/secrets/relay.creds
  OUTBOX_BROKER=amqps://relay:secret@rabbit:5671/prod outbox relay --exchange orders --tls-ca-file ca.pem
  OUTBOX_BROKER_PASSWORD_FILE=/run/secrets/redis outbox relay --broker rediss://relay@redis:6380/0
  outbox relay --brokers kafka:9092 --max-attempts 10 --retry-max 1m --dead-letter-policy skip`,
		Args: cobra.NoArgs,
		RunE: a.wrap(func(cmd *cobra.Command, _ []string) error {
			return a.runRelay(cmd.Context(), &f, cmd.Flags().Changed)
		}),
	}
	fs := cmd.Flags()
	f.broker.register(fs)
	fs.StringSliceVar(&f.brokers, "brokers", nil, "Kafka bootstrap brokers, host:port, comma-separated: the same as --broker kafka://host:port,...; not with --broker")
	envFlag(fs, "brokers", "OUTBOX_BROKERS")
	fs.StringVar(&f.topicPrefix, "topic-prefix", kafka.DefaultTopicPrefix, "Kafka topic, NATS subject or Redis stream of an event without its own topic: this prefix + its aggregate type (NATS: then . and the aggregate ID token); not for RabbitMQ (see --exchange)")
	envFlag(fs, "topic-prefix", "OUTBOX_TOPIC_PREFIX")
	fs.IntVar(&f.partitions, "partitions", 0, "expected relay partition count: refuse to start if the table stores another (default: the stored count)")
	envFlag(fs, "partitions", "OUTBOX_PARTITIONS")
	fs.DurationVar(&f.leaseTTL, "lease-ttl", relay.DefaultLeaseTTL, "partition lease lifetime: a dead instance's partitions are taken over after about this long")
	envFlag(fs, "lease-ttl", "OUTBOX_LEASE_TTL")
	fs.DurationVar(&f.poll, "poll", relay.DefaultPollInterval, "fallback poll interval when idle")
	envFlag(fs, "poll", "OUTBOX_POLL")
	fs.IntVar(&f.batchSize, "batch-size", relay.DefaultBatchSize, "most messages claimed and published per cycle")
	envFlag(fs, "batch-size", "OUTBOX_BATCH_SIZE")
	fs.IntVar(&f.maxBatchSize, "max-batch-size", 0, "most messages per cycle under a backlog (default 4 x --batch-size)")
	envFlag(fs, "max-batch-size", "OUTBOX_MAX_BATCH_SIZE")
	fs.StringVar(&f.instanceID, "instance-id", "", "this instance's name in the lease table (default host-pid-random)")
	envFlag(fs, "instance-id", "OUTBOX_INSTANCE_ID")
	f.admin.register(fs, "admin-", "")
	fs.StringVar(&f.httpAddr, "http", ":9464", "listen address of /metrics, /livez (/healthz) and /readyz; every relay on a host needs its own; empty disables")
	envFlag(fs, "http", "OUTBOX_HTTP")
	fs.DurationVar(&f.checkEvery, "partition-check", relay.DefaultPartitionCheckInterval, "how often to look for pending rows in partitions no relay can own")
	envFlag(fs, "partition-check", "OUTBOX_PARTITION_CHECK")
	fs.DurationVar(&f.retention, "retention", relay.DefaultRetention, "delete sent rows older than this; 0 disables")
	envFlag(fs, "retention", "OUTBOX_RETENTION")
	fs.BoolVar(&f.archive, "archive", false, "move expired sent rows to <table>_archive instead of deleting them")
	envFlag(fs, "archive", "OUTBOX_ARCHIVE")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", 30*time.Second, "on shutdown, how long the in-flight batch may take to finish")
	envFlag(fs, "drain-timeout", "OUTBOX_DRAIN_TIMEOUT")
	fs.DurationVar(&f.unhealthyAfter, "unhealthy-after", relay.DefaultUnhealthyAfter, "readiness grace: /readyz fails once the database, the brokers or the relay's cycles have failed for longer than this without a success")
	envFlag(fs, "unhealthy-after", "OUTBOX_UNHEALTHY_AFTER")
	fs.DurationVar(&f.stallTimeout, "stall-timeout", relay.DefaultStallTimeout, "liveness bound: /livez fails once one relay cycle has run longer than this")
	envFlag(fs, "stall-timeout", "OUTBOX_STALL_TIMEOUT")
	fs.DurationVar(&f.progress, "progress", relay.DefaultProgressInterval, "interval of the progress log line while there is work; 0 disables it")
	envFlag(fs, "progress", "OUTBOX_PROGRESS")
	fs.IntVar(&f.maxAttempts, "max-attempts", relay.DefaultMaxAttempts, "tries of one message, the first included, before it is dead-lettered (a permanent error dead-letters it at once)")
	envFlag(fs, "max-attempts", "OUTBOX_MAX_ATTEMPTS")
	fs.DurationVar(&f.retryInitial, "retry-initial", relay.DefaultRetryInitial, "delay before a failed message's first retry; it doubles per attempt, up to --retry-max, each delay jittered by 20%")
	envFlag(fs, "retry-initial", "OUTBOX_RETRY_INITIAL")
	fs.DurationVar(&f.retryMax, "retry-max", relay.DefaultRetryMax, "longest retry delay (before jitter); at least --retry-initial")
	envFlag(fs, "retry-max", "OUTBOX_RETRY_MAX")
	fs.StringVar(&f.deadLetterPolicy, "dead-letter-policy", "hold", "what a dead letter does to its aggregate's later events: hold (keep them pending until it is retried or skipped: strict order) or skip (let them go on: consumers see a gap)")
	envFlag(fs, "dead-letter-policy", "OUTBOX_DEAD_LETTER_POLICY")
	fs.DurationVar(&f.unroutableAfter, "dead-letter-unroutable-after", 0, "dead-letter an event whose route (topic, subject, exchange) the broker has refused for this long while it took other routes; 0 keeps such events pending for an operator")
	envFlag(fs, "dead-letter-unroutable-after", "OUTBOX_DEAD_LETTER_UNROUTABLE_AFTER")
	fs.StringVar(&f.source, "source", "table", "where the relay learns of committed events: table (claim from the table) or wal (PostgreSQL: read the table's inserts from a logical replication slot, claiming from the table whenever the stream cannot vouch for a row; needs wal_level = logical and a role with REPLICATION; see docs/wal.md)")
	envFlag(fs, "source", "OUTBOX_SOURCE")
	fs.StringVar(&f.walSlot, "wal-slot", "", "with --source wal: the replication slot's name (default outbox_<database>_<table>); drop it with 'outbox wal drop' when the relay is retired")
	envFlag(fs, "wal-slot", "OUTBOX_WAL_SLOT")
	fs.StringVar(&f.walPublication, "wal-publication", "", "with --source wal: the publication the slot reads (default <table>_outbox_pub)")
	envFlag(fs, "wal-publication", "OUTBOX_WAL_PUBLICATION")
	fs.BoolVar(&f.logOnly, "log-only", false, "with --source wal: the writers use the log-only mode (driver.Config.LogOnly): keep the slot's position in <table>_wal_log and report a slot lost with events in it (not ready until 'outbox wal ack-loss')")
	envFlag(fs, "log-only", "OUTBOX_LOG_ONLY")
	f.tls.register(fs)
	f.kafka.register(fs)
	return cmd
}

// nopPublisher only exists to validate a relay.Config before connecting
// to the brokers.
type nopPublisher struct{}

func (nopPublisher) Publish(context.Context, []relay.Message) error { return nil }

// runRelay runs the relay service until ctx ends; changed reports the
// flags given (on the command line or through their variables).
func (a *app) runRelay(ctx context.Context, f *relayFlags, changed func(string) bool) error {
	// Usage checks first: they need neither the database nor the brokers.
	plan, err := a.brokerPlan(f, changed)
	if err != nil {
		return err
	}
	switch {
	case f.batchSize < 1:
		return usageErrorf("--batch-size must be at least 1, got %d", f.batchSize)
	case f.maxBatchSize != 0 && f.maxBatchSize < f.batchSize:
		return usageErrorf("--max-batch-size must be at least --batch-size (%d), got %d", f.batchSize, f.maxBatchSize)
	case f.partitions < 0 || f.partitions > partition.MaxCount:
		return usageErrorf("--partitions must be 1..%d, or 0 for the stored count, got %d", partition.MaxCount, f.partitions)
	case f.poll <= 0 || f.leaseTTL <= 0 || f.drainTimeout <= 0 || f.checkEvery <= 0:
		return usageErrorf("--poll, --lease-ttl, --drain-timeout and --partition-check must be positive")
	case f.retention < 0:
		return usageErrorf("--retention must be positive, or 0 to disable it")
	case f.unhealthyAfter <= 0 || f.stallTimeout <= 0:
		return usageErrorf("--unhealthy-after and --stall-timeout must be positive")
	case f.stallTimeout <= relay.DefaultPublishTimeout:
		return usageErrorf("--stall-timeout must exceed the publish timeout (%s), got %s", relay.DefaultPublishTimeout, f.stallTimeout)
	case f.progress < 0:
		return usageErrorf("--progress must be positive, or 0 to disable it")
	case f.maxAttempts < 1:
		return usageErrorf("--max-attempts must be at least 1, got %d", f.maxAttempts)
	case f.unroutableAfter < 0:
		return usageErrorf("--dead-letter-unroutable-after must be positive, or 0 to keep unroutable events pending")
	case f.retryInitial <= 0 || f.retryMax <= 0:
		return usageErrorf("--retry-initial and --retry-max must be positive")
	case f.retryMax < f.retryInitial:
		shown := f.retryMax.String()
		if !changed("retry-max") {
			shown += ", the default"
		}
		return usageErrorf("--retry-max (%s) must be at least --retry-initial (%s)", shown, f.retryInitial)
	}
	policy, err := parseDeadLetterPolicy(f.deadLetterPolicy)
	if err != nil {
		return err
	}
	source, err := relay.ParseSource(f.source)
	if err != nil {
		return usageErrorf("--source must be table or wal, got %q", f.source)
	}
	if source != relay.SourceWAL {
		for _, name := range []string{"wal-slot", "wal-publication", "log-only"} {
			if changed(name) {
				return usageErrorf("--%s configures --source wal", name)
			}
		}
	}
	var adminToken string
	if f.admin.listen != "" {
		if adminToken, err = a.adminToken(&f.admin, "admin-token-file"); err != nil {
			return err
		}
	} else {
		for _, name := range []string{"admin-token-file", "admin-read-only", "admin-hide-payloads", "admin-inbox-table", "admin-relay-endpoint", "admin-secure-cookie", "admin-trusted-proxy"} {
			if changed(name) {
				return usageErrorf("--%s configures the admin page, which only --admin-listen serves", name)
			}
		}
	}
	t, err := parseDSN(a.dsn)
	if err != nil {
		return err
	}
	baseLog, log := a.logs(t)
	// The table, described without touching the database: relay,
	// retention, metrics and NOTIFY listener are all built from it.
	ob, err := driver.New(driver.Config{Dialect: t.dialect, Table: a.table, Partitions: f.partitions, LogOnly: f.logOnly})
	if err != nil {
		return err
	}
	if source == relay.SourceWAL && t.dialect != driver.Postgres {
		return usageErrorf("--source wal needs PostgreSQL (its logical replication); %s relays claim from the table", t.dialect)
	}
	progress := f.progress
	if progress == 0 {
		progress = -1 // relay.Config: negative disables
	}
	cfg := relay.Config{
		Publisher:                 nopPublisher{},
		UnhealthyAfter:            f.unhealthyAfter,
		StallTimeout:              f.stallTimeout,
		ProgressInterval:          progress,
		PollInterval:              f.poll,
		BatchSize:                 f.batchSize,
		MaxBatchSize:              f.maxBatchSize,
		PartitionCheckInterval:    f.checkEvery,
		LeaseTTL:                  f.leaseTTL,
		InstanceID:                f.instanceID,
		MaxAttempts:               f.maxAttempts,
		RetryInitial:              f.retryInitial,
		RetryMax:                  f.retryMax,
		DeadLetterPolicy:          policy,
		DeadLetterUnroutableAfter: f.unroutableAfter,
		Logger:                    baseLog, // logs dead letters, unavailable routes and the error ending Run at ERROR itself
	}
	if source == relay.SourceWAL {
		cfg.Source = source
		cfg.WAL = relay.WALConfig{DSN: t.raw, Slot: f.walSlot, Publication: f.walPublication}
	}
	if cfg.PollInterval > 0 && cfg.PollInterval < relay.DefaultMinPollInterval {
		cfg.MinPollInterval = cfg.PollInterval
	}
	// Validate the settings before connecting anywhere: New and
	// NewRetention only store the *sql.DB.
	probe := new(sql.DB)
	if _, err := relay.New(ob, probe, cfg); err != nil {
		return err // ErrInvalidConfig: exit 2
	}
	var ret relay.RetentionConfig
	if f.retention > 0 {
		ret = relay.RetentionConfig{After: f.retention, Archive: f.archive, Logger: baseLog}
		if _, err := relay.NewRetention(ob, probe, ret); err != nil {
			return err
		}
	}

	// The HTTP port first: a busy one is the usual mistake of a second
	// relay on the host, and needs neither the database nor the brokers.
	var ln net.Listener
	if f.httpAddr != "" {
		if ln, err = net.Listen("tcp", f.httpAddr); err != nil {
			return fmt.Errorf("cannot serve HTTP on %s (--http or OUTBOX_HTTP; give every relay on a host its own port, e.g. --http :9465, or --http '' to disable): %w", f.httpAddr, err)
		}
		defer ln.Close() // until the server owns it
	}

	// Start-up checks, bounded by --timeout.
	sctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	_, db, err := a.open(sctx, true)
	if err != nil {
		return err
	}
	defer db.Close()
	if t.dialect != driver.SQLite {
		db.SetMaxOpenConns(5) // relay 2 and its health ping 1, stats scrape 1, retention 1
	}
	// The admin page needs the latest version (its dead letters' index);
	// a relay alone, the version writers and relays need.
	if err := checkSchema(sctx, db, t, a.table, f.admin.listen != ""); err != nil {
		return err
	}
	parts, err := ob.PartitionCount(sctx, db)
	if err != nil {
		return err // ErrPartitionMismatch with --partitions: exit 1
	}
	bc, err := a.connectBroker(sctx, plan, a.timeout, log)
	if err != nil {
		return err
	}
	var closePub sync.Once
	closePublisher := func() {
		closePub.Do(func() {
			if err := bc.close(); err != nil {
				log.Warn("closing the "+plan.kind.title()+" publisher", "error", a.redact(err.Error()))
			}
		})
	}
	defer closePublisher()

	reg := prometheus.NewRegistry()
	// The relay metrics carry broker="kafka" (or nats, rabbitmq, redis);
	// the table statistics and the process's do not depend on it.
	rm, err := metrics.NewRelayMetrics(prometheus.WrapRegistererWith(prometheus.Labels{"broker": string(plan.kind)}, reg), ob)
	if err != nil {
		return err
	}
	if err := reg.Register(metrics.NewStatsCollector(ob, db, 0)); err != nil {
		return err
	}
	if err := reg.Register(collectors.NewGoCollector()); err != nil {
		return err
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return err
	}
	var stopping atomic.Bool
	cfg.Observer = rm
	cfg.Publisher = bc.pub // its Healthy (relay.HealthChecker) feeds /readyz
	r, err := relay.New(ob, db, cfg)
	if err != nil {
		return err
	}
	ready := func() error {
		if stopping.Load() {
			return errors.New("shutting down")
		}
		return r.Ready()
	}
	if f.admin.listen != "" {
		// The page's own pool: it never takes the relay's connections.
		_, adb, err := a.open(sctx, true)
		if err != nil {
			return err
		}
		defer adb.Close()
		if t.dialect != driver.SQLite {
			adb.SetMaxOpenConns(2)
		}
		f.admin.wal = relay.WALConfig{Slot: f.walSlot, Publication: f.walPublication}
		as, err := a.startAdmin(sctx, &f.admin, "admin-listen", adminToken, ob, adb, baseLog, func() []admin.RelayStatus {
			return []admin.RelayStatus{{Instance: r.InstanceID(), Broker: string(plan.kind), Ready: ready()}}
		})
		if err != nil {
			return err
		}
		defer as.stop()
		sampleCtx, stopSampling := context.WithCancel(ctx)
		defer stopSampling()
		go func() { _ = as.h.Run(sampleCtx, 10*time.Second) }() // the throughput chart's readings
		log.Info("serving the admin page", "addr", "http://"+as.ln.Addr().String()+"/", "read_only", f.admin.readOnly)
	}
	var rt *relay.Retention
	if f.retention > 0 {
		if rt, err = relay.NewRetention(ob, db, ret); err != nil {
			return err
		}
	}

	var srv *http.Server
	srvDone := make(chan error, 1)
	if ln != nil {
		srv = &http.Server{Handler: httpHandler(reg, ready, r.Live), ReadHeaderTimeout: 10 * time.Second}
		go func() { srvDone <- srv.Serve(ln) }()
		log.Info("serving HTTP", "addr", ln.Addr().String(), "paths", "/metrics /livez /healthz /readyz")
	}

	// Never a password: not the broker's, nor the DSN's.
	attrs := append([]any{"dsn", redactDSN(a.dsn), "dialect", t.dialect, "table", a.table}, bc.attrs...)
	attrs = append(attrs, "partitions", parts, "retention", f.retention.String(), "archive", f.archive,
		"unhealthy_after", f.unhealthyAfter.String(), "stall_timeout", f.stallTimeout.String(),
		"max_attempts", f.maxAttempts, "retry_initial", f.retryInitial.String(), "retry_max", f.retryMax.String(),
		"dead_letter_policy", strings.ToLower(f.deadLetterPolicy), "dead_letter_unroutable_after", f.unroutableAfter.String())
	log.Info("starting relay", attrs...)

	// Background work ends with bg; the relay itself is stopped with Stop.
	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBG()
	var wg sync.WaitGroup
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(bg) }()
	if t.dialect == driver.Postgres {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = relay.ListenPostgres(bg, ob, t.raw, r.Notify, baseLog)
		}()
	}
	if rt != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = rt.Run(bg)
		}()
	}

	var result error
	select {
	case <-ctx.Done():
		restoreSignals(ctx) // a second signal kills at once
		log.Info("shutting down", "drain_timeout", f.drainTimeout.String())
		stopping.Store(true)
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.drainTimeout)
		if err := r.Stop(dctx); err != nil {
			log.Warn("the in-flight batch did not finish within --drain-timeout; its rows stay pending and will be re-sent", "error", err)
		}
		cancel()
		if err := <-runErr; err != nil {
			result = err
		}
	case err := <-runErr:
		// Run returns by itself only when the database cannot be relayed from.
		if err == nil {
			err = errors.New("relay stopped unexpectedly")
		}
		result = err
	case err := <-srvDone:
		result = fmt.Errorf("HTTP server on %s failed: %w", f.httpAddr, err)
		_ = r.Stop(context.Background())
		<-runErr
	}
	stopBG()
	wg.Wait()
	closePublisher()
	if srv != nil {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = srv.Shutdown(sctx)
		cancel()
	}
	if result != nil {
		log.Error("relay failed", "error", a.redact(result.Error()))
		return result
	}
	log.Info("relay stopped cleanly")
	return nil
}

// httpHandler serves /metrics from reg, /livez and /healthz from live and
// /readyz from ready (nil: 200; otherwise 503 with the error, one line).
func httpHandler(reg *prometheus.Registry, ready, live func() error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	liveness := func(w http.ResponseWriter, _ *http.Request) {
		if err := live(); err != nil {
			http.Error(w, "not live: "+oneLine(err.Error()), http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprintln(w, "ok")
	}
	mux.HandleFunc("/livez", liveness)
	mux.HandleFunc("/healthz", liveness)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+oneLine(err.Error()), http.StatusServiceUnavailable)
			return
		}
		_, _ = fmt.Fprintln(w, "ready")
	})
	return mux
}

// logs returns the command's JSON logger on stderr (the library's
// loggers add their own component attribute) and the command's own, with
// component outbox.cmd; on MySQL/MariaDB the driver's log goes there too.
// Durations are logged in one form, time.Duration.String ("1.5s"), also
// those a library logs as a time.Duration value.
func (a *app) logs(t *target) (base, cmd *slog.Logger) {
	base = newJSONLog(a.stderr, a.redact)
	if t.dialect == driver.MySQL {
		routeMySQLLog(base)
	}
	return base, base.With("component", "outbox.cmd")
}

// newJSONLog returns the command's logger: JSON lines on w, durations as
// text (durationsAsText), every string and error value passed through
// redact (nil: none) so that no password reaches a line.
func newJSONLog(w io.Writer, redact func(string) string) *slog.Logger {
	replace := durationsAsText
	if redact != nil {
		replace = func(groups []string, a slog.Attr) slog.Attr {
			a = durationsAsText(groups, a)
			switch v := a.Value; {
			case v.Kind() == slog.KindString:
				return slog.String(a.Key, redact(v.String()))
			case v.Kind() == slog.KindAny:
				if err, ok := v.Any().(error); ok {
					return slog.String(a.Key, redact(err.Error()))
				}
			}
			return a
		}
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{ReplaceAttr: replace}))
}

// durationsAsText is a slog ReplaceAttr that logs every time.Duration as
// its String form ("80.681412ms", "1s", "168h0m0s") instead of JSON's
// integer nanoseconds.
func durationsAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// go-sql-driver/mysql logs through one process-wide logger (a connection
// that broke: "unexpected EOF", "closing bad idle connection"), by default
// as plain text on os.Stderr. routeMySQLLog sends those lines to the
// relay's JSON log instead (the relay that started last, for tests that
// run several in one process), at WARN, component go-sql-driver/mysql.
func routeMySQLLog(log *slog.Logger) {
	mysqlLog.Store(log.With("component", "go-sql-driver/mysql"))
	mysqlLogOnce.Do(func() { _ = mysql.SetLogger(mysqlLogger{}) }) // only a nil logger is refused
}

var (
	mysqlLogOnce sync.Once
	mysqlLog     atomic.Pointer[slog.Logger]
)

// mysqlLogger is the driver's mysql.Logger on mysqlLog.
type mysqlLogger struct{}

// Print logs one driver message at WARN.
func (mysqlLogger) Print(v ...any) {
	if l := mysqlLog.Load(); l != nil {
		l.Warn("go-sql-driver/mysql", "message", strings.TrimSuffix(fmt.Sprint(v...), "\n"))
	}
}
