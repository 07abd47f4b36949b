//go:build race

package serialize

// raceEnabled: allocation counts wobble by one under the race detector.
const raceEnabled = true
