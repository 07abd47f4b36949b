package serialize

import (
	"context"
	"errors"
	"fmt"
	"sort"
)

// Probe asks the registry of cfg for its subjects once, as the relay would
// connect (URL, basic auth, TLS), for outbox-relay check. The error names
// the registry without credentials and never holds the password.
func Probe(ctx context.Context, cfg RegistryConfig) (subjects []string, err error) {
	cl, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	s := &Serializer{secrets: secretsOf(cfg)}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	subjects, err = cl.Subjects(ctx)
	if err != nil {
		return nil, errors.New(s.describeErr(fmt.Errorf("GET %s/subjects: %w", redactURL(cfg.URL), err)))
	}
	sort.Strings(subjects)
	return subjects, nil
}

// Subject is the subject of topic's values under cfg's strategy, and false
// when it depends on each event (the record name strategies).
func Subject(cfg RegistryConfig, topic string) (string, bool) {
	if cfg.SubjectStrategy != "" && cfg.SubjectStrategy != TopicName {
		return "", false
	}
	return topic + "-value", true
}
