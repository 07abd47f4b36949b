package testkit

import "testing"

// The partition checks are only as good as Murmur2: pin it to the vectors
// of Kafka's own UtilsTest.testMurmur2 (clients/src/test/java/org/apache/
// kafka/common/utils/UtilsTest.java).
func TestMurmur2MatchesKafka(t *testing.T) {
	for _, c := range []struct {
		key  string
		want int32
	}{
		{"21", -973932308},
		{"foobar", -790332482},
		{"a-little-bit-long-string", -985981536},
		{"a-little-bit-longer-string", -1486304829},
		{"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971},
		{"abc", 479470107},
	} {
		if got := Murmur2([]byte(c.key)); got != c.want {
			t.Errorf("Murmur2(%q) = %d, want %d", c.key, got, c.want)
		}
	}
}

// Partition is toPositive (& 0x7fffffff, not Math.abs) then modulo; the
// wants follow from the Kafka vectors above.
func TestPartition(t *testing.T) {
	for _, c := range []struct {
		key        string
		partitions int
		want       int32
	}{
		{"21", 1, 0},
		{"21", 4, 0},                        // -973932308 & 0x7fffffff = 1173551340
		{"21", 7, 3},                        // 1173551340 % 7
		{"foobar", 4, 2},                    // 1357151166 % 4
		{"abc", 3, 0},                       // 479470107 % 3
		{"a-little-bit-long-string", 10, 2}, // 1161502112 % 10
		{"21", 0, -1},
	} {
		if got := Partition([]byte(c.key), c.partitions); got != c.want {
			t.Errorf("Partition(%q, %d) = %d, want %d", c.key, c.partitions, got, c.want)
		}
	}
}
