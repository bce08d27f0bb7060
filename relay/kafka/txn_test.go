package kafka

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
)

// TestExactlyOnceConfigRefused: NewPublisher refuses an unusable
// exactly-once configuration with ErrConfig, before it connects to
// anything (the brokers here do not exist).
func TestExactlyOnceConfigRefused(t *testing.T) {
	t.Parallel()
	old := sarama.NewConfig()
	old.Version = sarama.V2_4_0_0
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"NoPrefix", Config{ExactlyOnce: &ExactlyOnce{}}, "TransactionalIDPrefix is required"},
		{"TimeoutTooShort", Config{ExactlyOnce: &ExactlyOnce{TransactionalIDPrefix: "p.", TransactionTimeout: 500 * time.Millisecond}}, "outside 1 s to 15 min"},
		{"TimeoutTooLong", Config{ExactlyOnce: &ExactlyOnce{TransactionalIDPrefix: "p.", TransactionTimeout: 16 * time.Minute}}, "outside 1 s to 15 min"},
		{"KafkaTooOld", Config{Sarama: old, ExactlyOnce: &ExactlyOnce{TransactionalIDPrefix: "p."}}, "needs sarama Version 2.5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.cfg.Brokers = []string{"127.0.0.1:1"}
			_, err := NewPublisher(tc.cfg)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewPublisher: %v, want ErrConfig saying %q", err, tc.want)
			}
		})
	}
}

// TestTransactionalNames pins the names a relay partition's producer,
// manifest group and state topic get.
func TestTransactionalNames(t *testing.T) {
	t.Parallel()
	if got := TransactionalID("svc.", "app.outbox_message", 7); got != "svc.app.outbox_message.7" {
		t.Errorf("TransactionalID = %q", got)
	}
	if got := StateTopic("svc.", "outbox_message"); got != "svc.outbox_message.outbox-txn" {
		t.Errorf("StateTopic = %q", got)
	}
}
