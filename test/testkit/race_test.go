package testkit

import (
	"os"
	"strings"
	"testing"
)

// Races tolerates only the known race of a dependency; a race that touches
// the relay's own code, or any other, counts as unknown.
func TestRaces(t *testing.T) {
	b, err := os.ReadFile("testdata/race-sarama-2913.txt") // a real report, from the chaos suite's relay log
	if err != nil {
		t.Fatal(err)
	}
	sarama := string(b)
	// The same report with one access in the relay's code instead.
	ours := strings.Replace(sarama, "github.com/IBM/sarama.(*transactionManager).publishTxnPartitions()",
		"github.com/outbox-relay/outbox-relay/sink.(*TxnProducer).Send()", 1)
	other := "==================\nWARNING: DATA RACE\nWrite at 0x1 by goroutine 7:\n  main.a()\n\nPrevious read at 0x1 by goroutine 8:\n  main.b()\n==================\n"
	cases := []struct {
		name           string
		log            string
		unknown, known int
	}{
		{"none", `{"level":"info"}`, 0, 0},
		{"sarama#2913", "x\n" + sarama + "y\n", 0, 1},
		{"twice", sarama + sarama, 0, 2},
		{"the relay's code", ours, 1, 0},
		{"another race", other, 1, 0},
		{"known and unknown", sarama + other, 1, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u, k, refs := Races(tc.log)
			if u != tc.unknown || k != tc.known || len(refs) != k {
				t.Fatalf("Races = %d unknown, %d known %v; want %d, %d", u, k, refs, tc.unknown, tc.known)
			}
		})
	}
}
