package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/spf13/pflag"
	"github.com/xdg-go/scram"

	"github.com/sqloutbox/outbox/relay"
	"github.com/sqloutbox/outbox/relay/kafka"
)

// envSASLPassword is the one way besides --sasl-password-file to give the
// SASL password: never a flag, since argv is visible to every user of the
// host (ps, /proc/PID/cmdline).
const envSASLPassword = "OUTBOX_SASL_PASSWORD"

// kafkaFlags are the relay's Kafka client settings.
type kafkaFlags struct {
	clientID    string
	version     string
	compression string

	saslMechanism string
	saslUser      string
	saslPassFile  string
	saslPassArgv  string // a refused --sasl-password, only to explain the refusal

	// txnPrefix, if set, turns on the exactly-once mode
	// (kafka.ExactlyOnce.TransactionalIDPrefix).
	txnPrefix  string
	txnTimeout time.Duration
}

func (k *kafkaFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&k.clientID, "client-id", "outbox-relay", "Kafka client ID the producer sends (broker logs, quotas, ACLs)")
	envFlag(fs, "client-id", "OUTBOX_CLIENT_ID")
	fs.StringVar(&k.version, "kafka-version", "", "Kafka protocol version to speak, e.g. 3.6.0 (default sarama's, "+sarama.NewConfig().Version.String()+"; at least 0.11.0)")
	envFlag(fs, "kafka-version", "OUTBOX_KAFKA_VERSION")
	fs.StringVar(&k.compression, "compression", "none", "record batch compression: none, gzip, snappy, lz4 or zstd")
	envFlag(fs, "compression", "OUTBOX_COMPRESSION")

	fs.StringVar(&k.saslMechanism, "sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (default no SASL)")
	envFlag(fs, "sasl-mechanism", "OUTBOX_SASL_MECHANISM")
	fs.StringVar(&k.saslUser, "sasl-user", "", "SASL user name")
	envFlag(fs, "sasl-user", "OUTBOX_SASL_USER")
	fs.StringVar(&k.saslPassFile, "sasl-password-file", "", "file holding the SASL password (one trailing newline is ignored); or set "+envSASLPassword)
	envFlag(fs, "sasl-password-file", "OUTBOX_SASL_PASSWORD_FILE")
	fs.StringVar(&k.txnPrefix, "kafka-transactional-id-prefix", "", "turn on the exactly-once mode: each relay partition publishes through a transactional producer named <prefix><table>.<partition>, one transaction per batch; needs the topic <prefix><table>.outbox-txn (1 partition), consumers at read_committed and Kafka 2.5 or later")
	envFlag(fs, "kafka-transactional-id-prefix", "OUTBOX_KAFKA_TRANSACTIONAL_ID_PREFIX")
	fs.DurationVar(&k.txnTimeout, "kafka-transaction-timeout", kafka.DefaultTransactionTimeout, "with --kafka-transactional-id-prefix: transaction.timeout.ms; more than the publish timeout ("+relay.DefaultPublishTimeout.String()+"), at most 15m")
	envFlag(fs, "kafka-transaction-timeout", "OUTBOX_KAFKA_TRANSACTION_TIMEOUT")
	// Declared only to refuse it with an explanation instead of "unknown
	// flag"; its value is never shown.
	fs.StringVar(&k.saslPassArgv, "sasl-password", "", "refused: use --sasl-password-file or "+envSASLPassword)
	_ = fs.MarkHidden("sasl-password")
}

// errSecretInArgv is the usage error for a secret given as a flag.
var errSecretInArgv = errors.New("--sasl-password is refused: a password on the command line is visible to every user of the host; use --sasl-password-file or " + envSASLPassword)

// saramaConfig builds the producer configuration from the flags and tc,
// the TLS configuration of the --tls flags (nil: no TLS); getenv reads
// OUTBOX_SASL_PASSWORD. Mistakes are usage errors (exit 2); an unreadable
// file is a runtime error naming the flag.
func (k *kafkaFlags) saramaConfig(getenv func(string) string, tc *tls.Config) (*sarama.Config, error) {
	if k.saslPassArgv != "" {
		return nil, &exitError{code: exitUsage, msg: errSecretInArgv.Error()}
	}
	sc := sarama.NewConfig()
	if k.clientID == "" {
		return nil, usageErrorf("--client-id must not be empty")
	}
	sc.ClientID = k.clientID
	if k.version != "" {
		v, err := sarama.ParseKafkaVersion(k.version)
		if err != nil {
			return nil, usageErrorf("invalid --kafka-version %q: %v", k.version, err)
		}
		if !v.IsAtLeast(sarama.V0_11_0_0) {
			return nil, usageErrorf("--kafka-version %s is older than 0.11.0 (record headers and idempotence need it)", k.version)
		}
		sc.Version = v
	}
	if k.txnPrefix != "" {
		if k.txnTimeout <= relay.DefaultPublishTimeout || k.txnTimeout > 15*time.Minute {
			return nil, usageErrorf("--kafka-transaction-timeout must exceed the publish timeout (%s) and be at most 15m (the brokers' default transaction.max.timeout.ms), got %s", relay.DefaultPublishTimeout, k.txnTimeout)
		}
		switch {
		case k.version == "":
			sc.Version = sarama.V2_5_0_0 // the mode's least (KIP-447)
		case !sc.Version.IsAtLeast(sarama.V2_5_0_0):
			return nil, usageErrorf("--kafka-transactional-id-prefix needs --kafka-version 2.5.0 or later, got %s", k.version)
		}
	}
	switch strings.ToLower(k.compression) {
	case "", "none":
		sc.Producer.Compression = sarama.CompressionNone
	case "gzip":
		sc.Producer.Compression = sarama.CompressionGZIP
	case "snappy":
		sc.Producer.Compression = sarama.CompressionSnappy
	case "lz4":
		sc.Producer.Compression = sarama.CompressionLZ4
	case "zstd":
		if !sc.Version.IsAtLeast(sarama.V2_1_0_0) {
			return nil, usageErrorf("--compression zstd needs --kafka-version 2.1.0 or later, got %s", sc.Version)
		}
		sc.Producer.Compression = sarama.CompressionZSTD
	default:
		return nil, usageErrorf("invalid --compression %q: want none, gzip, snappy, lz4 or zstd", k.compression)
	}
	if tc != nil {
		sc.Net.TLS.Enable = true
		sc.Net.TLS.Config = tc
	}
	if err := k.saslConfig(sc, getenv); err != nil {
		return nil, err
	}
	if err := sc.Validate(); err != nil {
		return nil, usageErrorf("invalid Kafka settings: %v", err)
	}
	return sc, nil
}

func (k *kafkaFlags) saslConfig(sc *sarama.Config, getenv func(string) string) error {
	if k.saslMechanism == "" {
		if k.saslUser != "" || k.saslPassFile != "" {
			return usageErrorf("--sasl-user and --sasl-password-file need --sasl-mechanism")
		}
		return nil
	}
	var gen func() sarama.SCRAMClient
	switch m := strings.ToUpper(k.saslMechanism); m {
	case sarama.SASLTypePlaintext:
		sc.Net.SASL.Mechanism = sarama.SASLTypePlaintext
	case sarama.SASLTypeSCRAMSHA256:
		sc.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA256
		gen = func() sarama.SCRAMClient { return &scramClient{hash: scram.SHA256} }
	case sarama.SASLTypeSCRAMSHA512:
		sc.Net.SASL.Mechanism = sarama.SASLTypeSCRAMSHA512
		gen = func() sarama.SCRAMClient { return &scramClient{hash: scram.SHA512} }
	default:
		return usageErrorf("invalid --sasl-mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", k.saslMechanism)
	}
	if k.saslUser == "" {
		return usageErrorf("--sasl-mechanism %s needs --sasl-user", k.saslMechanism)
	}
	password := getenv(envSASLPassword)
	if k.saslPassFile != "" {
		if password != "" {
			return usageErrorf("give the SASL password once: --sasl-password-file or %s, not both", envSASLPassword)
		}
		b, err := os.ReadFile(k.saslPassFile)
		if err != nil {
			return fmt.Errorf("reading --sasl-password-file: %w", err)
		}
		password = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	}
	if password == "" {
		return usageErrorf("--sasl-mechanism %s needs a password: --sasl-password-file or %s", k.saslMechanism, envSASLPassword)
	}
	sc.Net.SASL.Enable = true
	sc.Net.SASL.Handshake = true
	sc.Net.SASL.User = k.saslUser
	sc.Net.SASL.Password = password
	sc.Net.SASL.SCRAMClientGeneratorFunc = gen
	return nil
}

// scramClient is sarama's SCRAMClient on github.com/xdg-go/scram.
type scramClient struct {
	hash scram.HashGeneratorFcn
	conv *scram.ClientConversation
}

var _ sarama.SCRAMClient = (*scramClient)(nil)

// Begin starts a conversation for user and password (authzID is the
// authorization identity, usually empty).
func (c *scramClient) Begin(user, password, authzID string) error {
	cl, err := c.hash.NewClient(user, password, authzID)
	if err != nil {
		return fmt.Errorf("SCRAM: %w", err)
	}
	c.conv = cl.NewConversation()
	return nil
}

// Step answers the server's challenge.
func (c *scramClient) Step(challenge string) (string, error) {
	return c.conv.Step(challenge)
}

// Done reports whether the conversation is over.
func (c *scramClient) Done() bool { return c.conv.Done() }
