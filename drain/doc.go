// Package drain is a tracked executor: it runs named calls on tracked goroutines, refuses new
// calls once it drains, and waits for every call it admitted to really end, logging at an
// interval which calls it still waits for and where they are blocked.
package drain
