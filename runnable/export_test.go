package runnable

// The limits of ServeHTTP, for the package's external tests.
const (
	DebugLimitForTest    = defaultDebugLimit
	DebugRateForTest     = debugRate
	DebugBurstForTest    = debugBurst
	DebugMaxCallsForTest = maxDebugCalls
	DebugMaxBytesForTest = maxDebugBytes
)

// NewUnmanaged returns the Runnable inside New's Runner: what a Runnable does without a
// manager (Start, ReadyzCheck, ServeHTTP) is tested on it.
func NewUnmanaged(opts Options) *Runnable { return New(opts).r }
