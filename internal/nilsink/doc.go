// Package nilsink is a logr.LogSink for quiesce's tests of typed-nil plug-ins: a typed nil
// of it as a Logger's sink fails at the first line logged, as most sinks would. Nothing in
// it blocks; Logger is safe for concurrent use.
package nilsink
