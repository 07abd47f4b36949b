package sink

import (
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/IBM/sarama"
	"github.com/outbox-relay/outbox-relay/fault"
)

// Kind is fault's Kind: what to do about a produce error. The names below
// let the pipeline speak sink's vocabulary; the meanings are fault's.
type Kind = fault.Kind

const (
	// Transient: a broker restarts, a leader is elected, replicas catch
	// up. Retried for ever; the event is never skipped.
	Transient = fault.Transient
	// Poison: the record itself is refused on every attempt (too large,
	// invalid topic, rejected by the broker). After a few attempts the
	// event is dead-lettered or the relay halts (on_poison).
	Poison = fault.Poison
	// Refused: topic or cluster authorization. The relay halts until an
	// operator fixes the ACLs.
	Refused = fault.Refused
)

// Reasons, the label values of outbox_relay_publish_errors_total.
var Reasons = []string{
	"network", "leader_not_available", "not_enough_replicas", "request_timed_out", "unknown_topic",
	"producer_state", "message_too_large", "invalid_topic", "authorization", "broker_rejected", "other",
}

// Classify names a produce error (a Reasons value) and says what kind it is.
// Errors it does not know are Transient: retrying an unknown error for ever
// is visible (metrics, logs, readiness) and loses nothing; skipping it could.
func Classify(err error) (reason string, kind Kind) {
	var kerr sarama.KError
	var cerr sarama.ConfigurationError
	switch {
	case err == nil:
		return "other", Transient
	case errors.As(err, &cerr) && strings.Contains(string(cerr), "larger than"):
		return "message_too_large", Poison // rejected locally by kafka.max_message_bytes
	case errors.As(err, &kerr):
		switch kerr {
		case sarama.ErrLeaderNotAvailable, sarama.ErrNotLeaderForPartition, sarama.ErrNotController,
			sarama.ErrFencedLeaderEpoch, sarama.ErrUnknownLeaderEpoch:
			return "leader_not_available", Transient
		case sarama.ErrNotEnoughReplicas, sarama.ErrNotEnoughReplicasAfterAppend, sarama.ErrKafkaStorageError:
			return "not_enough_replicas", Transient
		case sarama.ErrBrokerNotAvailable, sarama.ErrNetworkException:
			return "network", Transient
		case sarama.ErrRequestTimedOut:
			return "request_timed_out", Transient
		case sarama.ErrUnknownTopicOrPartition:
			// The topic may be on its way (auto-creation, an operator):
			// waiting is safe, dead-lettering a whole topic is not.
			return "unknown_topic", Transient
		case sarama.ErrOutOfOrderSequenceNumber, sarama.ErrUnknownProducerID, sarama.ErrInvalidProducerEpoch,
			sarama.ErrDuplicateSequenceNumber, sarama.ErrInvalidMessage:
			// Idempotence bookkeeping or a corrupted request: a resend
			// with the bumped epoch goes through.
			return "producer_state", Transient
		case sarama.ErrMessageSizeTooLarge, sarama.ErrMessageSetSizeTooLarge:
			return "message_too_large", Poison
		case sarama.ErrInvalidTopic:
			return "invalid_topic", Poison
		case sarama.ErrTopicAuthorizationFailed, sarama.ErrClusterAuthorizationFailed,
			sarama.ErrTransactionalIDAuthorizationFailed, sarama.ErrSASLAuthenticationFailed,
			sarama.ErrIllegalSASLState, sarama.ErrUnsupportedSASLMechanism:
			return "authorization", Refused
		}
		return "broker_rejected", Poison
	case isNetwork(err):
		return "network", Transient
	}
	return "other", Transient
}

func isNetwork(err error) bool {
	var ne net.Error
	return errors.Is(err, sarama.ErrOutOfBrokers) || errors.Is(err, sarama.ErrNotConnected) ||
		errors.Is(err, sarama.ErrShuttingDown) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.As(err, &ne)
}

// AbortError is the verdict on a record whose Kafka transaction was
// aborted: no record of that transaction reached a read_committed
// consumer, so this one must be published again, in a later transaction.
// Own: the broker refused this record itself, and Cause (which Unwrap
// returns, so Classify sees it) says why; otherwise it was aborted for
// another record's sake, Unwrap returns nil and it classifies as transient.
type AbortError struct {
	Cause error
	Own   bool
}

func (e *AbortError) Error() string {
	if e.Own {
		return "kafka transaction aborted: " + e.Cause.Error()
	}
	return "kafka transaction aborted (another record or the transaction failed): " + e.Cause.Error()
}

// Unwrap returns Cause when the record was refused itself, else nil.
func (e *AbortError) Unwrap() error {
	if e.Own {
		return e.Cause
	}
	return nil
}
