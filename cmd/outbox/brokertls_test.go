package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sqloutbox/outbox/internal/testdb"
)

// natsServerBin is the nats-server binary of the test machine; tests that
// need a private server skip without it.
func natsServerBin() string { return envOr("OUTBOX_TEST_NATS_SERVER", "/usr/sbin/nats-server") }

// privateNATS starts a nats-server of this test's own on a free port: TLS
// with pki's server certificate, client certificates required, JetStream
// in a temporary directory and one user. It is stopped when t ends (the
// shared server is never touched). It returns the server's tls:// URL and
// the client TLS configuration that connects to it.
func privateNATS(t *testing.T, pki testPKI, user, password string) (string, *tls.Config) {
	t.Helper()
	bin := natsServerBin()
	if _, err := os.Stat(bin); err != nil {
		// CI and this project's machines have it (the shared NATS runs
		// from it): there its absence is a failure, not a skip.
		if os.Getenv("OUTBOX_TEST_REQUIRE") != "" {
			t.Fatalf("no nats-server binary at %s (OUTBOX_TEST_REQUIRE is set; set OUTBOX_TEST_NATS_SERVER): %v", bin, err)
		}
		t.Skipf("SKIP: no nats-server binary at %s (set OUTBOX_TEST_NATS_SERVER): %v", bin, err)
	}
	dir := t.TempDir()
	keyDER, err := x509.MarshalPKCS8PrivateKey(pki.server.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	for f, b := range map[string][]byte{
		certFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: pki.server.Certificate[0]}),
		keyFile:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	addr := freeAddr(t)
	conf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, `listen: %q
jetstream { store_dir: %q, max_memory_store: 67108864, max_file_store: 67108864 }
tls { cert_file: %q, key_file: %q, ca_file: %q, verify: true, timeout: 5 }
authorization { user: %q, password: %q }
`, addr, filepath.Join(dir, "js"), certFile, keyFile, pki.caFile, user, password), 0o600); err != nil {
		t.Fatal(err)
	}
	var out testdb.SyncBuffer
	cmd := exec.Command(bin, "-c", conf)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // the server this test started, by its pid
		<-exited
	})
	tc := &tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pki.client}, MinVersion: tls.VersionTLS12}
	url := "tls://" + addr
	deadline := time.Now().Add(60 * time.Second)
	for {
		nc, err := nats.Connect(url, nats.Secure(tc), nats.UserInfo(user, password), nats.Timeout(2*time.Second))
		if err == nil {
			nc.Close()
			return url, tc
		}
		select {
		case err := <-exited:
			t.Fatalf("nats-server exited: %v\n%s", err, out.String())
		case <-time.After(50 * time.Millisecond): // polling for the server to listen
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server at %s did not accept a TLS connection: %v\n%s", addr, err, out.String())
		}
	}
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
