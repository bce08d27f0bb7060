package main

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"

	"github.com/sqloutbox/outbox/internal/testkit/privateserver"
	"github.com/sqloutbox/outbox/internal/testkit/testdb"
)

// privateNATS starts a nats-server of this test's own on a free port
// (privateserver.NATSServer: the shared server is never touched): TLS
// with pki's server certificate, client certificates required, JetStream
// in a temporary directory and one user. It returns the server's tls://
// URL and the client TLS configuration that connects to it.
func privateNATS(t *testing.T, pki testPKI, user, password string) (string, *tls.Config) {
	t.Helper()
	addr := privateserver.NATSServer(t, func(dir string) string {
		certFile, keyFile := pki.serverFiles(t, dir)
		return fmt.Sprintf(`jetstream { store_dir: %q, max_memory_store: 67108864, max_file_store: 67108864 }
tls { cert_file: %q, key_file: %q, ca_file: %q, verify: true, timeout: 5 }
authorization { user: %q, password: %q }
`, filepath.Join(dir, "js"), certFile, keyFile, pki.caFile, user, password)
	})
	tc := &tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pki.client}, MinVersion: tls.VersionTLS12}
	return "tls://" + addr, tc
}

// TestRelayNATSTLS: the relay reaches a private NATS server over TLS
// with a client certificate (tls:// and the --tls flags) and user and
// password (in OUTBOX_BROKER, or the user in --broker and the password in
// --broker-password-file), publishes end to end, and logs no password; a
// CA that did not sign the server's certificate and a wrong password stop
// it at start, exit 1, without echoing the password.
func TestRelayNATSTLS(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	const user, password = "relay", "N4ts-TLS-secret"
	url, tc := privateNATS(t, pki, user, password)
	host := strings.TrimPrefix(url, "tls://")
	withPass := "tls://" + user + ":" + password + "@" + host
	tlsArgs := []string{"--tls-ca-file", pki.caFile, "--tls-cert-file", pki.certFile, "--tls-key-file", pki.keyFile}

	t.Run("URLInEnvironment", func(t *testing.T) {
		t.Parallel()
		s := natsSpace(t, url, nats.Secure(tc), nats.UserInfo(user, password))
		s.env = map[string]string{envBroker: withPass}
		logs := relayThrough(t, s, password, tlsArgs...)
		for _, want := range []string{`"broker_url":"tls://relay:xxxxx@` + host + `"`, `"tls":true`, `"user":"relay"`} {
			if !strings.Contains(logs, want) {
				t.Errorf("logs lack %s:\n%s", want, logs)
			}
		}
	})
	t.Run("PasswordFile", func(t *testing.T) {
		t.Parallel()
		pwFile := filepath.Join(t.TempDir(), "password")
		if err := os.WriteFile(pwFile, []byte(password+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		s := natsSpace(t, url, nats.Secure(tc), nats.UserInfo(user, password))
		logs := relayThrough(t, s, password, append([]string{"--broker", "tls://" + user + "@" + host, "--broker-password-file", pwFile}, tlsArgs...)...)
		if !strings.Contains(logs, `"broker_url":"tls://relay@`+host+`"`) || !strings.Contains(logs, `"user":"relay"`) {
			t.Errorf("logs lack the URL and the user (a user, not a token: the password came separately):\n%s", logs)
		}
	})
	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		other := newTestPKI(t)
		checkRefused(t, "outbox: cannot connect to NATS at tls://relay:xxxxx@"+host, []string{password, "Wr0ng-password"},
			refusal{"UntrustedCA", withPass, "certificate signed by unknown authority", []string{"--tls-ca-file", other.caFile, "--tls-cert-file", pki.certFile, "--tls-key-file", pki.keyFile}},
			refusal{"WrongPassword", "tls://" + user + ":Wr0ng-password@" + host, "uthorization Violation (check the user in --broker and the password in OUTBOX_BROKER_PASSWORD or --broker-password-file)", tlsArgs},
			refusal{"NoClientCertificate", withPass, "", []string{"--tls-ca-file", pki.caFile}},
		)
	})
}

// privateRedis starts a redis-server of this test's own on a free port
// (privateserver.RedisTLSServer: the shared server is never touched):
// TLS only, with pki's server certificate, client certificates required,
// and password for the user "default" (--requirepass). It returns the
// server's address and a client that reaches it over TLS.
func privateRedis(t *testing.T, pki testPKI, password string) (string, *redis.Client) {
	t.Helper()
	certFile, keyFile := pki.serverFiles(t, t.TempDir())
	addr := privateserver.RedisTLSServer(t, certFile, keyFile, pki.caFile, "--tls-auth-clients", "yes", "--requirepass", password)
	c := redis.NewClient(&redis.Options{Addr: addr, Password: password,
		TLSConfig: &tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pki.client}, MinVersion: tls.VersionTLS12}})
	t.Cleanup(func() { _ = c.Close() })
	return addr, c
}

// TestRelayRedisTLS: the relay reaches a private Redis over TLS with a
// client certificate (rediss:// and the --tls flags) and a password (in
// OUTBOX_BROKER, or the user in --broker and the password in
// --broker-password-file), publishes end to end, and logs no password; a
// CA that did not sign the server's certificate, a wrong password and a
// missing client certificate stop it at start, exit 1, without echoing
// the password.
func TestRelayRedisTLS(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	const password = "R3dis-TLS-secret"
	addr, c := privateRedis(t, pki, password)
	withPass := "rediss://default:" + password + "@" + addr + "/0"
	tlsArgs := []string{"--tls-ca-file", pki.caFile, "--tls-cert-file", pki.certFile, "--tls-key-file", pki.keyFile}

	t.Run("URLInEnvironment", func(t *testing.T) {
		t.Parallel()
		s := redisSpaceOn(t, c, "")
		s.args = s.args[2:] // no --broker: OUTBOX_BROKER
		s.env = map[string]string{envBroker: withPass}
		logs := relayThrough(t, s, password, tlsArgs...)
		for _, want := range []string{`"broker_url":"rediss://default:xxxxx@` + addr + `/0"`, `"tls":true`, `"user":"default"`} {
			if !strings.Contains(logs, want) {
				t.Errorf("logs lack %s:\n%s", want, logs)
			}
		}
	})
	t.Run("PasswordFile", func(t *testing.T) {
		t.Parallel()
		pwFile := filepath.Join(t.TempDir(), "password")
		if err := os.WriteFile(pwFile, []byte(password+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		logs := relayThrough(t, redisSpaceOn(t, c, "rediss://default@"+addr+"/0"), password, append([]string{"--broker-password-file", pwFile}, tlsArgs...)...)
		if !strings.Contains(logs, `"broker_url":"rediss://default@`+addr+`/0"`) || !strings.Contains(logs, `"tls":true`) {
			t.Errorf("logs lack the URL and TLS:\n%s", logs)
		}
	})
	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		other := newTestPKI(t)
		checkRefused(t, "outbox: cannot connect to Redis at rediss://default:xxxxx@"+addr+"/0", []string{password, "Wr0ng-password"},
			refusal{"UntrustedCA", withPass, "certificate signed by unknown authority", []string{"--tls-ca-file", other.caFile, "--tls-cert-file", pki.certFile, "--tls-key-file", pki.keyFile}},
			refusal{"WrongPassword", "rediss://default:Wr0ng-password@" + addr + "/0", "(check the user in --broker and the password in OUTBOX_BROKER_PASSWORD or --broker-password-file)", tlsArgs},
			// Any reason: with TLS 1.3 the server's alert (certificate
			// required) races the client's first write (connection reset).
			refusal{"NoClientCertificate", withPass, "", []string{"--tls-ca-file", pki.caFile}},
		)
	})
}

// refusal is a broker setting the relay must refuse at start: url in
// OUTBOX_BROKER, args after `relay`, and want in the reason ("": any).
type refusal struct {
	name, url, want string
	args            []string
}

// checkRefused runs `outbox relay` with each refusal against a fresh
// SQLite outbox and checks that it exits 1 with one line on stderr that
// begins with prefix (the broker and its redacted URL) and contains the
// refusal's want, and that none of secrets is on stderr.
func checkRefused(t *testing.T, prefix string, secrets []string, cases ...refusal) {
	t.Helper()
	tg := sqliteTarget(t)
	tg.migrate(t, "outbox_message")
	for _, c := range cases {
		var out, errb testdb.SyncBuffer
		code := runEnv(t.Context(), append([]string{"--dsn", tg.dsn, "--timeout", "20s", "relay", "--http", ""}, c.args...), &out, &errb,
			func(k string) string { return map[string]string{envBroker: c.url}[k] })
		stderr := errb.String()
		if code != exitRuntime || !strings.HasPrefix(stderr, prefix) || !strings.Contains(stderr, c.want) || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%s: exit %d, want 1 with one line beginning %q and naming %q; stderr:\n%s", c.name, code, prefix, c.want, stderr)
		}
		for _, secret := range secrets {
			if strings.Contains(stderr, secret) {
				t.Errorf("%s: a password is on stderr:\n%s", c.name, stderr)
			}
		}
	}
}
