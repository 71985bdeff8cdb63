package reconcilers

import (
	"math/rand/v2"
	"time"
)

// Defaults of the retry delays of DaemonsOptions and lifecycle.HandlersOptions.
const (
	DefaultBackoff    = time.Second     // before the first retry, less the jitter
	DefaultMaxBackoff = 5 * time.Minute // between retries
)

// jitterRand picks each jitter in [0, 1). Tests replace it.
var jitterRand = rand.Float64
