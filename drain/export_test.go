package drain

// ReportPending logs one drain report at once, for benchmarks.
var ReportPending = (*Executor).reportPending
