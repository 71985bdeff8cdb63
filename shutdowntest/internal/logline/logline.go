// Package logline reads one line of an operator's log in the formats that controller-runtime
// operators write: controller-runtime's zap logger (log/zap) with its console encoder
// (development mode: "time\tLEVEL\tlogger\tmessage\t{key/values as JSON}") or its JSON
// encoder (production mode), and log/slog's text handler ("time=... level=INFO msg=...
// key=value", values quoted as strconv.Quote quotes them) or JSON handler, behind
// logr.FromSlogHandler, and logrus' text formatter (slog's form, time quoted, levels in lower
// case) or JSON formatter, behind bombsimon/logrusr. shutdowntest keeps the parsing here,
// apart, with a fixture test per format, as goleak keeps its stack parser in internal/stack.
package logline

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
)

// Format is a log format Parse reads.
type Format string

// The formats Parse reads.
const (
	ZapConsole Format = "zap-console" // controller-runtime's zap logger, development mode
	ZapJSON    Format = "zap-json"    // controller-runtime's zap logger, production mode
	SlogText   Format = "slog-text"   // slog.NewTextHandler
	SlogJSON   Format = "slog-json"   // slog.NewJSONHandler
	LogrusText Format = "logrus-text" // logrus.TextFormatter, through logrusr
	LogrusJSON Format = "logrus-json" // logrus.JSONFormatter, through logrusr
)

// Entry is one line of the log, read.
type Entry struct {
	Format Format
	Level  string // as written: "INFO", "info", "DEBUG-4", "LEVEL(-5)"
	Logger string // the logger's name (logr's WithName); "" when none or unknown
	Msg    string
	fields map[string]value
}

// value is one key's value: JSON as written, or slog text's value, unquoted.
type value struct {
	json json.RawMessage
	text string
}

// Has reports whether the line has key.
func (e Entry) Has(key string) bool {
	_, ok := e.fields[key]
	return ok
}

// String returns key's value as text: a JSON string's content, any other JSON value as
// written, slog text's value unquoted; "" when the line has no key.
func (e Entry) String(key string) string {
	v, ok := e.fields[key]
	if !ok {
		return ""
	}
	if v.json == nil {
		return v.text
	}
	var s string
	if json.Unmarshal(v.json, &s) == nil {
		return s
	}
	return string(v.json)
}

// UID returns key's value as String does, a value of a named string type such as
// controller-runtime's reconcileID (a types.UID): logrusr writes such a value as its JSON, a
// quoted string, which UID reads back in logrus' formats.
func (e Entry) UID(key string) string {
	s := e.String(key)
	if e.Format == LogrusText || e.Format == LogrusJSON {
		var uid string
		if strings.HasPrefix(s, `"`) && json.Unmarshal([]byte(s), &uid) == nil {
			return uid
		}
	}
	return s
}

// Decode decodes key's value, as JSON, into out: slog text's value is read as JSON text (a
// number, true, a JSON array written as a string), and so is a JSON string's content when
// out cannot hold the string itself (logrusr marshals values it does not know to such a
// string). It reports whether it could.
func (e Entry) Decode(key string, out any) bool {
	v, ok := e.fields[key]
	if !ok {
		return false
	}
	if v.json == nil {
		return json.Unmarshal([]byte(v.text), out) == nil
	}
	if json.Unmarshal(v.json, out) == nil {
		return true
	}
	var s string
	return json.Unmarshal(v.json, &s) == nil && json.Unmarshal([]byte(s), out) == nil
}

// Error returns the line's error: the value of "error" (zapr's key) or, when it has none,
// of "err" (logr's slog handler's key); "" when it has neither.
func (e Entry) Error() string {
	if e.Has("error") {
		return e.String("error")
	}
	return e.String("err")
}

// Parse reads line in any of the formats; ok is false when it is in none of them.
func Parse(line string) (e Entry, ok bool) {
	line = strings.TrimSpace(line)
	switch {
	case strings.HasPrefix(line, "{"):
		return parseJSON(line)
	case strings.Contains(line, "\t"):
		return parseConsole(line)
	default:
		return parseText(line)
	}
}

// parseJSON reads a JSON object with a string "msg": slog's or logrus' (levels in lower
// case) when it has "time" and no "ts" (zap's time key), zap's otherwise.
func parseJSON(line string) (Entry, bool) {
	var raw map[string]json.RawMessage
	if json.Unmarshal([]byte(line), &raw) != nil {
		return Entry{}, false
	}
	e := Entry{Format: ZapJSON, fields: make(map[string]value, len(raw))}
	for k, v := range raw {
		e.fields[k] = value{json: v}
	}
	if !e.Has("msg") || !e.Has("level") {
		return Entry{}, false
	}
	e.Msg, e.Level, e.Logger = e.String("msg"), e.String("level"), e.String("logger")
	if e.Has("time") && !e.Has("ts") {
		e.Format = SlogJSON
		if logrusLevel(e.Level) {
			e.Format = LogrusJSON
		}
	}
	return e, true
}

// zapLevel matches the levels of zap's capital level encoders, colored or not: DEBUG to
// FATAL, and logr's V(n) beyond 1 as LEVEL(-n).
var zapLevel = regexp.MustCompile(
	`^(?:\x1b\[\d+m)?(DEBUG|INFO|WARN|ERROR|DPANIC|PANIC|FATAL|LEVEL\(-?\d+\))(?:\x1b\[0m)?$`)

// parseConsole reads zap's console encoding: tab-separated time (unless the encoder has
// none), level, logger name (if any), caller (if any), message, then the key/values as one
// JSON object (if any). The message is the field before the JSON, or the last one.
func parseConsole(line string) (Entry, bool) {
	parts := strings.Split(line, "\t")
	at := -1
	for i := 0; i < len(parts) && i < 2; i++ {
		if zapLevel.MatchString(parts[i]) {
			at = i
			break
		}
	}
	if at < 0 {
		return Entry{}, false
	}
	e := Entry{Format: ZapConsole, Level: zapLevel.FindStringSubmatch(parts[at])[1]}
	rest := parts[at+1:]
	if n := len(rest); n > 0 && strings.HasPrefix(rest[n-1], "{") {
		var raw map[string]json.RawMessage
		if json.Unmarshal([]byte(rest[n-1]), &raw) == nil {
			e.fields = make(map[string]value, len(raw))
			for k, v := range raw {
				e.fields[k] = value{json: v}
			}
			rest = rest[:n-1]
		}
	}
	if len(rest) == 0 {
		return Entry{}, false
	}
	e.Msg = rest[len(rest)-1]
	if len(rest) > 1 && !strings.Contains(rest[0], ".go:") { // not the caller: the logger
		e.Logger = rest[0]
	}
	return e, true
}

// parseText reads slog's text handler's key=value pairs, separated by one space; a key or a
// value that needs quoting (a space, '=', '"', a character not printable) is a Go quoted
// string. It needs a "level" and a "msg", and the line begins with one of slog's built-in
// keys (time, level, msg), never quoted: go-logr/funcr's `"level"=0 "msg"="..."` is not
// slog's. logrus' text formatter writes the same form (when its output is no terminal, or
// with DisableColors), its levels in lower case.
func parseText(line string) (Entry, bool) {
	first, _, _ := strings.Cut(line, "=")
	if first != "time" && first != "level" && first != "msg" {
		return Entry{}, false
	}
	e := Entry{Format: SlogText, fields: map[string]value{}}
	for s := line; s != ""; {
		key, rest, ok := textToken(s, true)
		if !ok || !strings.HasPrefix(rest, "=") {
			return Entry{}, false
		}
		val, rest, ok := textToken(rest[1:], false)
		if !ok || (rest != "" && rest[0] != ' ') {
			return Entry{}, false
		}
		e.fields[key] = value{text: val}
		s = strings.TrimLeft(rest, " ")
	}
	if !e.Has("msg") || !e.Has("level") {
		return Entry{}, false
	}
	e.Msg, e.Level, e.Logger = e.String("msg"), e.String("level"), e.String("logger")
	if logrusLevel(e.Level) {
		e.Format = LogrusText
	}
	return e, true
}

// logrusLevel reports whether level is as logrus writes it: in lower case ("info", "warning",
// and "unknown" for logr's V(3) and beyond), where slog writes "INFO", "DEBUG-1".
func logrusLevel(level string) bool { return level != "" && level == strings.ToLower(level) }

// textToken reads a key (up to '=') or a value (up to ' ') at the start of s, quoted or not,
// and returns it unquoted and what follows it.
func textToken(s string, key bool) (tok, rest string, ok bool) {
	if strings.HasPrefix(s, `"`) {
		q, err := strconv.QuotedPrefix(s)
		if err != nil {
			return "", "", false
		}
		tok, err = strconv.Unquote(q)
		return tok, s[len(q):], err == nil
	}
	end := strings.IndexByte(s, ' ')
	if key {
		end = strings.IndexByte(s, '=')
	}
	if end < 0 {
		end = len(s)
	}
	if (key && end == 0) || strings.ContainsAny(s[:end], " =\"") {
		return "", "", false
	}
	return s[:end], s[end:], true
}
