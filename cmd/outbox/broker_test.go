package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/internal/testkit/faultproxy"
	"github.com/sqloutbox/outbox/internal/testkit/privateserver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
)

// natsURL is the NATS server (with JetStream) the tests use.
func natsURL() string { return envOr("OUTBOX_TEST_NATS", "nats://127.0.0.1:4222") }

// rabbitURL is the RabbitMQ the tests use (its password is guest).
func rabbitURL() string { return envOr("OUTBOX_TEST_RABBITMQ", "amqp://guest:guest@127.0.0.1:5672/") }

// redisAddr is the Redis the tests use, host:port.
func redisAddr() string { return envOr("OUTBOX_TEST_REDIS", "127.0.0.1:6379") }

// redisURL is redisAddr's database 0 as a --broker URL.
func redisURL() string { return "redis://" + redisAddr() + "/0" }

// uniqueID returns 12 random hex digits for a test's own names.
func uniqueID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// noEnv is an empty environment.
func noEnv(string) string { return "" }

// unavailable skips t when a broker does not answer (fails it under
// OUTBOX_TEST_REQUIRE).
func unavailable(t *testing.T, what string, err error) {
	t.Helper()
	if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
		t.Fatalf("%s required (OUTBOX_TEST_REQUIRE is set) but unavailable: %v", what, err)
	}
	t.Skipf("SKIP: %s not available: %v", what, err)
}

// TestRedactBrokerURL: passwords, NATS tokens and password parameters are
// redacted in a broker URL, and found to be scrubbed from messages.
func TestRedactBrokerURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"amqp://relay:s3cret@rabbit:5672/prod", "amqp://relay:xxxxx@rabbit:5672/prod"},
		{"amqps://relay:p%40ss%2Fw@rabbit/", "amqps://relay:xxxxx@rabbit/"},
		{"amqp://relay@rabbit/", "amqp://relay@rabbit/"},
		{"redis://:s3cret@127.0.0.1:6379/0", "redis://:xxxxx@127.0.0.1:6379/0"},
		{"rediss://bob:a/b?c@redis:6380/1", "rediss://bob:xxxxx@redis:6380/1"}, // unescaped '/' and '?' in the password
		{"redis://redis:6379/0?password=s3cret", "redis://redis:6379/0?password=xxxxx"},
		{"nats://alice:pw1@n1:4222,n2:4222", "nats://alice:xxxxx@n1:4222,n2:4222"},
		{"nats://s3cr3t-token@n1:4222", "nats://xxxxx@n1:4222"}, // a NATS token
		{"tls://tok@n1:4222", "tls://xxxxx@n1:4222"},
		{"nats://n1:4222", "nats://n1:4222"},
		{"kafka://k1:9092,k2:9092", "kafka://k1:9092,k2:9092"},
		{"host:4222", "host:4222"},
	} {
		if got := redactBrokerURL(tc.in); got != tc.want {
			t.Errorf("redactBrokerURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if secrets := brokerSecrets(tc.in); tc.in == tc.want && len(secrets) != 0 {
			t.Errorf("brokerSecrets(%q) = %q, want none", tc.in, secrets)
		}
	}
	if s := brokerSecrets("amqps://relay:p%40ss%2Fw@rabbit/"); !slices.Contains(s, "p%40ss%2Fw") || !slices.Contains(s, "p@ss/w") {
		t.Errorf("brokerSecrets: %q, want the escaped and unescaped password", s)
	}
	// A NATS user whose password comes separately is no token.
	if got := redactURL("nats://alice@n1:4222", false); got != "nats://alice@n1:4222" || len(urlSecrets("nats://alice@n1:4222", false)) != 0 {
		t.Errorf("redactURL(user, not a token) = %q", got)
	}
	a := &app{secrets: brokerSecrets("nats://s3cr3t-token@n1:4222")}
	if got := a.redact("authorization violation for s3cr3t-token"); strings.Contains(got, "s3cr3t-token") {
		t.Errorf("redact: %q", got)
	}
}

// TestParseBrokerURL: each scheme's broker, TLS and servers; malformed
// URLs are usage errors.
func TestParseBrokerURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in    string
		kind  brokerKind
		tls   bool
		hosts []string
	}{
		{"kafka://k1:9092,k2:9093", brokerKafka, false, []string{"k1:9092", "k2:9093"}},
		{"kafka://k1", brokerKafka, false, []string{"k1:9092"}},
		{"nats://n1:4222, n2:4223", brokerNATS, false, []string{"n1:4222", "n2:4223"}},
		{"nats://n1,nats://n2:5222", brokerNATS, false, []string{"n1:4222", "n2:5222"}},
		{"tls://u:p@[::1]:4222", brokerNATS, true, []string{"[::1]:4222"}},
		{"amqp://guest:guest@127.0.0.1:5672/", brokerRabbitMQ, false, []string{"127.0.0.1:5672"}},
		{"AMQPS://rabbit/prod", brokerRabbitMQ, true, []string{"rabbit:5671"}},
		{"redis://u:p@127.0.0.1:6379/2", brokerRedis, false, []string{"127.0.0.1:6379"}},
		{"rediss://redis", brokerRedis, true, []string{"redis:6379"}},
	} {
		b, err := parseBrokerURL(tc.in)
		if err != nil {
			t.Errorf("parseBrokerURL(%q): %v", tc.in, err)
			continue
		}
		if b.kind != tc.kind || b.tls != tc.tls || !slices.Equal(b.hosts, tc.hosts) {
			t.Errorf("parseBrokerURL(%q) = %s tls=%v %v, want %s tls=%v %v", tc.in, b.kind, b.tls, b.hosts, tc.kind, tc.tls, tc.hosts)
		}
	}
	// The URL's own connect timeout is kept (amqp091-go: milliseconds).
	for in, want := range map[string]time.Duration{
		"amqp://rabbit/?connection_timeout=1500": 1500 * time.Millisecond,
		"redis://redis:6379/0?dial_timeout=3s":   3 * time.Second,
		"redis://redis:6379/0":                   0,
	} {
		b, err := parseBrokerURL(in)
		if err != nil {
			t.Errorf("parseBrokerURL(%q): %v", in, err)
		} else if b.dialTimeout != want {
			t.Errorf("parseBrokerURL(%q): dial timeout %v, want %v", in, b.dialTimeout, want)
		}
	}
	b, err := parseBrokerURL("nats://alice@n1")
	if err != nil || b.user != "alice" || !b.hasSecret(false) || b.hasSecret(true) {
		t.Errorf("a NATS user without password is a token unless the password comes separately: %+v %v", b, err)
	}
	for _, in := range []string{"", "n1:4222", "mqtt://n1", "://n1", "nats://", "nats://n1:99999", "nats://n1:abc", "nats://n1/path",
		"kafka://u:p@k1:9092", "nats://n1,redis://n2", "amqp://h:notaport/", "redis://h:6379/x", "redis://h/1/2", "redis://:6379/0", "amqp://",
		"nats://%zz@n1", "redis://h:6379/0?max_retries=3"} {
		_, err := parseBrokerURL(in)
		var ee *exitError
		if err == nil || !errors.As(err, &ee) || ee.code != exitUsage {
			t.Errorf("parseBrokerURL(%q) = %v, want a usage error", in, err)
		}
	}
}

// TestValidSubjectPrefix: which --topic-prefix values make NATS subjects.
func TestValidSubjectPrefix(t *testing.T) {
	t.Parallel()
	for prefix, want := range map[string]bool{
		"outbox.event.": true, "": true, "events": true, "a.b-c_d.": true,
		"a..b.": false, ".a.": false, "a b.": false, "a.*.": false, "a.>": false, "a\tb.": false,
	} {
		if got := validSubjectPrefix(prefix); got != want {
			t.Errorf("validSubjectPrefix(%q) = %v, want %v", prefix, got, want)
		}
	}
}

// TestBrokerTLSConfig: the TLS configuration each scheme gets from the
// --tls flags: none for plain schemes, the system roots for a bare TLS
// scheme, the flags' CA, client certificate, server name and skip-verify
// otherwise; verification against the URL's host by default (NATS: left
// to nats.go, which verifies each server against its own host).
func TestBrokerTLSConfig(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	for _, tc := range []struct {
		url        string
		flags      tlsFlags
		wantTLS    bool
		serverName string
	}{
		{"kafka://k1:9092", tlsFlags{}, false, ""},
		{"kafka://k1:9092", tlsFlags{enable: true}, true, ""},
		{"kafka://k1:9092", tlsFlags{caFile: pki.caFile, serverName: "kafka.test"}, true, "kafka.test"},
		{"nats://n1:4222", tlsFlags{}, false, ""},
		{"tls://n1:4222", tlsFlags{}, true, ""},
		{"tls://n1:4222", tlsFlags{caFile: pki.caFile, certFile: pki.certFile, keyFile: pki.keyFile}, true, ""},
		{"amqp://rabbit/", tlsFlags{}, false, ""},
		{"amqps://rabbit/", tlsFlags{}, true, "rabbit"},
		{"amqps://rabbit/", tlsFlags{caFile: pki.caFile, serverName: "mq.test", insecureVerify: true}, true, "mq.test"},
		{"redis://redis:6379/0", tlsFlags{}, false, ""},
		{"rediss://redis:6380/0", tlsFlags{caFile: pki.caFile, certFile: pki.certFile, keyFile: pki.keyFile}, true, "redis"},
	} {
		a := &app{getenv: noEnv}
		f := &relayFlags{tls: tc.flags, topicPrefix: "outbox.event.", kafka: kafkaFlags{clientID: "outbox-relay"}}
		f.broker.url = tc.url
		p, err := a.brokerPlan(f, func(string) bool { return false })
		if err != nil {
			t.Errorf("%s %+v: %v", tc.url, tc.flags, err)
			continue
		}
		if (p.tls != nil) != tc.wantTLS {
			t.Errorf("%s %+v: TLS %v, want %v", tc.url, tc.flags, p.tls != nil, tc.wantTLS)
			continue
		}
		if p.kind == brokerKafka && p.sarama.Net.TLS.Enable != tc.wantTLS {
			t.Errorf("%s: sarama TLS %v", tc.url, p.sarama.Net.TLS.Enable)
		}
		if p.tls == nil {
			continue
		}
		if p.tls.ServerName != tc.serverName || p.tls.InsecureSkipVerify != tc.flags.insecureVerify ||
			(p.tls.RootCAs != nil) != (tc.flags.caFile != "") || len(p.tls.Certificates) != map[bool]int{true: 1}[tc.flags.certFile != ""] ||
			p.tls.MinVersion < 0x0303 {
			t.Errorf("%s %+v: tls.Config server name %q skip %v roots %v certs %d min %x", tc.url, tc.flags,
				p.tls.ServerName, p.tls.InsecureSkipVerify, p.tls.RootCAs != nil, len(p.tls.Certificates), p.tls.MinVersion)
		}
	}
}

// TestRelayBrokerUsageErrors: broker settings the relay cannot use are
// usage errors (exit 2, one line) before anything is contacted, and no
// password given is ever echoed.
func TestRelayBrokerUsageErrors(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	pki := newTestPKI(t)
	const secret = "Br0ker-S3cret"
	pwFile := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pwFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	free := freeAddr(t)
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"UnknownScheme", []string{"--broker", "mqtt://" + free}, nil, `unknown broker scheme "mqtt"`},
		{"NoScheme", []string{"--broker", free}, nil, "cannot tell the broker"},
		{"NoBroker", nil, nil, "no broker given"},
		{"BothFlags", []string{"--broker", "nats://" + free, "--brokers", free}, nil, "give the broker once"},
		{"BothVariables", nil, map[string]string{envBroker: "nats://" + free, "OUTBOX_BROKERS": free}, "give the broker once"},
		{"PasswordOnArgvAMQP", []string{"--broker", "amqp://guest:" + secret + "@" + free + "/"}, nil, "--broker holds a password"},
		{"PasswordOnArgvRedis", []string{"--broker", "redis://:" + secret + "@" + free + "/0"}, nil, "--broker holds a password"},
		{"PasswordParamOnArgv", []string{"--broker", "redis://" + free + "/0?password=" + secret}, nil, "malformed --broker"},
		{"TokenOnArgvNATS", []string{"--broker", "nats://" + secret + "@" + free}, nil, "--broker holds a password or token"},
		{"MalformedPort", []string{"--broker", "nats://" + secret + "@127.0.0.1:99999"}, map[string]string{envBroker: ""}, "invalid port"},
		{"MalformedEnv", nil, map[string]string{envBroker: "amqp://guest:" + secret + "@127.0.0.1:notaport/"}, "malformed --broker"},
		{"MalformedRedisDB", []string{"--broker", "redis://" + free + "/zero"}, nil, "malformed --broker"},
		{"KafkaCredentials", []string{"--broker", "kafka://relay:" + secret + "@" + free}, nil, "takes no user or password"},
		{"PasswordTwice", nil, map[string]string{envBroker: "redis://:" + secret + "@" + free + "/0", envBrokerPassword: secret}, "give the broker password once"},
		{"PasswordFileAndEnv", []string{"--broker", "redis://" + free + "/0", "--broker-password-file", pwFile}, map[string]string{envBrokerPassword: secret}, "not both"},
		{"PasswordForKafka", []string{"--broker", "kafka://" + free}, map[string]string{envBrokerPassword: secret}, "do not apply to Kafka"},
		{"RabbitPasswordNoUser", []string{"--broker", "amqp://" + free + "/", "--broker-password-file", pwFile}, nil, "needs its user"},
		{"SASLForNATS", []string{"--broker", "nats://" + free, "--sasl-mechanism", "PLAIN"}, nil, "--sasl-mechanism applies to Kafka only"},
		{"CompressionForRedis", []string{"--broker", "redis://" + free, "--compression", "gzip"}, nil, "--compression applies to Kafka only"},
		{"ExchangeForNATS", []string{"--broker", "nats://" + free, "--exchange", "x"}, nil, "--exchange applies to RabbitMQ only"},
		{"CredsForRedis", []string{"--broker", "redis://" + free, "--nats-creds-file", pwFile}, nil, "--nats-creds-file applies to NATS only"},
		{"TopicPrefixForRabbit", []string{"--broker", "amqp://" + free + "/", "--topic-prefix", "x."}, nil, "--topic-prefix does not apply to RabbitMQ"},
		{"BadNATSPrefix", []string{"--broker", "nats://" + free, "--topic-prefix", "outbox event."}, nil, "invalid --topic-prefix"},
		{"WildcardNATSPrefix", []string{"--broker", "nats://" + free, "--topic-prefix", "outbox.>."}, nil, "invalid --topic-prefix"},
		{"EmptyTokenNATSPrefix", []string{"--broker", "nats://" + free, "--topic-prefix", ".outbox."}, nil, "invalid --topic-prefix"},
		{"TwoNATSCredentials", []string{"--broker", "nats://" + free, "--nats-creds-file", pwFile, "--nats-nkey-file", pwFile}, nil, "give one NATS credential"},
		{"CredsAndToken", []string{"--broker", "nats://" + free, "--nats-creds-file", pwFile}, map[string]string{envBrokerPassword: secret}, "give one NATS credential"},
		{"TLSFlagPlainNATS", []string{"--broker", "nats://" + free, "--tls-ca-file", pki.caFile}, nil, "tls:// instead of nats://"},
		{"TLSFlagPlainAMQP", []string{"--broker", "amqp://" + free + "/", "--tls"}, nil, "amqps:// instead of amqp://"},
		{"TLSFlagPlainRedis", []string{"--broker", "redis://" + free, "--tls-insecure-skip-verify"}, nil, "rediss:// instead of redis://"},
		{"TLSHalfPair", []string{"--broker", "rediss://" + free, "--tls-cert-file", pki.certFile}, nil, "go together"},
		{"SASLPasswordArgv", []string{"--broker", "nats://" + free, "--sasl-password", secret}, nil, "--sasl-password is refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out, errb testdb.SyncBuffer
			args := append([]string{"--dsn", tg.dsn, "relay", "--http", ""}, tc.args...)
			code := runEnv(t.Context(), args, &out, &errb, func(k string) string { return tc.env[k] })
			stderr := errb.String()
			if code != exitUsage || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("exit %d, want 2 with one line containing %q; stderr:\n%s", code, tc.want, stderr)
			}
			if strings.Contains(stderr+out.String(), secret) {
				t.Errorf("the password is echoed: %s", stderr)
			}
		})
	}
}

// TestRelayBrokerUnreachable: a broker that does not answer stops the
// relay at start, exit 1, with one line on stderr naming the broker by its
// URL, the password redacted: nothing before it (go-redis used to log its
// failed dials first).
func TestRelayBrokerUnreachable(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	const secret = "Unre4chable-pw"
	for _, tc := range []struct{ name, url, want string }{
		{"NATS", "nats://relay:" + secret + "@" + freeAddr(t), "cannot connect to NATS at nats://relay:xxxxx@"},
		{"RabbitMQ", "amqp://relay:" + secret + "@" + freeAddr(t) + "/", "cannot connect to RabbitMQ at amqp://relay:xxxxx@"},
		{"Redis", "redis://relay:" + secret + "@" + freeAddr(t) + "/0", "cannot connect to Redis at redis://relay:xxxxx@"},
		{"Kafka", "kafka://" + freeAddr(t), "cannot connect to Kafka brokers 127.0.0.1:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out, errb testdb.SyncBuffer
			code := runEnv(t.Context(), []string{"--dsn", tg.dsn, "--timeout", "20s", "relay", "--http", ""}, &out, &errb,
				func(k string) string { return map[string]string{envBroker: tc.url}[k] })
			stderr := errb.String()
			if code != exitRuntime || !strings.HasPrefix(stderr, "outbox: "+tc.want) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("exit %d, want 1 with one line starting %q; stderr:\n%s", code, tc.want, stderr)
			}
			if strings.Contains(stderr, secret) {
				t.Errorf("the password is on stderr:\n%s", stderr)
			}
		})
	}
}

// consumed is one message read back from a broker.
type consumed struct {
	payload []byte
	headers map[string]string
}

// brokerSpace is one test's own place on a broker: the relay's settings
// that publish into it and a reader of what arrived.
type brokerSpace struct {
	kind brokerKind
	args []string          // --broker (or none, with env) and the naming flags
	env  map[string]string // OUTBOX_BROKER with a password
	read func(ctx context.Context) ([]consumed, error)
}

// natsSpace creates a memory stream binding the subjects of a unique
// --topic-prefix (deleted when t ends) and reads it back.
func natsSpace(t *testing.T, url string, opts ...nats.Option) *brokerSpace {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.Timeout(5 * time.Second)}, opts...)...)
	if err != nil {
		unavailable(t, "NATS at "+url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	id := uniqueID()
	prefix, stream := "outboxcmd-"+id+".", "OUTBOXCMD_"+id
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{prefix + "order.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatalf("creating stream %s: %v", stream, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, stream); err != nil {
			t.Errorf("deleting stream %s: %v", stream, err)
		}
	})
	return &brokerSpace{kind: brokerNATS, args: []string{"--topic-prefix", prefix}, read: func(ctx context.Context) ([]consumed, error) {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return nil, err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return nil, err
		}
		var out []consumed
		for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				return nil, err
			}
			h := map[string]string{"subject": m.Subject}
			for k := range m.Header {
				h[k] = m.Header.Get(k)
			}
			out = append(out, consumed{payload: m.Data, headers: h})
		}
		return out, nil
	}}
}

// rabbitSpace declares a unique topic exchange and a queue bound to
// order.# (both deleted when t ends) and consumes the queue.
func rabbitSpace(t *testing.T) *brokerSpace {
	t.Helper()
	conn, err := amqp.Dial(rabbitURL())
	if err != nil {
		unavailable(t, "RabbitMQ", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	id := uniqueID()
	exchange, queue := "outboxcmd.ex."+id, "outboxcmd.q."+id
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ch.ExchangeDelete(exchange, false, false) })
	if _, err := ch.QueueDeclare(queue, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = ch.QueueDelete(queue, false, false, false) })
	if err := ch.QueueBind(queue, "order.#", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []consumed
	go func() {
		for d := range deliveries {
			h := map[string]string{"routing-key": d.RoutingKey, "message-id": d.MessageId}
			for k, v := range d.Headers {
				if s, ok := v.(string); ok {
					h[k] = s
				}
			}
			mu.Lock()
			got = append(got, consumed{payload: d.Body, headers: h})
			mu.Unlock()
		}
	}()
	return &brokerSpace{kind: brokerRabbitMQ, args: []string{"--exchange", exchange},
		env: map[string]string{envBroker: rabbitURL()}, // guest:guest: a password, so through the environment
		read: func(context.Context) ([]consumed, error) {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(got), nil
		}}
}

// redisClient connects to the test Redis, skipping t if it does not answer.
func redisClient(t *testing.T) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redisAddr()})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		unavailable(t, "Redis at "+redisAddr(), err)
	}
	return c
}

// redisSpace uses a unique --topic-prefix, so the stream <prefix>order
// (deleted when t ends), and reads it with XRANGE.
func redisSpace(t *testing.T, url string) *brokerSpace {
	t.Helper()
	return redisSpaceOn(t, redisClient(t), url)
}

// redisSpaceOn is redisSpace on the Redis that c reaches.
func redisSpaceOn(t *testing.T, c *redis.Client, url string) *brokerSpace {
	t.Helper()
	prefix := "outboxcmd-" + uniqueID() + "."
	t.Cleanup(func() { _ = c.Del(context.Background(), prefix+"order").Err() })
	return &brokerSpace{kind: brokerRedis, args: []string{"--broker", url, "--topic-prefix", prefix}, read: func(ctx context.Context) ([]consumed, error) {
		xs, err := c.XRange(ctx, prefix+"order", "-", "+").Result()
		if err != nil {
			return nil, err
		}
		out := make([]consumed, len(xs))
		for i, x := range xs {
			h := map[string]string{"stream": prefix + "order"}
			var payload []byte
			for k, v := range x.Values {
				s, _ := v.(string)
				if k == "outbox-payload" {
					payload = []byte(s)
				} else {
					h[k] = s
				}
			}
			out[i] = consumed{payload: payload, headers: h}
		}
		return out, nil
	}}
}

// emitWithHeader commits one event of aggregate order/aggID with a
// traceparent header and returns its message ID.
func emitWithHeader(t *testing.T, db *sql.DB, aggID string) string {
	t.Helper()
	ctx := outbox.NewContext(context.Background())
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck // no-op after Commit
	id, err := outbox.NewMessageID()
	if err != nil {
		t.Fatal(err)
	}
	ev := outbox.Event{ID: id, AggregateType: "order", AggregateID: aggID, Type: "order.placed",
		Payload: []byte(`{"id":"` + aggID + `"}`), Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	if err := outbox.Emit(ctx, ev); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return id
}

// relayThrough runs `outbox relay` into space with extra args and env,
// emits one event and checks it arrives with its payload and headers,
// that /readyz is 200 and the relay's metrics carry the broker label, and
// that the relay stops cleanly logging the broker without any password.
// It returns the relay's logs.
func relayThrough(t *testing.T, s *brokerSpace, secret string, extra ...string) string {
	t.Helper()
	tg := sqliteTarget(t)
	table := randomTable()
	tg.migrate(t, table)
	args := append([]string{"--dsn", tg.dsn, "--table", table, "relay", "--http", freeAddr(t), "--poll", "100ms", "--lease-ttl", "2s"}, s.args...)
	args = append(args, extra...)
	r := startRelay(t, func(k string) string { return s.env[k] }, args...)
	r.waitFor(t, "/readyz 200", func() bool { return r.status("/readyz") == http.StatusOK })

	db, _ := tg.wrappedDB(t, table)
	id := emitWithHeader(t, db, "o-42")
	var got consumed
	r.waitFor(t, "the event on the broker", func() bool {
		msgs, err := s.read(r.ctx)
		if err != nil {
			t.Logf("reading the broker: %v", err)
		}
		for _, m := range msgs {
			if m.headers["outbox-message-id"] == id {
				got = m
				return true
			}
		}
		return false
	})
	if string(got.payload) != `{"id":"o-42"}` || got.headers["outbox-aggregate-id"] != "o-42" || got.headers["outbox-event-type"] != "order.placed" ||
		got.headers["outbox-aggregate-type"] != "order" || got.headers["traceparent"] != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Errorf("message: payload %q headers %v", got.payload, got.headers)
	}

	published := regexp.MustCompile(`(?m)^outbox_published_total\{broker="` + string(s.kind) + `",[^}]*table="` + table + `"[^}]*\} 1$`)
	var metrics string
	r.waitFor(t, "outbox_published_total 1 with broker="+string(s.kind), func() bool {
		_, metrics = get(r.ctx, r.base+"/metrics")
		return published.MatchString(metrics)
	})
	for _, re := range []string{`(?m)^outbox_relay_up\{broker="` + string(s.kind) + `",[^}]*\} 1$`, `(?m)^outbox_pending_events\{table="` + table + `"\} \d`} {
		if !regexp.MustCompile(re).MatchString(metrics) {
			t.Errorf("/metrics does not match %s:\n%s", re, metrics)
		}
	}
	if code := r.shutdown(t); code != 0 {
		t.Errorf("exit %d; stderr:\n%s", code, r.stderr.String())
	}
	logs := r.stderr.String()
	if secret != "" && strings.Contains(logs, secret) {
		t.Errorf("the broker password is in the logs:\n%s", logs)
	}
	for _, want := range []string{`"msg":"starting relay"`, `"broker":"` + string(s.kind) + `"`, `"broker_url":"`, `"msg":"relay stopped cleanly"`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s:\n%s", want, logs)
		}
	}
	checkLogDurations(t, logs)
	return logs
}

// kafkaSpace starts an in-process Kafka broker with the topic of
// --topic-prefix outboxcmd. and consumes it.
func kafkaSpace(t *testing.T) *brokerSpace {
	t.Helper()
	broker, err := kafkatest.Start(kafkatest.Topics(4, "outboxcmd.order"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	consumer, err := kafkatest.NewConsumer(broker.Addrs(), []string{"outboxcmd.order"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(consumer.Close)
	return &brokerSpace{kind: brokerKafka, args: []string{"--broker", "kafka://" + strings.Join(broker.Addrs(), ","), "--topic-prefix", "outboxcmd."},
		read: func(context.Context) ([]consumed, error) {
			var out []consumed
			for _, r := range consumer.Records() {
				out = append(out, consumed{payload: r.Value, headers: r.Headers})
			}
			return out, nil
		}}
}

// TestRelayBrokers: `outbox relay --broker` publishes to Kafka, NATS
// JetStream, RabbitMQ and Redis Streams end to end, each test in its own
// broker, stream, exchange and queue, or key.
func TestRelayBrokers(t *testing.T) {
	t.Parallel()
	t.Run("Kafka", func(t *testing.T) {
		t.Parallel()
		s := kafkaSpace(t)
		logs := relayThrough(t, s, "")
		if !strings.Contains(logs, `"broker_url":"`+s.args[1]+`"`) || !strings.Contains(logs, `"topic_prefix":"outboxcmd."`) {
			t.Errorf("logs lack the broker URL or topic prefix:\n%s", logs)
		}
	})
	t.Run("NATS", func(t *testing.T) {
		t.Parallel()
		logs := relayThrough(t, natsSpace(t, natsURL()), "", "--broker", natsURL())
		if !strings.Contains(logs, `"broker_url":"`+natsURL()+`"`) {
			t.Errorf("logs lack the broker URL:\n%s", logs)
		}
	})
	t.Run("RabbitMQ", func(t *testing.T) {
		t.Parallel()
		logs := relayThrough(t, rabbitSpace(t), "")
		if !strings.Contains(logs, `"broker_url":"amqp://`) || strings.Contains(logs, ":guest@") {
			t.Errorf("logs lack the redacted broker URL:\n%s", logs)
		}
	})
	t.Run("Redis", func(t *testing.T) {
		t.Parallel()
		logs := relayThrough(t, redisSpace(t, redisURL()), "")
		if !strings.Contains(logs, `"broker_url":"`+redisURL()+`"`) || !strings.Contains(logs, `"stream_prefix":"outboxcmd-`) {
			t.Errorf("logs lack the broker URL or stream prefix:\n%s", logs)
		}
	})
}

// TestRelayRedisCredentials: with a Redis ACL user created for the test
// (removed when it ends), the password in OUTBOX_BROKER's URL and the
// password from --broker-password-file work; a wrong password stops the
// relay at start, exit 1, without echoing it.
func TestRelayRedisCredentials(t *testing.T) {
	t.Parallel()
	c := redisClient(t)
	user, pass := "outboxcmd-"+uniqueID(), "Redis-"+uniqueID()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Do(ctx, "ACL", "SETUSER", user, "on", ">"+pass, "~outboxcmd-*", "+ping", "+xadd", "+hello", "+client", "+info", "+config|get").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Do(context.Background(), "ACL", "DELUSER", user).Err(); err != nil {
			t.Errorf("ACL DELUSER %s: %v", user, err)
		}
	})
	base := "redis://" + user + "@" + redisAddr() + "/0"
	withPass := "redis://" + user + ":" + pass + "@" + redisAddr() + "/0"

	t.Run("URLInEnvironment", func(t *testing.T) {
		t.Parallel()
		s := redisSpace(t, "")
		s.args = s.args[2:] // no --broker: OUTBOX_BROKER
		s.env = map[string]string{envBroker: withPass}
		logs := relayThrough(t, s, pass)
		if !strings.Contains(logs, `"broker_url":"redis://`+user+`:xxxxx@`) || !strings.Contains(logs, `"user":"`+user+`"`) {
			t.Errorf("logs lack the redacted URL and the user:\n%s", logs)
		}
	})
	t.Run("PasswordFile", func(t *testing.T) {
		t.Parallel()
		pwFile := filepath.Join(t.TempDir(), "password")
		if err := os.WriteFile(pwFile, []byte(pass+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		relayThrough(t, redisSpace(t, base), pass, "--broker-password-file", pwFile)
	})
	t.Run("WrongPassword", func(t *testing.T) {
		t.Parallel()
		tg := sqliteTarget(t)
		tg.migrate(t, "outbox_message")
		const wrong = "Not-the-Passw0rd"
		for name, env := range map[string]map[string]string{
			"InURL":        {envBroker: "redis://" + user + ":" + wrong + "@" + redisAddr() + "/0"},
			"FromVariable": {envBroker: base, envBrokerPassword: wrong},
		} {
			var out, errb testdb.SyncBuffer
			code := runEnv(t.Context(), []string{"--dsn", tg.dsn, "relay", "--http", ""}, &out, &errb, func(k string) string { return env[k] })
			stderr := errb.String()
			if code != exitRuntime || !strings.HasPrefix(stderr, "outbox: cannot connect to Redis at redis://"+user) || !strings.Contains(stderr, "WRONGPASS") || strings.Count(stderr, "\n") != 1 {
				t.Errorf("%s: exit %d, want 1 with one line naming Redis and WRONGPASS; stderr:\n%s", name, code, stderr)
			}
			if strings.Contains(stderr, wrong) {
				t.Errorf("%s: the password is on stderr:\n%s", name, stderr)
			}
		}
	})
}

// TestRelayRabbitMQMissingExchange: an exchange that does not exist
// stops the relay at start, exit 1, with a message that says so.
func TestRelayRabbitMQMissingExchange(t *testing.T) {
	t.Parallel()
	if conn, err := amqp.Dial(rabbitURL()); err != nil {
		unavailable(t, "RabbitMQ", err)
	} else {
		_ = conn.Close()
	}
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	var out, errb testdb.SyncBuffer
	code := runEnv(t.Context(), []string{"--dsn", tg.dsn, "relay", "--http", "", "--exchange", "outboxcmd.missing." + uniqueID()}, &out, &errb,
		func(k string) string { return map[string]string{envBroker: rabbitURL()}[k] })
	if stderr := errb.String(); code != exitRuntime || !strings.Contains(stderr, "RabbitMQ at amqp://") || !strings.Contains(stderr, "declare the exchange") {
		t.Errorf("exit %d, want 1 naming the exchange; stderr:\n%s", code, stderr)
	}
}

// TestRelayReadyzFollowsBroker: /readyz follows the chosen broker's
// health check (its publisher's relay.HealthChecker): 503 naming the
// broker while a proxy in front of it refuses connections, 200 again once
// it forwards.
func TestRelayReadyzFollowsBroker(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, target string
		url          func(addr string) string
		args         []string
		up           func(t *testing.T)
	}{
		{"NATS", strings.TrimPrefix(natsURL(), "nats://"), func(addr string) string { return "nats://" + addr }, nil,
			func(t *testing.T) { natsSpace(t, natsURL()) }},
		{"RabbitMQ", "127.0.0.1:5672", func(addr string) string { return "amqp://guest:guest@" + addr + "/" }, []string{"--exchange", "amq.topic"},
			func(t *testing.T) { rabbitSpace(t) }},
		{"Redis", redisAddr(), func(addr string) string { return "redis://" + addr + "/0" }, nil,
			func(t *testing.T) { redisClient(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.up(t) // skips without the broker
			proxy, err := faultproxy.Start(tc.target)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = proxy.Close() })
			tg := sqliteTarget(t)
			tg.migrate(t, "outbox_message")
			env := map[string]string{envBroker: tc.url(proxy.Addr())}
			r := startRelay(t, func(k string) string { return env[k] }, append([]string{"--dsn", tg.dsn, "relay", "--http", freeAddr(t),
				"--lease-ttl", "2s", "--unhealthy-after", "1s"}, tc.args...)...)
			r.waitFor(t, "/readyz 200", func() bool { return r.status("/readyz") == http.StatusOK })
			proxy.Refuse(true)
			r.waitFor(t, "/readyz 503", func() bool { return r.status("/readyz") == http.StatusServiceUnavailable })
			if _, body := get(r.ctx, r.base+"/readyz"); !strings.Contains(body, "broker") {
				t.Errorf("/readyz body does not name the broker: %q", body)
			}
			if code := r.status("/livez"); code != http.StatusOK {
				t.Errorf("/livez %d while the broker is down", code)
			}
			proxy.Refuse(false)
			r.waitFor(t, "/readyz 200 again", func() bool { return r.status("/readyz") == http.StatusOK })
			if code := r.shutdown(t); code != 0 {
				t.Errorf("exit %d; stderr:\n%s", code, r.stderr.String())
			}
			if strings.Contains(r.stderr.String(), "guest:guest") {
				t.Errorf("the password is in the logs:\n%s", r.stderr.String())
			}
		})
	}
}

// TestRelayRabbitMQCredentials: a RabbitMQ user created for the test
// (removed when it ends), named in --broker on the command line with its
// password in --broker-password-file (SASL PLAIN through amqp.Config), or
// the whole URL in OUTBOX_BROKER, publishes end to end without the
// password in the logs; a wrong password stops the relay at start, exit
// 1, without echoing it.
func TestRelayRabbitMQCredentials(t *testing.T) {
	t.Parallel()
	rabbitSpace(t) // skips without RabbitMQ
	u, err := amqp.ParseURI(rabbitURL())
	if err != nil {
		t.Fatal(err)
	}
	host := net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
	user, pass := "outboxcmd-"+uniqueID(), "Rabbit-"+uniqueID()
	privateserver.RabbitMQUser(t, user, pass) // removed when the test ends
	privateserver.Rabbitmqctl(t, "set_permissions", "-p", "/", user, ".*", ".*", ".*")

	t.Run("PasswordFile", func(t *testing.T) {
		t.Parallel()
		pwFile := filepath.Join(t.TempDir(), "password")
		if err := os.WriteFile(pwFile, []byte(pass+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		s := rabbitSpace(t)
		s.env = nil
		logs := relayThrough(t, s, pass, "--broker", "amqp://"+user+"@"+host+"/", "--broker-password-file", pwFile)
		if !strings.Contains(logs, `"broker_url":"amqp://`+user+`@`+host+`/"`) || !strings.Contains(logs, `"user":"`+user+`"`) {
			t.Errorf("logs lack the URL and the user:\n%s", logs)
		}
	})
	t.Run("URLInEnvironment", func(t *testing.T) {
		t.Parallel()
		s := rabbitSpace(t)
		s.env = map[string]string{envBroker: "amqp://" + user + ":" + pass + "@" + host + "/"}
		logs := relayThrough(t, s, pass)
		if !strings.Contains(logs, `"broker_url":"amqp://`+user+`:xxxxx@`+host+`/"`) {
			t.Errorf("logs lack the redacted URL:\n%s", logs)
		}
	})
	t.Run("WrongPassword", func(t *testing.T) {
		t.Parallel()
		tg := sqliteTarget(t)
		tg.migrate(t, "outbox_message")
		const wrong = "Not-the-Rabbit-pw"
		var out, errb testdb.SyncBuffer
		code := runEnv(t.Context(), []string{"--dsn", tg.dsn, "relay", "--http", "", "--broker", "amqp://" + user + "@" + host + "/"}, &out, &errb,
			func(k string) string { return map[string]string{envBrokerPassword: wrong}[k] })
		stderr := errb.String()
		if code != exitRuntime || !strings.Contains(stderr, "outbox: cannot connect to RabbitMQ at amqp://"+user+"@"+host+"/") {
			t.Errorf("exit %d, want 1 naming RabbitMQ; stderr:\n%s", code, stderr)
		}
		if strings.Contains(stderr, wrong) {
			t.Errorf("the password is on stderr:\n%s", stderr)
		}
	})
}

// TestParseBrokerURLServerListCredentials: credentials written after the
// first server of a list ("nats://n1:4222,nats://tok@n2:4222", or each
// server's own "u:p@") are not silently read as one userinfo spanning the
// first servers, which then vanish from the list (the relay connected to
// n2 only, with user "n1" and the rest as its password). Nor is a second
// host of RabbitMQ or Redis, which take one, left to a DNS lookup of
// "h1:5672,h2" (exit 1). All are usage errors naming no secret.
func TestParseBrokerURLServerListCredentials(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		"nats://n1:4222,nats://s3cr3t-tok@n2:4222",
		"nats://alice:pw-one@n1:4222,alice:pw-one@n2:4222",
		"tls://n1,tok3n-abc@n2",
		"kafka://k1:9092,u:s3cr3t@k2:9092",
		"amqp://guest:s3cr3t@h1:5672,h2:5672/",
		"redis://:s3cr3t@h1:6379,h2:6379/0",
	} {
		b, err := parseBrokerURL(in)
		var ee *exitError
		if err == nil || !errors.As(err, &ee) || ee.code != exitUsage {
			t.Errorf("parseBrokerURL(%q) = %+v, %v; want a usage error", in, b, err)
			continue
		}
		for _, s := range []string{"s3cr3t", "pw-one", "tok3n"} {
			if strings.Contains(err.Error(), s) {
				t.Errorf("parseBrokerURL(%q): the error shows a secret: %v", in, err)
			}
		}
	}
	// A percent-encoded ',' or '@' in a password stays allowed.
	b, err := parseBrokerURL("nats://alice:a%2Cb%40c@n1:4222,n2:4222")
	if err != nil || b.password != "a,b@c" || !slices.Equal(b.hosts, []string{"n1:4222", "n2:4222"}) {
		t.Errorf("escaped ',' and '@' in a NATS password: %+v %v", b, err)
	}
	// A ',' in a RabbitMQ password or vhost of one host is no list.
	if b, err := parseBrokerURL("amqp://u:a,b@h1:5672/v,h"); err != nil || b.password != "a,b" {
		t.Errorf("',' in a RabbitMQ password and vhost: %+v %v", b, err)
	}
}

// TestRelayRabbitMQURLTLSParams: amqp091-go's TLS parameters in an
// amqps:// URL (cacertfile, certfile, keyfile, server_name_indication) are
// never read by the relay, whose TLS configuration always comes from the
// --tls flags: the relay silently verified against the system's CAs and
// the host instead of the CA and name the URL gives. They are usage
// errors pointing at the flags, and so are they in an amqp:// URL.
func TestRelayRabbitMQURLTLSParams(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	free := freeAddr(t)
	for _, param := range []string{"cacertfile=/etc/ssl/ca.pem", "certfile=/c.pem&keyfile=/k.pem", "server_name_indication=rabbit.internal"} {
		for _, scheme := range []string{"amqps", "amqp"} {
			u := scheme + "://relay@" + free + "/prod?" + param
			var out, errb testdb.SyncBuffer
			code := runEnv(t.Context(), []string{"--dsn", tg.dsn, "relay", "--http", "", "--broker", u}, &out, &errb, noEnv)
			if stderr := errb.String(); code != exitUsage || !strings.Contains(stderr, "--tls-") {
				t.Errorf("--broker %s: exit %d, want 2 naming the --tls flags; stderr:\n%s", u, code, stderr)
			}
		}
	}
}

// TestBrokerURLPasswordFragmentsRedacted: a password holding an unescaped
// '/', '?', '#' or ':' is cut by url.Parse, whose error (or go-redis's
// path error) then quotes a piece of it ("invalid port \":s3cr3tpw\"
// after host"): scrubbing the whole password missed the piece, printed
// on stderr as the usage error.
func TestBrokerURLPasswordFragmentsRedacted(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	free := freeAddr(t)
	for _, tc := range []struct{ url, piece string }{
		{"redis://:s3cr3tpw/xyz@" + free + "/0", "s3cr3tpw"},
		{"amqp://guest:s3cr3tpw/xyz@" + free + "/", "s3cr3tpw"},
		{"amqp://guest:s3cr3tpw#xyz@" + free + "/", "s3cr3tpw"},
		{"redis://:s3cr3tpw?xyz@" + free + "/0", "s3cr3tpw"},
		{"redis://:1234/secretpart@" + free + "/0", "secretpart"}, // ":1234" parses as a port; the rest is the path
		{"amqp://guest:ab:s3cr3tpw/x@" + free + "/", "s3cr3tpw"},
		// url.Parse reads host "guest", port 1234 and vhost
		// "secretpart@127.0.0.1:.../": accepted, it connected elsewhere.
		{"amqp://guest:1234/secretpart@" + free + "/", "secretpart"},
	} {
		var out, errb testdb.SyncBuffer
		code := runEnv(t.Context(), []string{"--dsn", tg.dsn, "relay", "--http", ""}, &out, &errb,
			func(k string) string { return map[string]string{envBroker: tc.url}[k] })
		if all := errb.String() + out.String(); code != exitUsage || strings.Contains(all, tc.piece) {
			t.Errorf("OUTBOX_BROKER=%s: exit %d, want 2 without %q; output:\n%s", tc.url, code, tc.piece, all)
		}
	}
}

// TestParseBrokerURLMixedNATSSchemes: every server of a NATS list is
// dialled with the first URL's scheme, so "nats://a,tls://b" reached b
// without TLS, as written it must not be (and "tls://a,nats://b" reached b
// over TLS). A server's own scheme other than the first is a usage error.
func TestParseBrokerURLMixedNATSSchemes(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"nats://n1:4222,tls://n2:4222", "tls://n1:4222,nats://n2:4222", "nats://n1,n2,TLS://n3"} {
		b, err := parseBrokerURL(in)
		var ee *exitError
		if err == nil || !errors.As(err, &ee) || ee.code != exitUsage {
			t.Errorf("parseBrokerURL(%q) = %+v, %v; want a usage error", in, b, err)
		}
	}
	if b, err := parseBrokerURL("tls://n1:4222,TLS://n2:4222"); err != nil || !b.tls || len(b.hosts) != 2 {
		t.Errorf("tls:// servers: %+v %v", b, err)
	}
}

// TestScrub: secrets of 8 bytes or more are blanked wherever they appear;
// shorter ones (3 to 7 bytes) only where they are not part of a longer
// word, so the command's own text survives. REGRESSION: the token "tok"
// turned "--broker holds a password or token" into "... or xxxxxen".
func TestScrub(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		msg     string
		secrets []string
		want    string
	}{
		{"--broker holds a password or token", []string{"tok"}, "--broker holds a password or token"},
		{"dial nats://tok@127.0.0.1:4222: refused", []string{"tok"}, "dial nats://xxxxx@127.0.0.1:4222: refused"},
		{`invalid port ":tok" after host`, []string{"tok"}, `invalid port ":xxxxx" after host`},
		{"tok", []string{"tok"}, "xxxxx"},
		{"tokentok tok", []string{"tok"}, "tokentok xxxxx"},
		{"user guest:guest@rabbit", []string{"guest"}, "user xxxxx:xxxxx@rabbit"},
		// A redacted URL keeps its user name even if the password is the
		// same word (guest/guest); the word elsewhere is blanked.
		{"cannot connect to RabbitMQ at amqp://guest:xxxxx@h:5672/: guest refused", []string{"guest"}, "cannot connect to RabbitMQ at amqp://guest:xxxxx@h:5672/: xxxxx refused"},
		{"at amqp://longpassword:xxxxx@h/ longpassword", []string{"longpassword"}, "at amqp://longpassword:xxxxx@h/ xxxxx"},
		{"a p@ss! b", []string{"p@ss!"}, "a xxxxx b"},                           // edges that are not letters need no boundary
		{"x@ss!x", []string{"@ss!"}, "xxxxxxx"},                                 // ... so it is blanked even glued
		{"embeddedS3cr3tPassword", []string{"S3cr3tPassword"}, "embeddedxxxxx"}, // 8 bytes or more: everywhere
		{"ab cd", []string{"ab"}, "ab cd"},                                      // under 3 bytes: never
	} {
		if got := scrub(tc.msg, tc.secrets); got != tc.want {
			t.Errorf("scrub(%q, %q) = %q, want %q", tc.msg, tc.secrets, got, tc.want)
		}
	}
}
