package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/sqloutbox/outbox/internal/privateserver"
	"github.com/sqloutbox/outbox/internal/testdb"
)

// privateNATS starts a nats-server of this test's own on a free port
// (privateserver.NATSServer: the shared server is never touched): TLS
// with pki's server certificate, client certificates required, JetStream
// in a temporary directory and one user. It returns the server's tls://
// URL and the client TLS configuration that connects to it.
func privateNATS(t *testing.T, pki testPKI, user, password string) (string, *tls.Config) {
	t.Helper()
	keyDER, err := x509.MarshalPKCS8PrivateKey(pki.server.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	addr := privateserver.NATSServer(t, func(dir string) string {
		certFile, keyFile := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
		for f, b := range map[string][]byte{
			certFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pki.server.Certificate[0]}),
			keyFile:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		} {
			if err := os.WriteFile(f, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
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
		tg := sqliteTarget(t)
		tg.migrate(t, "outbox_message")
		for _, c := range []struct {
			name, url, want string
			args            []string
		}{
			{"UntrustedCA", withPass, "certificate signed by unknown authority", []string{"--tls-ca-file", other.caFile, "--tls-cert-file", pki.certFile, "--tls-key-file", pki.keyFile}},
			{"WrongPassword", "tls://" + user + ":Wr0ng-password@" + host, "uthorization", tlsArgs},
			{"NoClientCertificate", withPass, "", []string{"--tls-ca-file", pki.caFile}},
		} {
			var out, errb testdb.SyncBuffer
			code := runEnv(t.Context(), append([]string{"--dsn", tg.dsn, "--timeout", "20s", "relay", "--http", ""}, c.args...), &out, &errb,
				func(k string) string { return map[string]string{envBroker: c.url}[k] })
			stderr := errb.String()
			if code != exitRuntime || !strings.Contains(stderr, "outbox: cannot connect to NATS at tls://relay:xxxxx@"+host) || !strings.Contains(stderr, c.want) {
				t.Errorf("%s: exit %d, want 1 naming NATS and %q; stderr:\n%s", c.name, code, c.want, stderr)
			}
			if strings.Contains(stderr, password) || strings.Contains(stderr, "Wr0ng-password") {
				t.Errorf("%s: a password is on stderr:\n%s", c.name, stderr)
			}
		}
	})
}
