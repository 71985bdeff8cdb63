package runnable

// The limits of ServeHTTP, for the package's external tests.
const (
	DebugLimitForTest    = defaultDebugLimit
	DebugRateForTest     = debugRate
	DebugBurstForTest    = debugBurst
	DebugMaxCallsForTest = maxDebugCalls
	DebugMaxBytesForTest = maxDebugBytes
)
