//go:build race

package main

// raceEnabled: the test binary runs with the race detector, and so does the operator it builds.
const raceEnabled = true
