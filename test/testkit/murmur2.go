package testkit

// Murmur2 is org.apache.kafka.common.utils.Utils.murmur2 (seed 0x9747b28c),
// written from the Java source, independent of sarama's and the relay's
// implementations (sink's murmur2): the oracle the partition checks trust.
// Keep it a separate implementation: checking the producer's partitions
// with the producer's own hash would pass any bug in it. murmur2_test.go
// pins it to Kafka's own test vectors.
func Murmur2(key []byte) int32 {
	const m, r = uint32(0x5bd1e995), 24
	h := uint32(0x9747b28c) ^ uint32(len(key))
	n := len(key) / 4
	for i := 0; i < n; i++ {
		k := uint32(key[i*4]) | uint32(key[i*4+1])<<8 | uint32(key[i*4+2])<<16 | uint32(key[i*4+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h = h*m ^ k
	}
	switch rest := key[n*4:]; len(rest) {
	case 3:
		h ^= uint32(rest[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(rest[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(rest[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}

// Partition is the Java client's partition for a keyed record:
// Utils.toPositive(Utils.murmur2(key)) % partitions; -1 for no partitions
// (so a missing partition count never passes a check).
func Partition(key []byte, partitions int) int32 {
	if partitions <= 0 {
		return -1
	}
	return (Murmur2(key) & 0x7fffffff) % int32(partitions)
}
