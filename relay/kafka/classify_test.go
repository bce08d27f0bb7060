package kafka

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"testing"

	"github.com/IBM/sarama"

	"github.com/sqloutbox/outbox/relay"
)

// TestClassifyKError pins what each broker answer means for a record
// batch (the package documentation's list), for the codes the fault
// tests inject and their neighbours.
func TestClassifyKError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		k    sarama.KError
		want outcome
	}{
		{sarama.ErrNoError, appended},
		{sarama.ErrDuplicateSequenceNumber, appended},
		{sarama.ErrNotLeaderForPartition, resend},
		{sarama.ErrLeaderNotAvailable, resend},
		{sarama.ErrRequestTimedOut, resend},
		{sarama.ErrNotEnoughReplicas, resend},
		{sarama.ErrNotEnoughReplicasAfterAppend, resend},
		{sarama.ErrKafkaStorageError, resend},
		{sarama.ErrNetworkException, resend},
		{sarama.ErrOutOfOrderSequenceNumber, producerState},
		{sarama.ErrUnknownProducerID, producerState},
		{sarama.ErrInvalidProducerEpoch, producerState},
		{sarama.ErrProducerFenced, producerState},
		{sarama.ErrMessageSizeTooLarge, tooLarge},
		{sarama.ErrMessageSetSizeTooLarge, tooLarge},
		{sarama.ErrTopicAuthorizationFailed, unavailable},
		{sarama.ErrClusterAuthorizationFailed, unavailable},
		{sarama.ErrUnknownTopicOrPartition, unavailable},
		{sarama.ErrInvalidTopic, unavailable},
		{sarama.ErrInvalidRecord, permanent},
		{sarama.ErrInvalidMessage, permanent},
		{sarama.ErrUnknown, failed}, // UNKNOWN_SERVER_ERROR (-1)
		{sarama.ErrInvalidTimestamp, failed},
		{sarama.KError(9999), failed}, // a code added to Kafka later
	} {
		t.Run(tc.k.Error(), func(t *testing.T) {
			t.Parallel()
			if got := classifyKError(tc.k); got != tc.want {
				t.Errorf("classifyKError(%d) = %d, want %d", tc.k, got, tc.want)
			}
			// Through a request error, wrapped, the same.
			if got := classifyRequestError(fmt.Errorf("wrapped: %w", tc.k)); got != tc.want {
				t.Errorf("classifyRequestError(%d) = %d, want %d", tc.k, got, tc.want)
			}
		})
	}
}

// TestClassifyRequestError: a request with no answer leaves its batches'
// outcome unknown (resend the same batch); one sarama could not encode
// was never sent and fails.
func TestClassifyRequestError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want outcome
	}{
		{"eof", io.EOF, resend},
		{"reset", &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}, resend},
		{"not connected", sarama.ErrNotConnected, resend},
		{"closed client", sarama.ErrClosedClient, resend},
		{"out of brokers", sarama.ErrOutOfBrokers, resend},
		{"encoding", sarama.PacketEncodingError{Info: "x"}, failed},
		{"configuration", sarama.ConfigurationError("x"), failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := classifyRequestError(tc.err); got != tc.want {
				t.Errorf("classifyRequestError(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}

// TestRefusal: Healthy's errors wrap relay.ErrUnavailable exactly for the
// refusals no retry fixes.
func TestRefusal(t *testing.T) {
	t.Parallel()
	if err := refusal(fmt.Errorf("x: %w", sarama.ErrSASLAuthenticationFailed)); !errors.Is(err, relay.ErrUnavailable) || !errors.Is(err, sarama.ErrSASLAuthenticationFailed) {
		t.Errorf("SASL failure: %v", err)
	}
	if err := refusal(sarama.ErrOutOfBrokers); errors.Is(err, relay.ErrUnavailable) {
		t.Errorf("an unreachable cluster is not a refusal: %v", err)
	}
}

// TestNextSeq: sequences wrap to 0 after math.MaxInt32, as Kafka's do.
func TestNextSeq(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		seq  int32
		n    int
		want int32
	}{
		{0, 1, 1},
		{5, 10, 15},
		{math.MaxInt32, 1, 0},
		{math.MaxInt32 - 1, 3, 1},
	} {
		if got := nextSeq(tc.seq, tc.n); got != tc.want {
			t.Errorf("nextSeq(%d, %d) = %d, want %d", tc.seq, tc.n, got, tc.want)
		}
	}
}

// TestRetryBackoff: 100 ms, doubling, capped at 1 s.
func TestRetryBackoff(t *testing.T) {
	t.Parallel()
	want := []string{"100ms", "200ms", "400ms", "800ms", "1s", "1s"}
	for i, w := range want {
		if got := retryBackoff(i+1, MinRetries).String(); got != w {
			t.Errorf("retryBackoff(%d) = %s, want %s", i+1, got, w)
		}
	}
}
