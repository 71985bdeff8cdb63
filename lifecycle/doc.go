// Package lifecycle holds handler-selection functions: given the handlers still to run, a
// lifecycle picks those to run in this cycle. They are pure functions, called inline.
package lifecycle
