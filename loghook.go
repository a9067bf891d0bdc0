// loghook.go: a Manager's log sink for the code around it: a log/slog
// logger that writes where the Manager's controllers log, and an option
// that adds attributes to every line of both.

package controller

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/sirupsen/logrus"
)

// Logger returns a [log/slog] logger that writes where m's controllers
// log, with the attributes their lines carry (subsys=controller, and those
// of [WithLogAttrs]): to the logger given to [WithSlog], or else to the
// logrus logger of [WithLogger] (logrus' standard logger by default), each
// record then one logrus entry at the nearest level (below Debug: Trace)
// with the record's attributes as fields, a group's keys prefixed with the
// group's name and a dot, but for a controller named as the core names it
// on slog, slog.Group("controller", "name", …, "uuid", …): on logrus that
// is name and uuid, as on the Manager's own entries.
//
// Code built around a Manager, such as the replicas of
// github.com/bgctl/controller/ha, logs through it, so that a program that
// chose slog gets slog lines only, and one that chose logrus logrus
// entries only. As for the Manager's own lines, a handler, hook or
// formatter that panics is recovered and reported on standard error.
// Call it after the options are applied: it reads them.
func (m *Manager) Logger() *slog.Logger {
	s := m.newSink()
	if s.slog != nil {
		return slog.New(recoveringHandler{s.slog.Handler()})
	}
	return slog.New(recoveringHandler{&logrusHandler{entry: s.entry}})
}

// WithLogAttrs adds attrs to every line the Manager logs, its controllers'
// and those of [Manager.Logger]: to the logger chosen by the options
// before it, which it must follow, since [WithLogger] and [WithSlog]
// replace the logger and these attributes with it. For logrus each
// attribute becomes a field, a group's keys prefixed with its name and a
// dot. No attrs: it changes nothing.
func WithLogAttrs(attrs ...slog.Attr) Option {
	return func(m *Manager) {
		if len(attrs) == 0 {
			return
		}
		s := m.newSink()
		if s.slog != nil {
			m.slogLog = slog.New(s.slog.Handler().WithAttrs(attrs))
			return
		}
		fields := make(logrus.Fields, len(attrs))
		for _, a := range attrs {
			addLogrusField(fields, "", a)
		}
		m.logrusLog = s.entry.WithFields(fields)
	}
}

// logrusHandler is a slog.Handler that writes each record as an entry of a
// logrus logger.
type logrusHandler struct {
	entry  *logrus.Entry // with the attributes of WithAttrs as fields
	prefix string        // the groups opened by WithGroup, each followed by "."
}

func (h *logrusHandler) Enabled(_ context.Context, level slog.Level) bool {
	return h.entry.Logger.IsLevelEnabled(logrusLevelOf(level))
}

func (h *logrusHandler) Handle(ctx context.Context, r slog.Record) error {
	fields := make(logrus.Fields, r.NumAttrs())
	r.Attrs(func(a slog.Attr) bool {
		addLogrusField(fields, h.prefix, a)
		return true
	})
	e := h.entry.WithFields(fields) // a copy of its own: its Time and Context are ours to set
	if !r.Time.IsZero() {
		e.Time = r.Time // else logrus stamps the entry when it writes it
	}
	e.Context = ctx
	e.Log(logrusLevelOf(r.Level), r.Message)
	return nil
}

func (h *logrusHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	fields := make(logrus.Fields, len(attrs))
	for _, a := range attrs {
		addLogrusField(fields, h.prefix, a)
	}
	return &logrusHandler{entry: h.entry.WithFields(fields), prefix: h.prefix}
}

func (h *logrusHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &logrusHandler{entry: h.entry, prefix: h.prefix + name + "."}
}

// addLogrusField adds a to fields under prefix+key, a group's attributes
// each under prefix+group+"."+key (a group without a key inline), but
// controller.name and controller.uuid under name and uuid (logrusKey). It
// leaves out what a slog handler leaves out: an empty attribute and an
// empty group.
func addLogrusField(fields logrus.Fields, prefix string, a slog.Attr) {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return
	}
	if a.Value.Kind() != slog.KindGroup {
		fields[logrusKey(prefix+a.Key)] = a.Value.Any()
		return
	}
	if a.Key != "" {
		prefix += a.Key + "."
	}
	for _, g := range a.Value.Group() {
		addLogrusField(fields, prefix, g)
	}
}

// logrusLevelOf returns the logrus level nearest to a slog level: slog's
// four named levels map to logrus' of the same names, the levels between
// them to the named one below, and those below Debug to Trace.
func logrusLevelOf(l slog.Level) logrus.Level {
	switch {
	case l >= slog.LevelError:
		return logrus.ErrorLevel
	case l >= slog.LevelWarn:
		return logrus.WarnLevel
	case l >= slog.LevelInfo:
		return logrus.InfoLevel
	case l >= slog.LevelDebug:
		return logrus.DebugLevel
	}
	return logrus.TraceLevel
}

// recoveringHandler keeps a handler (or logrus hook, or formatter) that
// panics from ending the goroutine that logs, as the Manager's own lines
// do (see recoverLog): the panic goes to standard error.
type recoveringHandler struct{ h slog.Handler }

func (h recoveringHandler) Enabled(ctx context.Context, level slog.Level) bool {
	defer recoverLogger()
	return h.h.Enabled(ctx, level)
}

func (h recoveringHandler) Handle(ctx context.Context, r slog.Record) error {
	defer recoverLogger()
	return h.h.Handle(ctx, r)
}

func (h recoveringHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return recoveringHandler{h.h.WithAttrs(attrs)}
}

func (h recoveringHandler) WithGroup(name string) slog.Handler {
	return recoveringHandler{h.h.WithGroup(name)}
}

func recoverLogger() {
	if r := recover(); r != nil {
		fmt.Fprintf(os.Stderr, "controller: Manager.Logger: logging panicked: %v\n", r)
	}
}
