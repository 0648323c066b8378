package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Log formats of --log-format.
const (
	logText = "text" // one line per record: "dlock: message key=value ..."
	logJSON = "json" // one slog JSON object per record
)

// setupLog makes e's logger from the global flags: records at INFO and
// above with -v, WARN and above without, in the format --log-format names,
// on e.stderr with every remembered secret masked.
func (e *env) setupLog(verbose bool, format string) error {
	level := slog.LevelWarn
	if verbose {
		level = slog.LevelInfo
	}
	w := scrubWriter{e}
	switch format {
	case logText:
		e.log = slog.New(&lineHandler{w: w, level: level})
		e.logJSON = false
	case logJSON:
		e.log = slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
		e.logJSON = true
	default:
		return usageErr(fmt.Errorf("--log-format must be text or json, got %q", format))
	}
	e.verbose = verbose
	return nil
}

// logger is e's logger; a text logger at WARN before setupLog has run (a
// flag error is reported before it).
func (e *env) logger() *slog.Logger {
	if e.log == nil {
		e.log = slog.New(&lineHandler{w: scrubWriter{e}, level: slog.LevelWarn})
	}
	return e.log
}

// info logs an INFO record (shown with -v): a "dlock: ..." line, or a JSON
// record whose msg has no "dlock: " prefix. args are slog attributes.
func (e *env) info(msg string, args ...any) {
	e.logger().Info(msg, args...)
}

// clientLogger is the logger handed to the library (Options.Logger): its
// records are e's, except the library's own "lease lost" record, which
// "dlock run" reports itself together with what it does about it.
func (e *env) clientLogger() *slog.Logger {
	return slog.New(dropHandler{e.logger().Handler(), "dlock: lease lost"})
}

// scrubWriter writes to e.stderr with e's secrets masked.
type scrubWriter struct{ e *env }

func (w scrubWriter) Write(p []byte) (int, error) {
	if _, err := w.e.stderr.Write([]byte(w.e.scrub(string(p)))); err != nil {
		return 0, err
	}
	return len(p), nil
}

// lineHandler is the text format: a record is one line, "dlock: " and its
// message, then its attributes as key=value (values quoted when they hold
// blanks), so that dlock's own messages read as they always did and the
// library's records look like them.
type lineHandler struct {
	w     scrubWriter
	level slog.Level
	attrs []byte // preformatted attributes from WithAttrs
	group string // prefix of attribute keys from WithGroup
}

func (h *lineHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *lineHandler) Handle(_ context.Context, r slog.Record) error {
	var b bytes.Buffer
	msg := r.Message
	if !strings.HasPrefix(msg, "dlock: ") {
		b.WriteString("dlock: ")
	}
	b.WriteString(msg)
	b.Write(h.attrs)
	r.Attrs(func(a slog.Attr) bool {
		appendAttr(&b, h.group, a)
		return true
	})
	b.WriteByte('\n')
	_, err := h.w.Write(b.Bytes())
	return err
}

func (h *lineHandler) WithAttrs(as []slog.Attr) slog.Handler {
	h2 := *h
	var b bytes.Buffer
	b.Write(h.attrs)
	for _, a := range as {
		appendAttr(&b, h.group, a)
	}
	h2.attrs = b.Bytes()
	return &h2
}

func (h *lineHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	h2 := *h
	h2.group += name + "."
	return &h2
}

// appendAttr writes " key=value", a group's attributes flattened with
// dotted keys.
func appendAttr(b *bytes.Buffer, prefix string, a slog.Attr) {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return
	}
	if a.Value.Kind() == slog.KindGroup {
		p := prefix
		if a.Key != "" {
			p += a.Key + "."
		}
		for _, g := range a.Value.Group() {
			appendAttr(b, p, g)
		}
		return
	}
	var v string
	switch a.Value.Kind() {
	case slog.KindDuration:
		v = roundDuration(a.Value.Duration())
	case slog.KindTime:
		v = a.Value.Time().Format(time.RFC3339Nano)
	default:
		v = a.Value.String()
	}
	if v == "" || strings.IndexFunc(v, func(r rune) bool { return unicode.IsSpace(r) || r == '"' || r == '=' || !unicode.IsPrint(r) }) >= 0 {
		v = strconv.Quote(v)
	}
	fmt.Fprintf(b, " %s%s=%s", prefix, a.Key, v)
}

// dropHandler passes on every record but those with one message.
type dropHandler struct {
	slog.Handler
	msg string
}

func (h dropHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h dropHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return dropHandler{h.Handler.WithAttrs(as), h.msg}
}

func (h dropHandler) WithGroup(name string) slog.Handler {
	return dropHandler{h.Handler.WithGroup(name), h.msg}
}
