// Package nilsink is a logr.LogSink for quiesce's tests of typed-nil plug-ins: a typed nil
// of it as a Logger's sink fails at the first line logged, as most sinks would.
package nilsink

import "github.com/go-logr/logr"

// Sink is a logr.LogSink whose methods, but Init, need a non-nil receiver.
type Sink struct{ lines int }

// Logger returns a Logger whose sink is a nil *Sink.
func Logger() logr.Logger { return logr.New((*Sink)(nil)) }

func (*Sink) Init(logr.RuntimeInfo)            {}
func (s *Sink) Enabled(int) bool               { return s.lines >= 0 }
func (s *Sink) Info(int, string, ...any)       { s.lines++ }
func (s *Sink) Error(error, string, ...any)    { s.lines++ }
func (s *Sink) WithValues(...any) logr.LogSink { return s }
func (s *Sink) WithName(string) logr.LogSink   { return s }
