//go:build !race

package shutdowntest

const raceEnabled = false
