package preflight

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/outbox-relay/outbox-relay/serialize"
)

// RegistryOptions is the Schema Registry part of Options: set when some
// topic's serialization needs the registry.
type RegistryOptions struct {
	Config serialize.RegistryConfig
	// Format is the serialization of a topic (json, avro, ...).
	Format func(topic string) string
}

// RegistryFacts is what the Schema Registry answered.
type RegistryFacts struct {
	Used     bool
	URL      string // without credentials
	Err      string // no secrets
	Subjects map[string]bool
	// Topics are the topics the rows route to now whose format needs the
	// registry, each with its value subject ("" when the strategy makes it
	// per event).
	Topics map[string]string
}

func gatherRegistry(ctx context.Context, o Options, topics []string) RegistryFacts {
	var f RegistryFacts
	if o.Registry == nil {
		return f
	}
	f.Used, f.URL = true, serialize.RedactURL(o.Registry.Config.URL)
	f.Topics = map[string]string{}
	for _, t := range topics {
		// Dead letters keep their own format (the payload as written and
		// the dlq.* headers): never serialized, no subject.
		if t != o.DeadLetterTopic && o.Registry.Format(t) != serialize.JSON {
			f.Topics[t], _ = serialize.Subject(o.Registry.Config, t)
		}
	}
	subjects, err := serialize.Probe(ctx, o.Registry.Config)
	if err != nil {
		f.Err = err.Error()
		return f
	}
	f.Subjects = map[string]bool{}
	for _, s := range subjects {
		f.Subjects[s] = true
	}
	return f
}

// registryChecks: the registry answers as the relay would ask it, and each
// topic the rows route to now has its subject (else its events would be
// dead-lettered with reason schema_mismatch).
func registryChecks(r RegistryFacts, o Options, add addFunc) {
	if !r.Used {
		return
	}
	if r.Err != "" {
		add("schema_registry", Fail, "cannot list the subjects of "+r.URL+": "+r.Err,
			"check schema_registry.url, schema_registry.username/password (OUTBOX_RELAY_SCHEMA_REGISTRY_PASSWORD) and schema_registry.tls.*; while it does not answer the relay publishes nothing to its topics (events wait)")
		return
	}
	add("schema_registry", OK, fmt.Sprintf("%s answers: %d subjects", r.URL, len(r.Subjects)), "")
	var missing, perEvent []string
	for t, subject := range r.Topics {
		switch {
		case subject == "":
			perEvent = append(perEvent, t)
		case !r.Subjects[subject] && o.Registry.Config.Schemas[subject] == "":
			missing = append(missing, fmt.Sprintf("%s (topic %s)", subject, t))
		}
	}
	switch {
	case len(missing) > 0:
		add("schema_registry.subjects", Warn, "not registered: "+strings.Join(slices.Sorted(slices.Values(missing)), ", ")+": events to these topics would be dead-lettered (schema_mismatch)",
			"register each subject's schema in the registry, or name a schema file in schema_registry.schemas with schema_registry.auto_register: true")
	case len(r.Topics) == 0:
		add("schema_registry.subjects", Skip, "no row routes to a topic with a registry format now", "")
	default:
		v := fmt.Sprintf("every subject of the %d topics the rows route to is registered", len(r.Topics)-len(perEvent))
		if len(perEvent) > 0 {
			v += fmt.Sprintf(" (%d more name their subject per event: schema_registry.subject_strategy)", len(perEvent))
		}
		add("schema_registry.subjects", OK, v, "")
	}
}
