package replication

import (
	"syscall"
	"unsafe"
)

// lowWaterWakes: on Linux, TCP readiness honours SO_RCVLOWAT and setting it
// re-checks the queue at once (tcp_set_rcvlowat), so a lowered mark wakes a
// waiting poller.
const lowWaterWakes = true

// setLowWater sets SO_RCVLOWAT with a raw system call: setsockopt never
// blocks, and through syscall.SetsockoptInt each of the two calls per
// catch-up wait woke the runtime's monitor thread (see internal/rawconn).
func setLowWater(fd uintptr, v int) {
	val := int32(v)
	_, _, _ = syscall.RawSyscall6(syscall.SYS_SETSOCKOPT, fd, syscall.SOL_SOCKET, syscall.SO_RCVLOWAT,
		uintptr(unsafe.Pointer(&val)), unsafe.Sizeof(val), 0)
}
