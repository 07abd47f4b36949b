//go:build e2e

package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/outbox-relay/outbox-relay/test/testkit"
)

// kafka-pause returns only once every broker thread is stopped: kill -STOP
// alone returns before the group stop is done, and a broker that goes on
// answering produce requests for a few milliseconds after "paused" let
// TestKill9RestartNoLossDuplicatesOnlyUnconfirmed see events acked that it
// took for unacked. Checked right after each of several pauses, since the
// window is short.
func TestKafkaPauseStopsEveryBrokerThread(t *testing.T) {
	// Read now, not at start: a test that restarts the broker changes it.
	cur, err := testkit.LoadServices()
	if err != nil {
		t.Fatal(err)
	}
	pid := cur.Vars["OUTBOX_TEST_KAFKA_PID"]
	if pid == "" {
		t.Fatal("OUTBOX_TEST_KAFKA_PID is not set: start the services with test/services.sh, which runs the broker as a local process")
	}
	for i := range 10 {
		svc(t, "kafka-pause")
		running := notStopped(t, pid)
		svc(t, "kafka-resume")
		if len(running) > 0 {
			t.Fatalf("pause %d: kafka-pause returned with %d of the broker's threads not stopped (%d running)", i+1, len(running), strings.Count(strings.Join(running, ""), "R"))
		}
	}
}

// notStopped returns the states of the threads of pid that are not stopped.
func notStopped(t *testing.T, pid string) []string {
	t.Helper()
	stats, err := filepath.Glob("/proc/" + pid + "/task/*/stat")
	if err != nil || len(stats) == 0 {
		t.Fatalf("threads of kafka pid %s: %v (%d found)", pid, err, len(stats))
	}
	var out []string
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread exited
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 || i+2 >= len(s) {
			t.Fatalf("%s: %q", f, s)
		}
		switch st := s[i+2 : i+3]; st {
		case "T", "t", "X", "Z":
		default:
			out = append(out, st)
		}
	}
	return out
}
