package drain

// ReportPending takes a fresh capture and logs one drain report at once, as if a Drain
// waited, for benchmarks.
func ReportPending(e *Executor) {
	ForgetCapture()
	e.mu.Lock()
	e.waiters++
	e.mu.Unlock()
	e.reportPending()
	e.mu.Lock()
	e.waiters--
	e.mu.Unlock()
}

// ForgetCapture drops the capture that later askers would reuse.
func ForgetCapture() {
	captures.mu.Lock()
	captures.last = nil
	captures.mu.Unlock()
}

// ExecutorNumbers returns how many executor numbers (label id prefixes) the process made.
func ExecutorNumbers() uint64 {
	executors.mu.Lock()
	defer executors.mu.Unlock()
	return executors.last
}

// ReleasedLabelTables returns how many label tables of executors whose drain is over, or
// that were collected, wait for the next executor.
func ReleasedLabelTables() int {
	executors.mu.Lock()
	defer executors.mu.Unlock()
	return len(executors.free)
}
