package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/IBM/sarama"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
	natspub "github.com/sqloutbox/outbox/relay/nats"
	"github.com/sqloutbox/outbox/relay/rabbitmq"
	redispub "github.com/sqloutbox/outbox/relay/redis"
)

// brokerPlan is the relay's broker settings, checked but not connected.
type brokerPlan struct {
	kind brokerKind
	// url is the parsed --broker (nil for --brokers).
	url *brokerURL
	// shown names the broker in logs and messages: the URL redacted.
	shown string
	// hosts are the servers, host:port.
	hosts []string
	// prefix is --topic-prefix: Kafka topic, NATS subject or Redis
	// stream prefix (unused for RabbitMQ).
	prefix string
	// exchange is RabbitMQ's exchange.
	exchange string
	// tls is the TLS client configuration (nil: plain).
	tls *tls.Config
	// sarama is Kafka's producer configuration.
	sarama *sarama.Config
	// eos is Kafka's exactly-once mode (nil: off).
	eos *kafka.ExactlyOnce
	// password comes from --broker-password-file or
	// OUTBOX_BROKER_PASSWORD ("": none, see url.password).
	password string
	// natsCreds and natsNKey are the NATS credential files.
	natsCreds, natsNKey string
	// natsStream is the stream the relay checks at start and in /readyz
	// (--nats-stream; "": none).
	natsStream string
}

// flagsOf lists the flags that apply to one broker only.
var flagsOf = map[brokerKind][]string{
	brokerKafka:    {"client-id", "kafka-version", "compression", "sasl-mechanism", "sasl-user", "sasl-password-file", "kafka-transactional-id-prefix", "kafka-transaction-timeout"},
	brokerNATS:     {"nats-creds-file", "nats-nkey-file", "nats-stream"},
	brokerRabbitMQ: {"exchange"},
}

// brokerPlan checks the broker flags: which broker, its credentials and
// TLS. changed reports a flag given on the command line or through its
// variable. Mistakes are usage errors (exit 2); an unreadable file is a
// runtime error naming the flag. No message shows a password.
func (a *app) brokerPlan(f *relayFlags, changed func(string) bool) (*brokerPlan, error) {
	if f.broker.url != "" {
		// Before any message can quote them; a NATS token once it is
		// known to be one (below).
		a.secrets = append(a.secrets, urlSecrets(f.broker.url, false)...)
	}
	if f.kafka.saslPassArgv != "" {
		return nil, &exitError{code: exitUsage, msg: errSecretInArgv.Error()}
	}
	var brokers []string
	for _, b := range f.brokers {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	p := &brokerPlan{kind: brokerKafka, prefix: f.topicPrefix, exchange: f.broker.exchange,
		natsCreds: f.broker.natsCreds, natsNKey: f.broker.natsNKey, natsStream: f.broker.natsStream}
	switch {
	case f.broker.url != "" && changed("brokers"):
		return nil, usageErrorf("give the broker once: --broker (%s) or --brokers (OUTBOX_BROKERS, Kafka only), not both", envBroker)
	case f.broker.url == "" && changed("brokers") && len(brokers) == 0:
		return nil, usageErrorf("no Kafka brokers given: set --brokers or OUTBOX_BROKERS")
	case f.broker.url == "" && len(brokers) == 0:
		return nil, usageErrorf("no broker given: set --broker or %s (kafka://, nats://, tls://, amqp://, amqps://, redis:// or rediss://), or --brokers for Kafka", envBroker)
	case f.broker.url == "":
		p.hosts = brokers
		p.shown = "kafka://" + strings.Join(brokers, ",")
	default:
		u, err := parseBrokerURL(f.broker.url)
		if err != nil {
			return nil, err
		}
		p.kind, p.url, p.shown, p.hosts = u.kind, u, u.redacted, u.hosts
	}
	for kind, names := range flagsOf {
		if kind == p.kind {
			continue
		}
		for _, n := range names {
			if changed(n) {
				return nil, usageErrorf("--%s applies to %s only, not to %s (--broker %s)", n, kind.title(), p.kind.title(), p.shown)
			}
		}
	}
	if p.kind == brokerNATS && !validSubjectPrefix(p.prefix) {
		return nil, usageErrorf("invalid --topic-prefix %q for NATS: a subject prefix has no spaces or control characters, no '*' or '>' and no empty token (\"a..b\", a leading '.')", p.prefix)
	}
	if p.kind == brokerRabbitMQ && changed("topic-prefix") {
		return nil, usageErrorf("--topic-prefix does not apply to RabbitMQ: messages go to --exchange (default %s) with routing key <aggregate type>.<aggregate id>", rabbitmq.DefaultExchange)
	}

	// The password, from a file or the environment.
	pw := a.getenv(envBrokerPassword)
	if f.broker.passwordFile != "" {
		if pw != "" {
			return nil, usageErrorf("give the broker password once: --broker-password-file or %s, not both", envBrokerPassword)
		}
		var err error
		if pw, err = readSecretFile("broker-password-file", f.broker.passwordFile); err != nil {
			return nil, err
		}
		if pw == "" {
			return nil, usageErrorf("--broker-password-file %s is empty", f.broker.passwordFile)
		}
	}
	if pw != "" {
		a.secrets = append(a.secrets, pw)
		switch {
		case p.kind == brokerKafka:
			return nil, usageErrorf("--broker-password-file and %s do not apply to Kafka: use --sasl-password-file or %s", envBrokerPassword, envSASLPassword)
		case p.url.hasPassword || p.url.secretParam:
			return nil, usageErrorf("give the broker password once: in the %s URL or in --broker-password-file or %s, not both", envBroker, envBrokerPassword)
		case p.kind == brokerRabbitMQ && p.url.user == "":
			return nil, usageErrorf("a RabbitMQ password needs its user in the URL (amqp://USER@host:5672/vhost)")
		}
		p.password = pw
	}
	if p.url != nil && p.kind == brokerNATS && !p.url.hasPassword && p.url.user != "" {
		if pw == "" { // the user is a token
			a.secrets = append(a.secrets, urlSecrets(f.broker.url, true)...)
		} else {
			p.shown = redactURL(f.broker.url, false)
		}
	}
	if p.url != nil && p.url.hasSecret(pw != "") && !a.fromEnv["broker"] {
		return nil, &exitError{code: exitUsage, msg: errBrokerSecretInArgv.Error()}
	}
	if p.kind == brokerNATS {
		switch {
		case p.natsCreds != "" && p.natsNKey != "":
			return nil, usageErrorf("give one NATS credential: --nats-creds-file or --nats-nkey-file, not both")
		case (p.natsCreds != "" || p.natsNKey != "") && (p.password != "" || p.url.hasSecret(false)):
			return nil, usageErrorf("give one NATS credential: a user, password or token in the URL, or --nats-creds-file, or --nats-nkey-file")
		}
	}

	// TLS: the scheme decides for URL brokers; the --tls flags configure it.
	var err error
	switch {
	case p.kind == brokerKafka:
		if p.tls, err = f.tls.config(false, ""); err != nil {
			return nil, err
		}
		if p.sarama, err = f.kafka.saramaConfig(a.getenv, p.tls); err != nil {
			return nil, err
		}
		if f.kafka.txnPrefix != "" {
			p.eos = &kafka.ExactlyOnce{TransactionalIDPrefix: f.kafka.txnPrefix, Table: a.table, TransactionTimeout: f.kafka.txnTimeout}
		}
		return p, nil
	case !p.url.tls && f.tls.requested():
		tlsScheme := map[brokerKind]string{brokerNATS: "tls", brokerRabbitMQ: "amqps", brokerRedis: "rediss"}[p.kind]
		return nil, usageErrorf("the --tls flags need a TLS URL: %s:// instead of %s:// (the scheme decides whether %s is reached over TLS)", tlsScheme, p.url.scheme, p.kind.title())
	case p.url.tls:
		host := ""
		if p.kind != brokerNATS { // nats.go verifies each server against its own host
			host, _, _ = net.SplitHostPort(p.hosts[0])
		}
		if p.tls, err = f.tls.config(true, host); err != nil {
			return nil, err
		}
	}
	if p.exchange == "" {
		p.exchange = rabbitmq.DefaultExchange
	}
	return p, nil
}

// brokerConn is a connected publisher.
type brokerConn struct {
	pub relay.Publisher
	// close closes the publisher and its connection.
	close func() error
	// attrs describe the broker in the start-up log line.
	attrs []any
}

// connectBroker connects to the planned broker within ctx (dial timeouts
// at most timeout) and checks that it answers: a Kafka metadata request,
// a JetStream account-info round trip, RabbitMQ's exchange, a Redis PING.
// The error names the broker by its redacted URL.
func (a *app) connectBroker(ctx context.Context, p *brokerPlan, timeout time.Duration, log *slog.Logger) (*brokerConn, error) {
	attrs := []any{"broker", string(p.kind), "broker_url", p.shown, "tls", p.tls != nil}
	switch p.kind {
	case brokerNATS:
		return a.connectNATS(ctx, p, timeout, log, attrs)
	case brokerRabbitMQ:
		return connectRabbitMQ(ctx, p, timeout, attrs)
	case brokerRedis:
		return connectRedis(ctx, p, timeout, log, attrs)
	}
	sc := p.sarama
	sc.Net.DialTimeout = min(timeout, sc.Net.DialTimeout)
	prefix := p.prefix
	pub, err := kafka.NewPublisher(kafka.Config{
		Brokers: p.hosts,
		Sarama:  sc,
		Topic:   func(m relay.Message) string { return prefix + m.AggregateType },

		ExactlyOnce: p.eos,
	})
	if err != nil {
		hint := ""
		if sc.Net.SASL.Enable && errors.Is(err, io.EOF) {
			// Some brokers close the connection on a failed SASL
			// exchange instead of answering SASL_AUTHENTICATION_FAILED.
			hint = " (the broker closed the connection, as it does when SASL authentication fails: check --sasl-mechanism, --sasl-user and the password)"
		}
		return nil, fmt.Errorf("cannot connect to Kafka brokers %s: %w%s", strings.Join(p.hosts, ","), err, hint)
	}
	attrs = append(attrs, "brokers", p.hosts, "topic_prefix", prefix,
		"client_id", sc.ClientID, "kafka_version", sc.Version.String(), "compression", sc.Producer.Compression.String(),
		"sasl_mechanism", string(sc.Net.SASL.Mechanism), "sasl_user", sc.Net.SASL.User, "exactly_once", p.eos != nil)
	if p.eos != nil {
		attrs = append(attrs, "transactional_id_prefix", p.eos.TransactionalIDPrefix, "state_topic", kafka.StateTopic(p.eos.TransactionalIDPrefix, p.eos.Table))
	}
	return &brokerConn{pub: pub, close: pub.Close, attrs: attrs}, nil
}

// connectNATS connects to the NATS servers and checks JetStream (and the
// stream, with --nats-stream).
func (a *app) connectNATS(ctx context.Context, p *brokerPlan, timeout time.Duration, log *slog.Logger, attrs []any) (*brokerConn, error) {
	nc, attrs, err := a.dialNATS(p, timeout, log, attrs)
	if err != nil {
		return nil, err
	}
	prefix := p.prefix
	pub, err := natspub.NewPublisher(natspub.Config{Conn: nc, Stream: p.natsStream, Subject: func(m relay.Message) string {
		base := m.Topic
		if base == "" {
			base = prefix + m.AggregateType
		}
		return base + "." + natspub.SubjectToken(m.AggregateID)
	}})
	if err == nil {
		err = pub.Healthy(ctx)
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("cannot use NATS JetStream at %s: %w", p.shown, withGivenBroker(err, p.shown))
	}
	closeAll := func() error {
		err := pub.Close()
		nc.Close()
		return err
	}
	attrs = append(attrs, "subject_prefix", prefix)
	if p.natsStream != "" {
		attrs = append(attrs, "stream", p.natsStream)
	}
	return &brokerConn{pub: pub, close: closeAll, attrs: attrs}, nil
}

// dialNATS connects to the NATS servers (credentials as options, never in
// the URLs handed to nats.go); the caller closes the connection.
func (a *app) dialNATS(p *brokerPlan, timeout time.Duration, log *slog.Logger, attrs []any) (*nats.Conn, []any, error) {
	urls := make([]string, len(p.hosts))
	for i, h := range p.hosts {
		urls[i] = p.url.scheme + "://" + h
	}
	opts := []nats.Option{
		nats.Name("outbox-relay"),
		nats.Timeout(min(timeout, 10*time.Second)),
		nats.MaxReconnects(-1), // the relay keeps its rows pending meanwhile
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			// Permission violations arrive here, not as a Publish error.
			log.Error("NATS asynchronous error", "error", a.redact(err.Error()))
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("NATS connection lost, reconnecting", "error", a.redact(err.Error()))
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("NATS reconnected", "server", redactBrokerURL(nc.ConnectedUrlRedacted()))
		}),
	}
	if p.tls != nil {
		opts = append(opts, nats.Secure(p.tls))
	}
	user := ""
	switch u := p.url; {
	case p.natsCreds != "":
		if _, err := os.Stat(p.natsCreds); err != nil {
			return nil, nil, fmt.Errorf("reading --nats-creds-file: %w", err)
		}
		opts = append(opts, nats.UserCredentials(p.natsCreds))
		attrs = append(attrs, "credentials", "creds-file")
	case p.natsNKey != "":
		o, err := nats.NkeyOptionFromSeed(p.natsNKey)
		if err != nil {
			return nil, nil, fmt.Errorf("reading --nats-nkey-file: %w", err)
		}
		opts = append(opts, o)
		attrs = append(attrs, "credentials", "nkey")
	case u.hasPassword:
		opts = append(opts, nats.UserInfo(u.user, u.password))
		user = u.user
	case u.user != "" && p.password != "":
		opts = append(opts, nats.UserInfo(u.user, p.password))
		user = u.user
	case u.user != "":
		opts = append(opts, nats.Token(u.user))
		attrs = append(attrs, "credentials", "token")
	case p.password != "":
		opts = append(opts, nats.Token(p.password))
		attrs = append(attrs, "credentials", "token")
	}
	if user != "" {
		attrs = append(attrs, "user", user)
	}
	nc, err := nats.Connect(strings.Join(urls, ","), opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot connect to NATS at %s: %w%s", p.shown, err, connectHint(brokerNATS, err, p.hosts))
	}
	return nc, attrs, nil
}

// connectRabbitMQ dials the broker and checks the exchange.
// rabbitConfig is the AMQP configuration of p: the dial bounded by the
// URL's connection_timeout, else timeout (at most 30 s); TLS; the password
// from its file or variable.
func rabbitConfig(p *brokerPlan, timeout time.Duration) amqp.Config {
	dial := min(timeout, 30*time.Second)
	if p.url.dialTimeout > 0 { // the URL's connection_timeout
		dial = p.url.dialTimeout
	}
	cfg := amqp.Config{Dial: amqp.DefaultDial(dial), TLSClientConfig: p.tls}
	if p.password != "" {
		cfg.SASL = []amqp.Authentication{&amqp.PlainAuth{Username: p.url.user, Password: p.password}}
	}
	return cfg
}

// dialRabbitMQ opens a connection of its own (provisioning commands).
func dialRabbitMQ(p *brokerPlan, timeout time.Duration) (*amqp.Connection, error) {
	conn, err := amqp.DialConfig(p.url.raw, rabbitConfig(p, timeout))
	if err != nil {
		return nil, fmt.Errorf("cannot connect to RabbitMQ at %s: %w%s", p.shown, err, connectHint(brokerRabbitMQ, err, p.hosts))
	}
	return conn, nil
}

func connectRabbitMQ(ctx context.Context, p *brokerPlan, timeout time.Duration, attrs []any) (*brokerConn, error) {
	pub, err := rabbitmq.NewPublisher(rabbitmq.Config{URL: p.url.raw, AMQP: rabbitConfig(p, timeout), Exchange: p.exchange})
	if err != nil {
		return nil, fmt.Errorf("cannot connect to RabbitMQ at %s: %w%s", p.shown, err, connectHint(brokerRabbitMQ, err, p.hosts))
	}
	if err := pub.Healthy(ctx); err != nil {
		_ = pub.Close()
		return nil, fmt.Errorf("RabbitMQ at %s: %w (declare the exchange, or name another with --exchange)", p.shown, err)
	}
	user := p.url.user
	if user == "" {
		user = "guest" // amqp091-go's default
	}
	attrs = append(attrs, "user", user, "exchange", p.exchange)
	return &brokerConn{pub: pub, close: pub.Close, attrs: attrs}, nil
}

// connectRedis makes the client as the redispub package doc advises
// (ContextTimeoutEnabled, MaxRetries -1) and checks it with a PING.
func connectRedis(ctx context.Context, p *brokerPlan, timeout time.Duration, log *slog.Logger, attrs []any) (*brokerConn, error) {
	o := *p.url.redis
	o.ContextTimeoutEnabled = true
	o.MaxRetries = -1 // retries are the relay's
	o.DialTimeout = min(timeout, 5*time.Second)
	if p.url.dialTimeout > 0 { // the URL's dial_timeout
		o.DialTimeout = p.url.dialTimeout
	}
	if p.password != "" {
		o.Password = p.password
	}
	if p.tls != nil {
		if o.TLSConfig != nil && o.TLSConfig.InsecureSkipVerify { // the URL's skip_verify=true
			p.tls.InsecureSkipVerify = true
		}
		o.TLSConfig = p.tls
	}
	redisLogOnce.Do(func() { redis.SetLogger(redisLogger{}) })
	client := redis.NewClient(&o)
	prefix := p.prefix
	pub, err := redispub.NewPublisher(redispub.Config{Client: client, Stream: func(m relay.Message) string {
		if m.Topic != "" {
			return m.Topic
		}
		return prefix + m.AggregateType
	}})
	if err == nil {
		err = pub.Healthy(ctx)
	}
	if err != nil {
		_ = client.Close()
		hint := connectHint(brokerRedis, err, p.hosts)
		if hint == "" && (strings.Contains(err.Error(), "WRONGPASS") || strings.Contains(err.Error(), "NOAUTH")) {
			hint = connectHint(brokerRedis, amqp.ErrCredentials, nil) // the same advice
		}
		return nil, fmt.Errorf("cannot connect to Redis at %s: %w%s", p.shown, err, hint)
	}
	redisLog.Store(log) // from now on: go-redis's lines are this relay's
	closeAll := func() error {
		err := pub.Close()
		return errors.Join(err, client.Close())
	}
	if o.Username != "" {
		attrs = append(attrs, "user", o.Username)
	}
	attrs = append(attrs, "db", o.DB, "stream_prefix", prefix)
	return &brokerConn{pub: pub, close: closeAll, attrs: attrs}, nil
}

// go-redis logs through one process-wide logger (connection pool
// failures, for one): redisLogger sends its lines to the logger of the
// relay that connected last, as JSON like every other line, instead of
// plain text on os.Stderr. Until a relay's start-up PING succeeded, they
// are dropped: a failed start's own error says what went wrong ("cannot
// connect to Redis at URL: ..."), so it stays the only line on stderr
// instead of following go-redis's "failed to dial" line. (go-redis gives
// its logger no way to tell which client a line is about: its queued
// dials log with a context of their own, not the caller's.)
var (
	redisLogOnce sync.Once
	redisLog     atomic.Pointer[slog.Logger]
)

// redisLogger is go-redis's internal.Logging on redisLog.
type redisLogger struct{}

// Printf logs one go-redis message at WARN.
func (redisLogger) Printf(_ context.Context, format string, v ...any) {
	if l := redisLog.Load(); l != nil {
		l.Warn("go-redis", "message", fmt.Sprintf(format, v...))
	}
}

// validSubjectPrefix reports whether prefix followed by an aggregate type
// and token makes a NATS subject: no byte at or below ' ', no DEL, '*' or
// '>', and no empty token except the one a trailing '.' leaves for the
// aggregate type. "" is valid (subjects are then <type>.<token>).
func validSubjectPrefix(prefix string) bool {
	toks := strings.Split(prefix, ".")
	for i, tok := range toks {
		if tok == "" && i != len(toks)-1 {
			return false
		}
		for j := 0; j < len(tok); j++ {
			if c := tok[j]; c <= ' ' || c == 0x7f || c == '*' || c == '>' {
				return false
			}
		}
	}
	return true
}

// connectHint says what to do about a failed connection to a broker of
// kind at hosts: for a refused TCP connection (nats.go hides it behind
// "no servers available": then it dials the first host once to learn why)
// whether the server runs on that port; for refused credentials where the
// user and password come from. "" if it has nothing to add.
func connectHint(kind brokerKind, err error, hosts []string) string {
	port := map[brokerKind]string{brokerNATS: "4222", brokerRabbitMQ: "5672", brokerRedis: "6379", brokerKafka: "9092"}[kind]
	credentials := fmt.Sprintf(" (check the user in --broker and the password in %s or --broker-password-file)", envBrokerPassword)
	var ae *amqp.Error
	switch {
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, amqp.ErrCredentials), errors.Is(err, amqp.ErrSASL),
		errors.As(err, &ae) && ae.Code == amqp.AccessRefused:
		return credentials
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Sprintf(" (is %s running, and is that its port (default %s)?)", kind.title(), port)
	case errors.Is(err, nats.ErrNoServers) && len(hosts) > 0:
		c, derr := net.DialTimeout("tcp", hosts[0], 2*time.Second)
		if derr == nil {
			c.Close()
			return ""
		}
		if errors.Is(derr, syscall.ECONNREFUSED) {
			return fmt.Sprintf(" (%v: is %s running, and is that its port (default %s)?)", derr, kind.title(), port)
		}
		return fmt.Sprintf(" (%v)", derr)
	}
	return ""
}

// givenBrokerErr is an error whose text names the broker address the user
// gave where the library's hint had a placeholder.
type givenBrokerErr struct {
	err error
	msg string
}

func (e *givenBrokerErr) Error() string { return e.msg }
func (e *givenBrokerErr) Unwrap() error { return e.err }

// withGivenBroker replaces natspub.BrokerPlaceholder in err's text (the
// command line a hint quotes) with shown, the --broker URL as given
// (redacted); err's chain is kept for errors.Is and errors.As.
func withGivenBroker(err error, shown string) error {
	if err == nil || shown == "" || !strings.Contains(err.Error(), natspub.BrokerPlaceholder) {
		return err
	}
	return &givenBrokerErr{err: err, msg: strings.ReplaceAll(err.Error(), natspub.BrokerPlaceholder, shown)}
}
