package reconcilers

import (
	"math/rand/v2"
	"time"
)

// Defaults of the retry delays of DaemonsOptions and lifecycle.HandlersOptions.
const (
	// DefaultBackoff is the delay before the first retry, before the jitter shortens it by
	// up to 10%.
	DefaultBackoff = time.Second
	// DefaultMaxBackoff caps the delay between retries.
	DefaultMaxBackoff = 5 * time.Minute
)

// jitterRand returns the random number in [0, 1) that picks each jitter. Tests replace it.
var jitterRand = rand.Float64
