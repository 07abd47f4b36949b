package sink

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/rs/zerolog"
)

// versionBroker is a mock broker that serves Produce v3..produceMax and
// the requests a client needs to connect.
func versionBroker(t *testing.T, produceMax int16) *sarama.MockBroker {
	b := sarama.NewMockBroker(t, 1)
	b.SetHandlerByMap(map[string]sarama.MockResponse{
		"MetadataRequest": sarama.NewMockMetadataResponse(t).SetBroker(b.Addr(), b.BrokerID()).SetController(b.BrokerID()),
		"ApiVersionsRequest": sarama.NewMockApiVersionsResponse(t).SetApiKeys([]sarama.ApiVersionsResponseKey{
			{ApiKey: apiProduce, MinVersion: 3, MaxVersion: produceMax},
			{ApiKey: 3, MinVersion: 0, MaxVersion: 9},  // Metadata
			{ApiKey: 18, MinVersion: 0, MaxVersion: 3}, // ApiVersions
			{ApiKey: 22, MinVersion: 0, MaxVersion: 4}, // InitProducerId
		}),
		"InitProducerIDRequest": sarama.NewMockInitProducerIDResponse(t).SetProducerID(7).SetProducerEpoch(0),
	})
	return b
}

// A broker older than the Produce version kafka.version selects (Kafka
// 2.3 serves up to v7; the default 3.6.0 sends v8): Run fails at once with
// the fix, instead of reconnecting for ever.
func TestDirectRefusesBrokerWithoutItsProduceVersion(t *testing.T) {
	installSaramaLogger()
	b := versionBroker(t, 7)
	defer b.Close()
	cfg := DefaultConfig()
	cfg.Brokers = []string{b.Addr()}
	p, err := New(cfg, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = p.Run(ctx)
	var pv *ProduceVersionError
	if !errors.As(err, &pv) {
		t.Fatalf("Run = %v, want a *ProduceVersionError", err)
	}
	if pv.Max != 7 || pv.Want != 8 || pv.Broker != b.Addr() {
		t.Errorf("error fields %+v, want Max 7, Want 8, Broker %s", *pv, b.Addr())
	}
	for _, s := range []string{b.Addr(), "up to v7", "kafka.version 3.6.0", "send v8", "set kafka.version to the broker's Kafka release"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not say %q", err, s)
		}
	}
}

// The check passes when the broker serves the version: a 2.3 broker with
// kafka.version 2.3.0 (Produce v7), a 3.9 broker (v11) with the default.
func TestCheckProduceVersionAccepts(t *testing.T) {
	for _, tc := range []struct {
		name       string
		produceMax int16
		version    string
	}{
		{"kafka.version set to an old broker's release", 7, "2.3.0"},
		{"default kafka.version, a 3.9 broker", 11, "3.6.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			installSaramaLogger()
			b := versionBroker(t, tc.produceMax)
			defer b.Close()
			cfg := DefaultConfig()
			cfg.Brokers = []string{b.Addr()}
			cfg.Version = tc.version
			sc, err := saramaConfig(cfg)
			if err != nil {
				t.Fatal(err)
			}
			client, err := sarama.NewClient(cfg.Brokers, sc)
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			if err := client.RefreshMetadata(); err != nil { // as dialCluster's health client did
				t.Fatal(err)
			}
			if len(client.Brokers()) == 0 {
				t.Fatal("the client knows no broker: the check would pass vacuously")
			}
			if err := checkProduceVersion(client, wireVersion(sc.Version), cfg.Version); err != nil {
				t.Fatalf("checkProduceVersion = %v, want nil", err)
			}
		})
	}
}

// installSaramaLogger has New install sarama's logger (once per process)
// before a mock broker, which reads it, starts.
func installSaramaLogger() {
	if _, err := New(validConfig(), zerolog.Nop(), nil); err != nil {
		panic(err)
	}
}
