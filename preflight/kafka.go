package preflight

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"

	"github.com/outbox-relay/outbox-relay/sink"
)

// KafkaFacts is what the brokers answered.
type KafkaFacts struct {
	ConnectError string
	Topics       []TopicFact
	// BrokerAutoCreate is the broker's auto.create.topics.enable; nil
	// when it could not be read.
	BrokerAutoCreate *bool
	ACL              ACLFacts
	SASL             SASLFacts
}

// SASLFacts is how the check authenticated: the mechanism, for
// OAUTHBEARER the token source and whether it gave a token (never the
// token itself), and whether the broker refused the credentials.
type SASLFacts struct {
	Mechanism   string
	TokenSource string
	TokenError  string    // the source gave no token
	TokenExpiry time.Time // zero: unknown or not OAUTHBEARER
	Refused     bool      // the broker (or token endpoint) refused the credentials
}

// TopicFact is one topic the relay will produce to (routePlan).
type TopicFact struct {
	Name       string
	DeadLetter bool
	Exists     bool
	Partitions int
}

// ACLFacts is the answer to DescribeAcls for the relay's principal.
type ACLFacts struct {
	// Skipped says why ACLs were not checked: no authorizer, not allowed
	// to describe them, principal unknown.
	Skipped   string
	Principal string
	Acls      []sarama.ResourceAcls
}

// gatherKafka connects with the relay's own client settings (SASL, TLS,
// version), lists the topics and reads the ACLs; topics are those the
// relay will publish to (routePlan.names). It never creates a topic: the
// topics are listed with one metadata request for all topics, which names
// none, so neither the client's nor the broker's auto-creation applies.
// Bounded by short timeouts, whatever ctx allows.
func gatherKafka(ctx context.Context, o Options, topics []string) KafkaFacts {
	var f KafkaFacts
	sc, err := sink.ClientConfig(o.Kafka)
	if err != nil {
		f.ConnectError = err.Error()
		return f
	}
	sc.Metadata.Retry.Max = 1
	sc.Metadata.Retry.BackoffFunc = nil
	sc.Metadata.Retry.Backoff = 100 * time.Millisecond
	sc.Metadata.AllowAutoTopicCreation = false // a check creates nothing
	sc.Metadata.Full = true                    // the topic list
	sc.Net.DialTimeout = 5 * time.Second
	sc.Net.ReadTimeout = 10 * time.Second
	sc.Net.WriteTimeout = 5 * time.Second
	sasl := SASLFacts{Mechanism: o.Kafka.SASL.Mechanism}
	if sasl.Mechanism == sarama.SASLTypeOAuth {
		// A token first, on its own: "no token" and "the broker refused
		// it" have different fixes.
		sasl.TokenSource = o.Kafka.SASL.OAuth.Source
		src := o.Kafka.SASL.Source
		if src == nil {
			src, err = sink.NewTokenSource(o.Kafka.SASL.OAuth)
		} else {
			sasl.TokenSource = "set by the program"
		}
		if err == nil {
			tctx, cancel := context.WithTimeout(ctx, 15*time.Second)
			var tok sink.Token
			tok, err = src.Token(tctx)
			cancel()
			sasl.TokenExpiry = tok.Expiry
		}
		if err != nil {
			sasl.TokenError = err.Error()
			sasl.Refused = sink.IsAuthError(err)
			f.SASL = sasl
			f.ConnectError = "no OAUTHBEARER token: " + err.Error()
			return f
		}
	}
	done := make(chan KafkaFacts, 1)
	go func() {
		r := readKafka(o, sc, topics)
		r.SASL.Mechanism, r.SASL.TokenSource, r.SASL.TokenExpiry = sasl.Mechanism, sasl.TokenSource, sasl.TokenExpiry
		done <- r
	}()
	select {
	case r := <-done:
		return r
	case <-ctx.Done():
		f.ConnectError = "no answer from " + strings.Join(o.Kafka.Brokers, ",") + " before the check's deadline"
		return f
	}
}

func readKafka(o Options, sc *sarama.Config, topics []string) KafkaFacts {
	var f KafkaFacts
	client, err := sarama.NewClient(o.Kafka.Brokers, sc)
	if err != nil {
		f.ConnectError = err.Error()
		if sink.IsAuthError(err) {
			f.SASL.Refused = true
			if o.Kafka.SASL.Mechanism != sarama.SASLTypeOAuth {
				f.ConnectError += " (SASL user " + o.Kafka.SASL.Username + ")"
			}
		}
		return f
	}
	defer client.Close()
	admin, err := sarama.NewClusterAdminFromClient(client)
	if err != nil {
		f.ConnectError = err.Error()
		return f
	}
	// ListTopics asks for the metadata of every topic (no name given):
	// it cannot create one, whatever the broker's auto.create.topics.enable.
	exist, err := admin.ListTopics()
	if err != nil {
		f.ConnectError = "list topics: " + err.Error()
		return f
	}
	add := func(name string, dlq bool) {
		for _, t := range f.Topics {
			if t.Name == name {
				return
			}
		}
		d, ok := exist[name]
		f.Topics = append(f.Topics, TopicFact{Name: name, DeadLetter: dlq, Exists: ok, Partitions: int(d.NumPartitions)})
	}
	for _, t := range topics {
		add(t, t == o.DeadLetterTopic && !o.PoisonHalts)
	}

	if brokers := client.Brokers(); len(brokers) > 0 {
		entries, err := admin.DescribeConfig(sarama.ConfigResource{Type: sarama.BrokerResource,
			Name: strconv.Itoa(int(brokers[0].ID())), ConfigNames: []string{"auto.create.topics.enable"}})
		if err == nil {
			for _, e := range entries {
				if e.Name == "auto.create.topics.enable" {
					v := e.Value == "true"
					f.BrokerAutoCreate = &v
				}
			}
		}
	}

	switch {
	case o.Kafka.SASL.Mechanism != "":
		f.ACL.Principal = "User:" + o.Kafka.SASL.Username
	case o.Kafka.TLS.Enabled && o.Kafka.TLS.CertFile != "":
		f.ACL.Skipped = "the principal of a TLS client certificate is the broker's mapping of its subject: not checked"
		return f
	default:
		f.ACL.Principal = "User:ANONYMOUS"
	}
	acls, err := admin.ListAcls(sarama.AclFilter{ResourceType: sarama.AclResourceTopic, ResourcePatternTypeFilter: sarama.AclPatternAny,
		Operation: sarama.AclOperationAny, PermissionType: sarama.AclPermissionAny})
	var kerr sarama.KError
	switch {
	case errors.As(err, &kerr) && kerr == sarama.ErrSecurityDisabled:
		f.ACL.Skipped = "the brokers have no authorizer: ACLs are not enforced"
	case errors.As(err, &kerr) && (kerr == sarama.ErrClusterAuthorizationFailed || kerr == sarama.ErrTopicAuthorizationFailed):
		f.ACL.Skipped = "not authorized to describe ACLs (DESCRIBE on the cluster): produce rights not verified"
	case err != nil && strings.Contains(strings.ToLower(err.Error()), "security features are disabled"):
		f.ACL.Skipped = "the brokers have no authorizer: ACLs are not enforced"
	case err != nil:
		f.ACL.Skipped = "DescribeAcls failed: " + err.Error()
	default:
		f.ACL.Acls = acls
	}
	return f
}

// allowed says whether acls let principal do op on topic: a matching DENY
// wins; otherwise an ALLOW of op or All (WRITE, READ, DELETE and ALTER
// imply DESCRIBE, as in Kafka). Hosts are not known here: an ACL for any
// host counts.
func allowed(acls []sarama.ResourceAcls, principal, topic string, op sarama.AclOperation) bool {
	ok := false
	for _, ra := range acls {
		if ra.ResourceType != sarama.AclResourceTopic || !resourceMatches(ra.Resource, topic) {
			continue
		}
		for _, a := range ra.Acls {
			if a.Principal != principal && a.Principal != "User:*" {
				continue
			}
			if !opCovers(a.Operation, op, a.PermissionType) {
				continue
			}
			if a.PermissionType == sarama.AclPermissionDeny {
				return false
			}
			if a.PermissionType == sarama.AclPermissionAllow {
				ok = true
			}
		}
	}
	return ok
}

func resourceMatches(r sarama.Resource, topic string) bool {
	switch r.ResourcePatternType {
	case sarama.AclPatternLiteral:
		return r.ResourceName == topic || r.ResourceName == "*"
	case sarama.AclPatternPrefixed:
		return strings.HasPrefix(topic, r.ResourceName)
	}
	return false
}

func opCovers(have, want sarama.AclOperation, perm sarama.AclPermissionType) bool {
	if have == want || have == sarama.AclOperationAll {
		return true
	}
	if want == sarama.AclOperationDescribe && perm == sarama.AclPermissionAllow {
		switch have {
		case sarama.AclOperationWrite, sarama.AclOperationRead, sarama.AclOperationDelete, sarama.AclOperationAlter:
			return true
		}
	}
	return false
}
