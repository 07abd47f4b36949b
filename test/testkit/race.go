package testkit

import (
	"os"
	"strings"
)

// raceExitCode is what a -race binary exits with after reporting a race.
const raceExitCode = 66

// knownRaces are data races inside dependencies, reported upstream and not
// reachable from the relay's code: each is a pair of functions whose
// accesses the race detector pairs. They are tolerated in tests (counted
// and noted), every other race fails them.
var knownRaces = []struct{ a, b, why string }{
	// sarama's transaction manager reads lastError under partitionInTxnLock
	// and writes it under statusLock (IBM/sarama#2913, still in v1.61.1):
	// a broker error while partitions are being added to a transaction.
	{"sarama.(*transactionManager).transitionTo()", "sarama.(*transactionManager).publishTxnPartitions()", "IBM/sarama#2913"},
}

// Races counts the race detector's reports in a relay log: unknown ones,
// and known ones (knownRaces) with their upstream references.
func Races(log string) (unknown, known int, refs []string) {
	blocks := strings.Split(log, "WARNING: DATA RACE")
	for _, b := range blocks[1:] {
		// The two accesses come before "Goroutine N (...) created at:".
		if i := strings.Index(b, "\nGoroutine "); i >= 0 {
			b = b[:i]
		}
		ref := ""
		for _, k := range knownRaces {
			if strings.Contains(b, k.a) && strings.Contains(b, k.b) && !strings.Contains(b, "outbox-relay/outbox-relay/") {
				ref = k.why
				break
			}
		}
		if ref == "" {
			unknown++
			continue
		}
		known++
		refs = append(refs, ref)
	}
	return unknown, known, refs
}

// raceTolerated reports whether a -race relay that exited with code did so
// only for known races in its log at path.
func raceTolerated(code int, path string) bool {
	if code != raceExitCode || path == "" {
		return false
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	unknown, known, _ := Races(string(b))
	return unknown == 0 && known > 0
}
