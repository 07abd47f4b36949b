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
	// invalid topic, no write access to its topic, rejected by the
	// broker). The event is dead-lettered or the relay halts (on_poison):
	// at once when the refusal is certain (Certain), else after a few
	// attempts.
	Poison = fault.Poison
	// Refused: the relay's own rights (cluster or transactional id
	// authorization, SASL). The relay halts until an operator fixes them.
	Refused = fault.Refused
)

// Reasons, the label values of outbox_relay_publish_errors_total.
var Reasons = []string{
	"network", "leader_not_available", "not_enough_replicas", "request_timed_out", "unknown_topic",
	"producer_state", "coordinator", "message_too_large", "invalid_record", "invalid_topic", "authorization", "broker_rejected", "other",
}

// Classify names a produce error (a Reasons value) and says what kind it is.
// Errors it does not know are Transient, Kafka's error codes too: retrying
// an unknown error for ever is visible (metrics, logs, readiness) and loses
// nothing; dead-lettering a good event on a broker's passing state could.
// Only the codes listed as refusals are Poison.
func Classify(err error) (reason string, kind Kind) {
	var kerr sarama.KError
	var cerr sarama.ConfigurationError
	var missing *MissingTopicError
	var endpoint *TokenEndpointError
	switch {
	case err == nil:
		return "other", Transient
	case errors.As(err, &missing):
		return "unknown_topic", Poison // missing for kafka.missing_topic_timeout (topicGate)
	case errors.As(err, &endpoint) && endpoint.refused():
		return "authorization", Refused // the OAuth token endpoint refused the relay's client
	case errors.As(err, &cerr) && strings.Contains(string(cerr), "larger than"):
		return "message_too_large", Poison // rejected locally by kafka.max_message_bytes
	case errors.As(err, &kerr):
		switch kerr {
		case sarama.ErrLeaderNotAvailable, sarama.ErrNotLeaderForPartition, sarama.ErrNotController,
			sarama.ErrFencedLeaderEpoch, sarama.ErrUnknownLeaderEpoch:
			return "leader_not_available", Transient
		case sarama.ErrNotEnoughReplicas, sarama.ErrNotEnoughReplicasAfterAppend, sarama.ErrKafkaStorageError:
			return "not_enough_replicas", Transient
		case sarama.ErrReplicaNotAvailable, sarama.ErrPreferredLeaderNotAvailable, sarama.ErrEligibleLeadersNotAvailable:
			return "leader_not_available", Transient
		case sarama.ErrOffsetsLoadInProgress, sarama.ErrConsumerCoordinatorNotAvailable, sarama.ErrNotCoordinatorForConsumer,
			sarama.ErrConcurrentTransactions:
			// The transaction coordinator moves or loads (a broker of the
			// cluster restarts): the Java client retries these too.
			return "coordinator", Transient
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
		case sarama.ErrInvalidRecord, sarama.ErrInvalidTimestamp:
			// No key for a compacted topic, a timestamp outside the
			// topic's message.timestamp.*.max.ms.
			return "invalid_record", Poison
		case sarama.ErrInvalidTopic:
			return "invalid_topic", Poison
		case sarama.ErrTopicAuthorizationFailed:
			// No write access to this topic: every event of the topic is
			// refused, the other topics' go on. Per topic, so the event's
			// own problem (its dead letter names the topic); the relay's
			// rights in general are Refused.
			return "authorization", Poison
		case sarama.ErrClusterAuthorizationFailed, sarama.ErrTransactionalIDAuthorizationFailed,
			sarama.ErrSASLAuthenticationFailed, sarama.ErrIllegalSASLState, sarama.ErrUnsupportedSASLMechanism:
			return "authorization", Refused
		case sarama.ErrPolicyViolation, sarama.ErrUnsupportedForMessageFormat,
			sarama.ErrUnknown, sarama.ErrInvalidRequiredAcks:
			// Refusals the broker gives a record again on retry (a create
			// policy, a format the topic cannot take, an
			// exception in the broker): poison after the attempts.
			return "broker_rejected", Poison
		}
		return "other", Transient
	case isNetwork(err):
		return "network", Transient
	}
	return "other", Transient
}

// SoleError marks a broker's refusal of a record batch that held the
// failed record alone, or a record the producer refused before any batch
// (too large for kafka.max_message_bytes): the answer is about that record,
// not about a neighbour it was batched with. Unwrap returns Err.
type SoleError struct{ Err error }

func (e *SoleError) Error() string { return e.Err.Error() }
func (e *SoleError) Unwrap() error { return e.Err }

// Certain reports whether err, a Poison refusal (Classify), cannot change
// on retry for this record: on_poison applies at the first answer, with no
// attempt loop and no rewind for the record.
//
//   - The topic's: no write access (TOPIC_AUTHORIZATION_FAILED) or an
//     invalid topic name hold for every record of the topic, whatever it
//     was batched with.
//   - A topic missing for kafka.missing_topic_timeout (MissingTopicError).
//   - The record's: too large (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE,
//     the client's own size check, a topic's max.message.bytes known
//     before sending) or invalid (INVALID_RECORD, INVALID_TIMESTAMP), when the
//     record was alone in the refused batch: a SoleError, the client's
//     local refusal, or an exactly-once record sent alone (an Own
//     AbortError). A refused batch of several records says nothing certain
//     about any one of them; those keep their attempts.
//
// CORRUPT_MESSAGE (a CRC mismatch) is not among them: the Java client
// retries it, a resend can go through.
func Certain(err error) bool {
	if _, kind := Classify(err); kind != Poison {
		return false
	}
	var kerr sarama.KError
	var cerr sarama.ConfigurationError
	var sole *SoleError
	var abort *AbortError
	var missing *MissingTopicError
	switch {
	case errors.As(err, &missing):
		return true // looked up for the timeout already
	case errors.As(err, &cerr):
		return true // sarama's per-record check against kafka.max_message_bytes
	case !errors.As(err, &kerr):
		return false
	case kerr == sarama.ErrTopicAuthorizationFailed, kerr == sarama.ErrInvalidTopic:
		return true
	case kerr == sarama.ErrMessageSizeTooLarge, kerr == sarama.ErrMessageSetSizeTooLarge, kerr == sarama.ErrInvalidRecord,
		kerr == sarama.ErrInvalidTimestamp:
		return errors.As(err, &sole) || (errors.As(err, &abort) && abort.Own)
	}
	return false
}

// RefusedFix names what an operator grants to end a Refused error: the
// cluster's IdempotentWrite, the transactional id's Write, or working SASL
// credentials.
func RefusedFix(err error) string {
	switch {
	case errors.Is(err, sarama.ErrClusterAuthorizationFailed):
		return "grant the relay's Kafka user IdempotentWrite on the cluster (the idempotent producer needs it before Kafka 3.0), then restart the relay"
	case errors.Is(err, sarama.ErrTransactionalIDAuthorizationFailed):
		return "grant the relay's Kafka user Write and Describe on its transactional id (exactly_once.transactional_id), then restart the relay"
	}
	return "check the relay's Kafka credentials (kafka.sasl.*: the user and password, or for OAUTHBEARER the token that kafka.sasl.oauth.* gives) and ACLs, then restart the relay"
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
