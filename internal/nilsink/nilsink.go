package nilsink

import "github.com/go-logr/logr"

// sink is a logr.LogSink whose methods, but Init, need a non-nil receiver.
type sink struct{ lines int }

// Logger returns a Logger whose sink is a typed nil: logr.New calls only its Init.
func Logger() logr.Logger { return logr.New((*sink)(nil)) }

func (*sink) Init(logr.RuntimeInfo)            {}
func (s *sink) Enabled(int) bool               { return s.lines >= 0 }
func (s *sink) Info(int, string, ...any)       { s.lines++ }
func (s *sink) Error(error, string, ...any)    { s.lines++ }
func (s *sink) WithValues(...any) logr.LogSink { return s }
func (s *sink) WithName(string) logr.LogSink   { return s }
