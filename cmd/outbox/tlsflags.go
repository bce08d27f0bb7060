package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/spf13/pflag"
)

// tlsFlags are the relay's TLS settings, the same for every broker.
type tlsFlags struct {
	enable         bool
	caFile         string
	certFile       string
	keyFile        string
	serverName     string
	insecureVerify bool
}

// register declares the --tls flags on fs.
func (k *tlsFlags) register(fs *pflag.FlagSet) {
	fs.BoolVar(&k.enable, "tls", false, "connect to the broker over TLS (implied by the other --tls-* flags; amqps://, rediss:// and tls:// imply it, amqp://, redis:// and nats:// refuse it)")
	envFlag(fs, "tls", "OUTBOX_TLS")
	fs.StringVar(&k.caFile, "tls-ca-file", "", "PEM file of the CA certificates that sign the brokers' certificates (default the system's)")
	envFlag(fs, "tls-ca-file", "OUTBOX_TLS_CA_FILE")
	fs.StringVar(&k.certFile, "tls-cert-file", "", "PEM file of the client certificate, for mutual TLS (needs --tls-key-file)")
	envFlag(fs, "tls-cert-file", "OUTBOX_TLS_CERT_FILE")
	fs.StringVar(&k.keyFile, "tls-key-file", "", "PEM file of the client certificate's private key (needs --tls-cert-file)")
	envFlag(fs, "tls-key-file", "OUTBOX_TLS_KEY_FILE")
	fs.StringVar(&k.serverName, "tls-server-name", "", "name to verify the brokers' certificates against (default the broker's host)")
	envFlag(fs, "tls-server-name", "OUTBOX_TLS_SERVER_NAME")
	fs.BoolVar(&k.insecureVerify, "tls-insecure-skip-verify", false, "do not verify the brokers' certificates (tests only: anyone on the path can impersonate the broker)")
	envFlag(fs, "tls-insecure-skip-verify", "OUTBOX_TLS_INSECURE_SKIP_VERIFY")
}

// requested reports whether any --tls flag asks for TLS.
func (k *tlsFlags) requested() bool {
	return k.enable || k.caFile != "" || k.certFile != "" || k.keyFile != "" || k.serverName != "" || k.insecureVerify
}

// config returns the TLS client configuration of the flags, or nil if
// none asks for TLS and force is false (force: the broker's scheme implies
// TLS). It verifies against --tls-server-name, else serverName ("": the
// client library's default, the host dialled). Mistakes are usage errors;
// an unreadable CA file is a runtime error naming the flag.
func (k *tlsFlags) config(force bool, serverName string) (*tls.Config, error) {
	if !force && !k.requested() {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName, InsecureSkipVerify: k.insecureVerify} //nolint:gosec // opt-in, for tests
	if k.serverName != "" {
		tc.ServerName = k.serverName
	}
	if k.caFile != "" {
		pem, err := os.ReadFile(k.caFile)
		if err != nil {
			return nil, fmt.Errorf("reading --tls-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usageErrorf("--tls-ca-file %s holds no PEM certificate", k.caFile)
		}
		tc.RootCAs = pool
	}
	if (k.certFile == "") != (k.keyFile == "") {
		return nil, usageErrorf("--tls-cert-file and --tls-key-file go together")
	}
	if k.certFile != "" {
		cert, err := tls.LoadX509KeyPair(k.certFile, k.keyFile)
		if err != nil {
			return nil, usageErrorf("loading --tls-cert-file and --tls-key-file: %v", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
