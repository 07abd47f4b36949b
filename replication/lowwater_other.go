//go:build !linux

package replication

// lowWaterWakes is false where a changed SO_RCVLOWAT is not known to wake
// a waiting poller: the catch-up reader sleeps instead.
const lowWaterWakes = false

func setLowWater(uintptr, int) {}
