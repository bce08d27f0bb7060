package privateserver

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"database/sql"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/lib/pq"
)

// TestNATSServer: a private server starts on its own port with the given
// config (JetStream in the test's directory), greets with INFO, and is
// gone once its test has ended.
func TestNATSServer(t *testing.T) {
	t.Parallel()
	var addr string
	t.Run("server", func(t *testing.T) {
		addr = NATSServer(t, func(dir string) string { return "jetstream { store_dir: \"" + dir + "/js\" }" })
		if addr == "127.0.0.1:4222" {
			t.Fatalf("the private server took the shared server's address %s", addr)
		}
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "INFO ") || !strings.Contains(line, `"jetstream":true`) {
			t.Fatalf("greeting %q, %v: want INFO with jetstream", line, err)
		}
	})
	// The subtest's cleanup killed the server and waited for it to exit.
	if c, err := net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after the test ended", addr)
	}
}

// TestRedisServer: a private redis-server starts on its own port with
// the given arguments and answers PING.
func TestRedisServer(t *testing.T) {
	t.Parallel()
	addr := RedisServer(t, "--maxmemory", "10mb")
	if addr == "127.0.0.1:6379" {
		t.Fatalf("the private server took the shared server's address %s", addr)
	}
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("CONFIG GET maxmemory\r\n")); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	var lines []string
	for range 5 { // *2, $9, maxmemory, $8, 10485760
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, strings.TrimSpace(line))
	}
	if lines[4] != "10485760" {
		t.Errorf("CONFIG GET maxmemory = %q, want the argument given (10485760)", lines)
	}
}

// TestRedisTLSServer: a private redis-server listens with TLS only, asks
// for a client certificate signed by the CA given and for the password
// given, and answers PING to a client that has both.
func TestRedisTLSServer(t *testing.T) {
	t.Parallel()
	caFile, certFile, keyFile, client, pool := testCerts(t)
	addr := RedisTLSServer(t, certFile, keyFile, caFile, "--requirepass", "Pr1vate-pw")
	if addr == "127.0.0.1:6379" {
		t.Fatalf("the private server took the shared server's address %s", addr)
	}
	roundTrip := func(certs []tls.Certificate, cmd string) (string, error) {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
			&tls.Config{RootCAs: pool, Certificates: certs, MinVersion: tls.VersionTLS12})
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte(cmd)); err != nil {
			return "", err
		}
		r := bufio.NewReader(c)
		var replies []string
		for range strings.Count(cmd, "\r\n") {
			line, err := r.ReadString('\n')
			if err != nil {
				return strings.Join(replies, ""), err
			}
			replies = append(replies, line)
		}
		return strings.Join(replies, ""), nil
	}
	if got, err := roundTrip([]tls.Certificate{client}, "AUTH Pr1vate-pw\r\nPING\r\n"); err != nil || got != "+OK\r\n+PONG\r\n" {
		t.Errorf("with the client certificate and the password: %q, %v; want +OK, +PONG", got, err)
	}
	if got, err := roundTrip([]tls.Certificate{client}, "PING\r\n"); err != nil || !strings.HasPrefix(got, "-NOAUTH") {
		t.Errorf("without the password: %q, %v; want -NOAUTH", got, err)
	}
	if got, err := roundTrip(nil, "AUTH Pr1vate-pw\r\n"); err == nil {
		t.Errorf("without a client certificate the server answered %q", got)
	}
	if c, err := net.DialTimeout("tcp", addr, 5*time.Second); err == nil { // plain text on the TLS port
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = c.Write([]byte("PING\r\n"))
		if line, err := bufio.NewReader(c).ReadString('\n'); err == nil {
			t.Errorf("a plain-text PING was answered %q", line)
		}
	}
}

// testCerts writes a throwaway CA and a server certificate for 127.0.0.1
// (PEM files in a temporary directory) and returns them with a client
// certificate the CA signed and a pool trusting the CA.
func testCerts(t *testing.T) (caFile, certFile, keyFile string, client tls.Certificate, pool *x509.CertPool) {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "privateserver test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leaf := func(serial int64, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(serial),
			Subject: pkix.Name{CommonName: "127.0.0.1"}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	}
	caFile, certFile, keyFile = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	serverCert, serverKey := leaf(2, x509.ExtKeyUsageServerAuth)
	for f, b := range map[string][]byte{caFile: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), certFile: serverCert, keyFile: serverKey} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if client, err = tls.X509KeyPair(leaf(3, x509.ExtKeyUsageClientAuth)); err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AddCert(ca)
	return caFile, certFile, keyFile, client, pool
}

// TestPostgres: a private PostgreSQL server takes settings that need a
// restart (wal_level), keeps committed rows through Crash and Start, and
// is reachable at its DSN.
func TestPostgres(t *testing.T) {
	t.Parallel()
	s := StartPostgres(t, map[string]string{"wal_level": "logical"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := sql.Open("postgres", s.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var level string
	if err := db.QueryRowContext(ctx, "SHOW wal_level").Scan(&level); err != nil || level != "logical" {
		t.Fatalf("wal_level %q, %v; want logical", level, err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE kept (n int); INSERT INTO kept VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	s.Crash(t)
	s.Start(t)
	var n int
	if err := db.QueryRowContext(ctx, "SELECT n FROM kept").Scan(&n); err != nil || n != 1 {
		t.Fatalf("after a crash and a restart: %d, %v; want the committed row", n, err)
	}
}
