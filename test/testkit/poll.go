package testkit

import (
	"fmt"
	"testing"
	"time"
)

// Poll calls cond every interval until it reports done, returns an error,
// or d passes (an error naming d).
func Poll(d, every time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", d)
		}
		<-tick.C
	}
}

// WaitFor polls cond every 50ms until it holds, failing t after d.
func WaitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := Poll(d, 50*time.Millisecond, func() (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("%v waiting for %s", err, what)
	}
}

// Must returns v, failing t when err is not nil: for one-line test helpers.
func Must[V any](t testing.TB, v V, err error) V {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	return v
}
