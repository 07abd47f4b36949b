package main

import (
	"os"
	"runtime/debug"
)

// Go runtime GC pacing of `outbox-relay run`. At the default GOGC (100) the
// drain spent about a quarter of its CPU in the garbage collector: most of
// what an event allocates dies within milliseconds (its Kafka ack), so the
// live heap is small and a collection ran every few MiB. A larger GOGC
// collects less often; the soft memory limit keeps the heap bounded
// whatever the load (the collector works harder near it).
const (
	defaultGOGC = 400
	// memLimitBase is what the runtime needs besides the in-flight events:
	// buffers, sarama, the metrics registry, code and stacks.
	memLimitBase = 32 << 20
)

// gcTuning is the GC percent and soft memory limit (bytes) for a relay
// whose in-flight payload bytes are bounded by maxInflightBytes; set is
// false for each one the standard GOGC / GOMEMLIMIT environment variable
// names (the runtime already applied it). The limit is the in-flight
// payload bytes plus memLimitBase: 96 MiB by default, so the drain stays
// below 128 MiB of RSS. It is soft: a heap that really holds more (large
// payloads filling inflight.max_bytes) exceeds it, and the runtime then
// caps the collector at about half of the CPU; set GOMEMLIMIT higher then.
func gcTuning(maxInflightBytes int64, getenv func(string) string) (percent int, setPercent bool, limit int64, setLimit bool) {
	percent, setPercent = defaultGOGC, getenv("GOGC") == ""
	limit, setLimit = maxInflightBytes+memLimitBase, getenv("GOMEMLIMIT") == ""
	return
}

// tuneGC applies gcTuning and returns the values in effect (-1: GC off).
func tuneGC(maxInflightBytes int64) (percent int, limit int64) {
	p, setP, l, setL := gcTuning(maxInflightBytes, os.Getenv)
	if setP {
		debug.SetGCPercent(p)
	}
	if setL {
		debug.SetMemoryLimit(l)
	}
	percent = debug.SetGCPercent(-1)
	debug.SetGCPercent(percent)
	return percent, debug.SetMemoryLimit(-1)
}
