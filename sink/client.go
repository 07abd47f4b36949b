package sink

import "github.com/IBM/sarama"

// ClientConfig is the sarama configuration the producer uses (version,
// client id, SASL, TLS, auto topic creation), for a tool that must reach
// the cluster exactly as the relay does (`outbox-relay check`). A fresh
// value; the caller may shorten its timeouts.
func ClientConfig(cfg Config) (*sarama.Config, error) { return saramaConfig(cfg) }
