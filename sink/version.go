package sink

import (
	"errors"
	"fmt"

	"github.com/IBM/sarama"
)

// ProduceVersionError says a broker serves no Produce version as new as
// the one the direct producer sends for kafka.version. sarama's requests
// are lowered to what each broker announces; the direct producer's are
// not (sink/wire.go), so without this check such a broker (older than 2.4
// with the default kafka.version) would close every produce connection
// and the relay would reconnect for ever.
type ProduceVersionError struct {
	Broker       string // the broker's address
	Max          int16  // the newest Produce version it serves
	Want         int16  // the version kafka.version makes the direct producer send
	KafkaVersion string // kafka.version
}

func (e *ProduceVersionError) Error() string {
	return fmt.Sprintf("kafka broker %s serves Produce up to v%d, but kafka.version %s makes the direct producer send v%d: "+
		"set kafka.version to the broker's Kafka release (or use kafka.producer: sarama)", e.Broker, e.Max, e.KafkaVersion, e.Want)
}

// checkProduceVersion asks every broker the client knows (after a
// metadata refresh) which Produce versions it serves and returns a
// *ProduceVersionError for the first one older than want. A broker that
// does not answer is skipped: the sender's own dial reports it. Called by
// dialCluster before the direct engine starts; it blocks for one round
// trip per broker.
func checkProduceVersion(client sarama.Client, want int16, kafkaVersion string) error {
	for _, b := range client.Brokers() {
		if err := b.Open(client.Config()); err != nil && !errors.Is(err, sarama.ErrAlreadyConnected) {
			continue
		}
		r, err := b.ApiVersions(&sarama.ApiVersionsRequest{})
		if err != nil || r.ErrorCode != 0 {
			continue
		}
		for _, k := range r.ApiKeys {
			if k.ApiKey == apiProduce && k.MaxVersion < want {
				return &ProduceVersionError{Broker: b.Addr(), Max: k.MaxVersion, Want: want, KafkaVersion: kafkaVersion}
			}
		}
	}
	return nil
}
