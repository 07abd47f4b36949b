package sink

import (
	"errors"
	"fmt"
	"testing"

	"github.com/IBM/sarama"
)

// An AbortError classifies as its own cause when the broker refused the
// record itself, and as transient when it was aborted for another's sake,
// whatever that other's error was; errors.As finds it through wrapping.
func TestAbortErrorClassifies(t *testing.T) {
	cases := []struct {
		name   string
		err    error
		reason string
		kind   Kind
	}{
		{"own refusal", &AbortError{Cause: sarama.ErrMessageSizeTooLarge, Own: true}, "message_too_large", Poison},
		{"own, wrapped", fmt.Errorf("publish: %w", &AbortError{Cause: sarama.ErrTopicAuthorizationFailed, Own: true}), "authorization", Poison},
		{"own, relay's rights", &AbortError{Cause: sarama.ErrTransactionalIDAuthorizationFailed, Own: true}, "authorization", Refused},
		{"another's refusal", &AbortError{Cause: sarama.ErrMessageSizeTooLarge}, "other", Transient},
		{"another's, wrapped", fmt.Errorf("publish: %w", &AbortError{Cause: sarama.ErrInvalidTopic}), "other", Transient},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reason, kind := Classify(tc.err)
			if reason != tc.reason || kind != tc.kind {
				t.Fatalf("Classify = %s, %v; want %s, %v", reason, kind, tc.reason, tc.kind)
			}
			var a *AbortError
			if !errors.As(tc.err, &a) {
				t.Fatal("errors.As found no *AbortError")
			}
		})
	}
}
