package record

import (
	"testing"

	"github.com/outbox-relay/outbox-relay/fault"
)

func TestDecide(t *testing.T) {
	dlq := Policy{MaxAttempts: 3}
	halt := Policy{MaxAttempts: 3, Halt: true}
	tests := []struct {
		name string
		f    Failure
		p    Policy
		want Action
	}{
		{"transient is retried for ever", Failure{Kind: fault.Transient, Attempts: 1000}, dlq, RetryTransient},
		{"transient under halt too", Failure{Kind: fault.Transient, Attempts: 1000}, halt, RetryTransient},
		{"transient dead letter is retried", Failure{Kind: fault.Transient, Attempts: 9, DeadLetter: true}, dlq, RetryTransient},
		{"poison within attempts is retried", Failure{Kind: fault.Poison, Attempts: 2}, dlq, RetryPoison},
		{"poison at max attempts is dead-lettered", Failure{Kind: fault.Poison, Attempts: 3}, dlq, DeadLetter},
		{"poison at max attempts halts under halt", Failure{Kind: fault.Poison, Attempts: 3}, halt, Halt},
		{"poison within attempts under halt is retried", Failure{Kind: fault.Poison, Attempts: 1}, halt, RetryPoison},
		{"refused halts at once", Failure{Kind: fault.Refused, Attempts: 1}, dlq, Halt},
		{"a dead letter that fails halts", Failure{Kind: fault.Poison, Attempts: 1, DeadLetter: true}, dlq, Halt},
		{"a bad row is dead-lettered at once", Failure{Kind: fault.Poison, Attempts: 1, Permanent: true}, dlq, DeadLetter},
		{"a bad row halts under halt", Failure{Kind: fault.Poison, Attempts: 1, Permanent: true}, halt, Halt},
		{"a certain refusal is dead-lettered at the first answer", Failure{Kind: fault.Poison, Attempts: 1, Certain: true}, dlq, DeadLetter},
		{"a certain refusal halts at the first answer under halt", Failure{Kind: fault.Poison, Attempts: 1, Certain: true}, halt, Halt},
		{"a certain refusal of a dead letter halts", Failure{Kind: fault.Poison, Attempts: 1, Certain: true, DeadLetter: true}, dlq, Halt},
		{"certain says nothing of a transient error", Failure{Kind: fault.Transient, Attempts: 1, Certain: true}, dlq, RetryTransient},
		{"one attempt allowed", Failure{Kind: fault.Poison, Attempts: 1}, Policy{MaxAttempts: 1}, DeadLetter},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Decide(tt.f, tt.p); got != tt.want {
				t.Errorf("Decide(%+v) = %s, want %s", tt.f, got, tt.want)
			}
		})
	}
}
