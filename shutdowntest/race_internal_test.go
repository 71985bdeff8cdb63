//go:build race

package shutdowntest

// raceEnabled: the test binary runs with the race detector.
const raceEnabled = true
