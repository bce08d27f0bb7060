package kafka

import (
	"errors"
	"fmt"

	"github.com/IBM/sarama"

	"github.com/sqloutbox/outbox/relay"
)

// outcome is what the answer to one record batch means for its records.
type outcome int

const (
	// appended: the broker wrote the batch (DUPLICATE_SEQUENCE_NUMBER
	// too: it had written it before, under the same producer ID and
	// sequence, and a retry found it).
	appended outcome = iota
	// resend: the batch was not written, or the answer was lost; the same
	// batch, with the same producer ID and sequence, is sent again after a
	// backoff, so that a batch the broker did write is recognized as a
	// duplicate rather than written twice (Kafka KIP-98).
	resend
	// producerState: the broker does not accept the batch under this
	// producer ID and sequence (state lost or out of step). The batch was
	// not written; it is sent again under a fresh producer ID.
	producerState
	// tooLarge: the broker refused the batch as too large. With several
	// records it cannot say which one; they are sent again one per batch.
	tooLarge
	// unavailable: the route is refused for reasons no record can fix
	// (authorization, an unknown topic, an unsupported request): the
	// records fail with relay.ErrUnavailable and count no attempt.
	unavailable
	// permanent: no retry of these records can succeed (an invalid
	// record): they fail with relay.ErrPermanent and are dead-lettered.
	permanent
	// failed: any other error: the records fail and count an attempt.
	failed
)

// classifyKError maps a Kafka error code from a produce answer to what it
// means for the batch. Codes follow the Kafka protocol's error table
// (https://kafka.apache.org/protocol#protocol_error_codes) and the Java
// producer's retriable set (RetriableException subclasses).
func classifyKError(k sarama.KError) outcome {
	switch k {
	case sarama.ErrNoError, sarama.ErrDuplicateSequenceNumber:
		return appended
	case sarama.ErrNotLeaderForPartition, sarama.ErrLeaderNotAvailable,
		sarama.ErrRequestTimedOut, sarama.ErrBrokerNotAvailable, sarama.ErrReplicaNotAvailable,
		sarama.ErrNetworkException, sarama.ErrNotEnoughReplicas, sarama.ErrNotEnoughReplicasAfterAppend,
		sarama.ErrKafkaStorageError, sarama.ErrFencedLeaderEpoch, sarama.ErrUnknownLeaderEpoch,
		sarama.ErrOffsetNotAvailable, sarama.ErrConcurrentTransactions, sarama.ErrNotController,
		sarama.ErrThrottlingQuotaExceeded, sarama.ErrPreferredLeaderNotAvailable:
		return resend
	case sarama.ErrOutOfOrderSequenceNumber, sarama.ErrUnknownProducerID, sarama.ErrInvalidProducerEpoch,
		sarama.ErrInvalidProducerIDMapping, sarama.ErrProducerFenced:
		return producerState
	case sarama.ErrMessageSizeTooLarge, sarama.ErrMessageSetSizeTooLarge:
		return tooLarge
	case sarama.ErrTopicAuthorizationFailed, sarama.ErrClusterAuthorizationFailed,
		sarama.ErrTransactionalIDAuthorizationFailed, sarama.ErrUnknownTopicOrPartition,
		sarama.ErrInvalidTopic, sarama.ErrSASLAuthenticationFailed,
		sarama.ErrUnsupportedVersion, sarama.ErrUnsupportedForMessageFormat,
		sarama.ErrInvalidRequiredAcks, sarama.ErrPolicyViolation:
		return unavailable
	case sarama.ErrInvalidMessage, sarama.ErrInvalidMessageSize, sarama.ErrInvalidRecord:
		return permanent
	}
	return failed
}

// classifyRequestError maps an error of a whole produce request (no
// per-partition answer) to what it means for every batch in it. A
// request sarama could not encode was never sent and will not encode
// next time either; anything else (a connection refused, reset or timed
// out, a closed client) leaves the outcome unknown, so the batch is sent
// again unchanged.
func classifyRequestError(err error) outcome {
	var pe sarama.PacketEncodingError
	var ce sarama.ConfigurationError
	var k sarama.KError
	switch {
	case errors.As(err, &pe), errors.As(err, &ce):
		return failed
	case errors.As(err, &k):
		return classifyKError(k)
	}
	return resend
}

// TopicHint returns what to do about a route refused with err for topic,
// as the text a publish error carries (beginning ": "), or "" for other
// errors: for an unknown topic (sarama.ErrUnknownTopicOrPartition) that
// the topic does not exist and the command that creates it with that very
// name (`kafka-topics.sh --create --topic TOPIC`); for a refused topic
// authorization (sarama.ErrTopicAuthorizationFailed) the ACL to grant on
// it. Either way a mistyped Topic is the other way out.
func TopicHint(topic string, err error) string {
	switch {
	case errors.Is(err, sarama.ErrUnknownTopicOrPartition):
		return fmt.Sprintf(": topic %q does not exist: fix the event's Topic if it is mistyped, or create it: `kafka-topics.sh --bootstrap-server <broker> --create --topic %s --partitions <n>`", topic, topic)
	case errors.Is(err, sarama.ErrTopicAuthorizationFailed):
		return fmt.Sprintf(": the relay may not write to topic %q: fix the event's Topic if it is mistyped, or grant it: `kafka-acls.sh --bootstrap-server <broker> --add --allow-principal User:<relay> --operation Write --operation Describe --topic %s`", topic, topic)
	}
	return ""
}

// refusal wraps err with relay.ErrUnavailable when it is a refusal that
// no retry fixes (authorization, SASL, an unknown topic), for Healthy.
func refusal(err error) error {
	if classifyRequestError(err) == unavailable {
		return fmt.Errorf("%w: %w", relay.ErrUnavailable, err)
	}
	return err
}
