package replication

import "syscall"

// lowWaterWakes: on Linux, TCP readiness honours SO_RCVLOWAT and setting it
// re-checks the queue at once (tcp_set_rcvlowat), so a lowered mark wakes a
// waiting poller.
const lowWaterWakes = true

func setLowWater(fd uintptr, v int) {
	_ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, v)
}
