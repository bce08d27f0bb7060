package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/sqloutbox/outbox/driver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
	"github.com/sqloutbox/outbox/outboxtest/kafkatest"
)

// testPKI is a throwaway certificate authority with a server certificate
// for 127.0.0.1 / kafka.test and a client certificate, written as PEM
// files.
type testPKI struct {
	caFile, certFile, keyFile string
	server                    tls.Certificate
	client                    tls.Certificate
	pool                      *x509.CertPool
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "outbox test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage) (tls.Certificate, []byte, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			DNSNames: []string{"kafka.test"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
		keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
		c, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		return c, certPEM, keyPEM
	}
	p := testPKI{caFile: filepath.Join(dir, "ca.pem"), certFile: filepath.Join(dir, "client.pem"), keyFile: filepath.Join(dir, "client-key.pem")}
	p.server, _, _ = leaf(2, "kafka.test", x509.ExtKeyUsageServerAuth)
	var certPEM, keyPEM []byte
	p.client, certPEM, keyPEM = leaf(3, "relay", x509.ExtKeyUsageClientAuth)
	p.pool = x509.NewCertPool()
	p.pool.AddCert(ca)
	for f, b := range map[string][]byte{
		p.caFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), p.certFile: certPEM, p.keyFile: keyPEM,
	} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// serverFiles writes the server certificate and its key as PEM files in
// dir, for a broker server started from files (nats-server,
// redis-server), and returns their paths.
func (p testPKI) serverFiles(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	keyDER, err := x509.MarshalPKCS8PrivateKey(p.server.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	for f, b := range map[string][]byte{
		certFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.server.Certificate[0]}),
		keyFile:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}

const (
	saslUser     = "relay"
	saslPassword = "Kafka-S3cret-pw"
)

// startSecureBroker starts kfake with a TLS listener (client certificates
// required) and SASL PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 users, and a
// consumer that connects the same way.
func startSecureBroker(t *testing.T, pki testPKI) ([]string, *kafkatest.Consumer) {
	t.Helper()
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.SeedTopics(4, "outbox.event.order"),
		kfake.TLS(&tls.Config{Certificates: []tls.Certificate{pki.server}, ClientCAs: pki.pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}),
		kfake.EnableSASL(),
		kfake.Superuser("PLAIN", saslUser, saslPassword),
		kfake.Superuser("SCRAM-SHA-256", saslUser, saslPassword),
		kfake.Superuser("SCRAM-SHA-512", saslUser, saslPassword),
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	addrs := c.ListenAddrs()
	consumer, err := kafkatest.NewConsumer(addrs, []string{"outbox.event.order"},
		kgo.DialTLSConfig(&tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pki.client}, ServerName: "kafka.test", MinVersion: tls.VersionTLS12}),
		kgo.SASL(plain.Auth{User: saslUser, Pass: saslPassword}.AsMechanism()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(consumer.Close)
	return addrs, consumer
}

// runningRelay is an `outbox relay` running in-process.
type runningRelay struct {
	base   string // http://addr
	stderr *testdb.SyncBuffer
	exited chan int
	stop   context.CancelFunc
	ctx    context.Context
}

// startRelay runs `outbox <args>` in the background with environment
// getenv (nil: none), and stops it when t ends.
func startRelay(t *testing.T, getenv func(string) string, args ...string) *runningRelay {
	t.Helper()
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	runCtx, stop := context.WithCancel(ctx)
	r := &runningRelay{stderr: &testdb.SyncBuffer{}, exited: make(chan int, 1), stop: stop, ctx: ctx}
	for i, a := range args {
		if a == "--http" && i+1 < len(args) {
			r.base = "http://" + args[i+1]
		}
	}
	var stdout testdb.SyncBuffer
	go func() { r.exited <- runEnv(runCtx, args, &stdout, r.stderr, getenv) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-r.exited:
		case <-time.After(time.Minute):
			t.Error("relay did not stop")
		}
		cancel()
		// The relay logs an order violation at ERROR (relay.OrderObserver).
		if out := r.stderr.String(); strings.Contains(out, "first delivery order may be broken") {
			t.Errorf("the relay reported an order violation:\n%s", out)
		}
	})
	return r
}

// waitFor polls cond until it holds, failing t if the relay exits first.
func (r *runningRelay) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitForRelay(t, r.ctx, r.exited, r.stderr, what, cond)
}

// status returns the HTTP status of path ("/readyz").
func (r *runningRelay) status(path string) int {
	code, _ := get(r.ctx, r.base+path)
	return code
}

// shutdown stops the relay and returns its exit code.
func (r *runningRelay) shutdown(t *testing.T) int {
	t.Helper()
	r.stop()
	select {
	case code := <-r.exited:
		r.exited <- code // for the cleanup
		return code
	case <-r.ctx.Done():
		t.Fatal("relay did not stop")
		return -1
	}
}

// TestRelaySecureKafka: the standalone relay publishes through TLS with a
// client certificate and SASL, with each mechanism, the password from a
// file or from OUTBOX_SASL_PASSWORD, and logs neither the SASL password
// nor the DSN's.
func TestRelaySecureKafka(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	brokers, consumer := startSecureBroker(t, pki)
	pwFile := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pwFile, []byte(saslPassword+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, mechanism, compression string
		fromEnv, skipVerify          bool
	}{
		{"PLAIN", "PLAIN", "gzip", false, false},
		{"SCRAM-SHA-256", "SCRAM-SHA-256", "lz4", false, false},
		{"SCRAM-SHA-512", "SCRAM-SHA-512", "zstd", true, false},
		{"SkipVerify", "SCRAM-SHA-256", "snappy", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// PostgreSQL with a password in the DSN (one trust
			// authentication ignores), to show the logs hold neither.
			tg := serverTarget(t, driver.Postgres)
			dsnSecret := withPassword(t, &tg)
			table := randomTable()
			tg.migrate(t, table)
			args := []string{"--dsn", tg.dsn, "--table", table, "relay", "--brokers", strings.Join(brokers, ","),
				"--http", freeAddr(t), "--lease-ttl", "2s",
				"--tls-cert-file", pki.certFile, "--tls-key-file", pki.keyFile,
				"--sasl-mechanism", tc.mechanism, "--sasl-user", saslUser,
				"--client-id", "outbox-secure-test", "--kafka-version", "3.6.0", "--compression", tc.compression}
			if tc.skipVerify {
				args = append(args, "--tls-insecure-skip-verify")
			} else {
				args = append(args, "--tls-ca-file", pki.caFile, "--tls-server-name", "kafka.test")
			}
			env := map[string]string{}
			if tc.fromEnv {
				env[envSASLPassword] = saslPassword
			} else {
				args = append(args, "--sasl-password-file", pwFile)
			}
			r := startRelay(t, func(k string) string { return env[k] }, args...)
			r.waitFor(t, "/readyz 200", func() bool { return r.status("/readyz") == http.StatusOK })

			db, _ := tg.wrappedDB(t, table)
			ids := emit(t, db, "secure-"+tc.mechanism)
			if _, err := consumer.Wait(r.ctx, func(recs []kafkatest.Record) bool {
				for _, rec := range recs {
					if rec.Headers["outbox-message-id"] == ids[0] {
						return true
					}
				}
				return false
			}); err != nil {
				t.Fatalf("record not consumed: %v; stderr:\n%s", err, r.stderr.String())
			}
			if code := r.shutdown(t); code != 0 {
				t.Errorf("exit %d; stderr:\n%s", code, r.stderr.String())
			}
			logs := r.stderr.String()
			if strings.Contains(logs, saslPassword) {
				t.Errorf("the SASL password is in the logs:\n%s", logs)
			}
			if dsnSecret != "" && strings.Contains(logs, dsnSecret) {
				t.Errorf("the DSN's password is in the logs:\n%s", logs)
			}
			checkLogDurations(t, logs)
			if dsnSecret == "" {
				t.Log("the PostgreSQL server checks passwords: no DSN password to look for")
			}
			for _, want := range []string{`"tls":true`, `"sasl_mechanism":"` + tc.mechanism + `"`, `"sasl_user":"relay"`, `"client_id":"outbox-secure-test"`} {
				if !strings.Contains(logs, want) {
					t.Errorf("start-up log lacks %s:\n%s", want, logs)
				}
			}
		})
	}
}

// TestRelaySecureKafkaRefused: a wrong password, a CA that did not sign
// the broker's certificate, and a missing client certificate each stop the
// relay at start (exit 1) with one line that says why.
func TestRelaySecureKafkaRefused(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	other := newTestPKI(t)
	brokers, _ := startSecureBroker(t, pki)
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	base := []string{"--dsn", tg.dsn, "--timeout", "20s", "relay", "--brokers", strings.Join(brokers, ","), "--http", "",
		"--tls-server-name", "kafka.test", "--sasl-mechanism", "SCRAM-SHA-512", "--sasl-user", saslUser}
	for _, tc := range []struct {
		name     string
		args     []string
		password string
		want     string
	}{
		{"WrongPassword", []string{"--tls-ca-file", pki.caFile, "--tls-cert-file", pki.certFile, "--tls-key-file", pki.keyFile}, "not-the-password", "SASL authentication fails"},
		{"UntrustedCA", []string{"--tls-ca-file", other.caFile, "--tls-cert-file", pki.certFile, "--tls-key-file", pki.keyFile}, saslPassword, "certificate signed by unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out, errb testdb.SyncBuffer
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			code := runEnv(ctx, append(append([]string{}, base...), tc.args...), &out, &errb,
				func(k string) string { return map[string]string{envSASLPassword: tc.password}[k] })
			stderr := errb.String()
			var last string
			if lines := strings.Split(strings.TrimSpace(stderr), "\n"); len(lines) > 0 {
				last = lines[len(lines)-1]
			}
			if code != exitRuntime || !strings.HasPrefix(last, "outbox: cannot connect to Kafka brokers") || !strings.Contains(last, tc.want) {
				t.Errorf("exit %d, want 1 with a last line naming %q; stderr:\n%s", code, tc.want, stderr)
			}
			if strings.Contains(stderr, tc.password) {
				t.Errorf("the password is on stderr:\n%s", stderr)
			}
		})
	}
}

// TestRelayKafkaUsageErrors: Kafka settings the relay cannot use are
// usage errors (exit 2) before anything is contacted, and a password on
// the command line is refused without being echoed.
func TestRelayKafkaUsageErrors(t *testing.T) {
	t.Parallel()
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	missing := filepath.Join(t.TempDir(), "missing.pem")
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		code int
		want string
	}{
		{[]string{"--sasl-password", "hunter2"}, nil, exitUsage, "--sasl-password is refused"},
		{[]string{"--sasl-mechanism", "GSSAPI", "--sasl-user", "u"}, nil, exitUsage, "invalid --sasl-mechanism"},
		{[]string{"--sasl-mechanism", "PLAIN"}, nil, exitUsage, "needs --sasl-user"},
		{[]string{"--sasl-mechanism", "PLAIN", "--sasl-user", "u"}, nil, exitUsage, "needs a password"},
		{[]string{"--sasl-user", "u"}, nil, exitUsage, "need --sasl-mechanism"},
		{[]string{"--sasl-mechanism", "PLAIN", "--sasl-user", "u", "--sasl-password-file", missing}, nil, exitRuntime, "reading --sasl-password-file"},
		{[]string{"--sasl-mechanism", "PLAIN", "--sasl-user", "u", "--sasl-password-file", notPEM}, map[string]string{envSASLPassword: "x"}, exitUsage, "not both"},
		{[]string{"--kafka-version", "banana"}, nil, exitUsage, "invalid --kafka-version"},
		{[]string{"--kafka-version", "0.10.2.0"}, nil, exitUsage, "older than 0.11.0"},
		{[]string{"--compression", "brotli"}, nil, exitUsage, "invalid --compression"},
		{[]string{"--compression", "zstd", "--kafka-version", "2.0.0"}, nil, exitUsage, "zstd needs"},
		{[]string{"--client-id", ""}, nil, exitUsage, "--client-id must not be empty"},
		{[]string{"--kafka-transactional-id-prefix", "svc.", "--kafka-version", "2.4.0"}, nil, exitUsage, "needs --kafka-version 2.5.0 or later"},
		{[]string{"--kafka-transactional-id-prefix", "svc.", "--kafka-transaction-timeout", "5s"}, nil, exitUsage, "--kafka-transaction-timeout must exceed"},
		{nil, map[string]string{"OUTBOX_KAFKA_TRANSACTIONAL_ID_PREFIX": "svc.", "OUTBOX_KAFKA_TRANSACTION_TIMEOUT": "16m"}, exitUsage, "at most 15m"},
		{[]string{"--tls-cert-file", notPEM}, nil, exitUsage, "go together"},
		{[]string{"--tls-ca-file", notPEM}, nil, exitUsage, "holds no PEM certificate"},
		{[]string{"--tls-ca-file", missing}, nil, exitRuntime, "reading --tls-ca-file"},
		{nil, map[string]string{"OUTBOX_COMPRESSION": "brotli"}, exitUsage, "invalid --compression"},
		{[]string{"--unhealthy-after", "0s"}, nil, exitUsage, "--unhealthy-after and --stall-timeout must be positive"},
		{[]string{"--stall-timeout", "5s"}, nil, exitUsage, "--stall-timeout must exceed"},
		{[]string{"--progress", "-1s"}, nil, exitUsage, "--progress must be positive"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			var out, errb testdb.SyncBuffer
			args := append([]string{"--dsn", tg.dsn, "relay", "--brokers", freeAddr(t), "--http", ""}, tc.args...)
			code := runEnv(t.Context(), args, &out, &errb, func(k string) string { return tc.env[k] })
			stderr := errb.String()
			if code != tc.code || !strings.Contains(stderr, tc.want) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("exit %d, want %d with one line containing %q; stderr:\n%s", code, tc.code, tc.want, stderr)
			}
			if strings.Contains(stderr, "hunter2") {
				t.Errorf("the refused password is echoed: %s", stderr)
			}
		})
	}
}
