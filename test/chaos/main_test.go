//go:build e2e

// Package chaos is outbox-relay's fault-injection suite: a paced workload
// runs while the relay, the broker, PostgreSQL or the network between them
// fail, and a real Kafka consumer then checks every event: nothing lost, per
// aggregate order and partition intact, duplicates counted and explained.
//
// It needs the services of test/services.sh (its env file loaded) and fails,
// never skips, without them. OUTBOX_CHAOS=long runs the long version (100k
// events per scenario, more faults); the default is the short one that
// `make test` runs. OUTBOX_CHAOS_RELAY_BIN runs a prebuilt relay instead of
// building ../../cmd/outbox-relay with -race.
//
// Every scenario runs in both delivery modes (TestChaos/<mode>/<scenario>):
// at_least_once, and exactly_once (OUTBOX_RELAY_DELIVERY=exactly_once,
// read_committed consumers, 0 duplicates and 0 partial PostgreSQL
// transactions asserted). The short scale runs each scenario in one mode
// (scenario.short); OUTBOX_CHAOS_DELIVERY=at_least_once|exactly_once|both
// overrides that for every scenario.
package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

var (
	svcs      *testkit.Services
	pgURL     string   // direct
	pgPort    string   // direct
	brokers   []string // direct PLAINTEXT listener: the consumer and the admin use it
	proxyPort string   // where the broker's PROXIED listener advertises itself
	proxyTo   string   // the PROXIED listener's real address
	relayBin  string
	runDir    string // relay logs and the table go here
	sc        scale
	// OUTBOX_CHAOS_DELIVERY: the delivery modes every scenario runs in
	// (empty: the scale's choice, runsIn).
	deliveries []delivery
)

func TestMain(m *testing.M) {
	os.Exit(mainErr(m))
}

func mainErr(m *testing.M) int {
	var err error
	svcs, err = testkit.LoadServices("OUTBOX_TEST_PG_PORT", "OUTBOX_TEST_KAFKA_PROXY_PORT", "OUTBOX_TEST_KAFKA_PROXY_TARGET")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	pgURL, pgPort, brokers = svcs.PGURL, svcs.Get("OUTBOX_TEST_PG_PORT"), svcs.Brokers
	proxyPort, proxyTo = svcs.Get("OUTBOX_TEST_KAFKA_PROXY_PORT"), svcs.Get("OUTBOX_TEST_KAFKA_PROXY_TARGET")
	switch mode := os.Getenv("OUTBOX_CHAOS"); mode {
	case "", "short":
		sc = shortScale
	case "long":
		sc = longScale
	default:
		fmt.Fprintf(os.Stderr, "FAIL: OUTBOX_CHAOS=%q: use short (default) or long\n", mode)
		return 1
	}
	switch d := os.Getenv("OUTBOX_CHAOS_DELIVERY"); d {
	case "":
	case string(atLeastOnce), string(exactlyOnce):
		deliveries = []delivery{delivery(d)}
	case "both":
		deliveries = []delivery{atLeastOnce, exactlyOnce}
	default:
		fmt.Fprintf(os.Stderr, "FAIL: OUTBOX_CHAOS_DELIVERY=%q: use at_least_once, exactly_once or both (default: both in long, split in short)\n", d)
		return 1
	}
	tmp, err := os.MkdirTemp("", "outbox-relay-chaos")
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	runDir = os.Getenv("OUTBOX_TEST_RUN_DIR")
	if runDir == "" {
		runDir = tmp
	}
	if err := os.MkdirAll(filepath.Join(runDir, "chaos-relay-logs"), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	if relayBin = os.Getenv("OUTBOX_CHAOS_RELAY_BIN"); relayBin != "" {
		if _, err := exec.LookPath(relayBin); err != nil {
			fmt.Fprintf(os.Stderr, "FAIL: OUTBOX_CHAOS_RELAY_BIN=%s: %v\n", relayBin, err)
			return 1
		}
	} else {
		// -race: the chaos runs double as a race check of the daemon.
		relayBin = filepath.Join(tmp, "outbox-relay")
		if err := testkit.BuildRelay(context.Background(), "go", relayBin, true); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			return 1
		}
	}
	fmt.Fprintf(os.Stderr, "chaos: %s scale, relay %s\n", sc.name, relayBin)
	defer stopCluster() // if a cluster scenario started it
	return m.Run()
}
