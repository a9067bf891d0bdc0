// log.go: the log sinks, logrus and log/slog, behind one path: every line
// the library logs is built once, as a logLine, and written by the sink.

package controller

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"time"

	"github.com/sirupsen/logrus"
)

// logLevel is the level of a logLine; each sink maps it to its own.
type logLevel uint8

const (
	levelDebug logLevel = iota
	levelInfo
	levelWarn
	levelError
)

var (
	logrusLevels = [...]logrus.Level{levelDebug: logrus.DebugLevel, levelInfo: logrus.InfoLevel, levelWarn: logrus.WarnLevel, levelError: logrus.ErrorLevel}
	slogLevels   = [...]slog.Level{levelDebug: slog.LevelDebug, levelInfo: slog.LevelInfo, levelWarn: slog.LevelWarn, levelError: slog.LevelError}
)

// A logLine is one line the library logs. Its fields become the sink's
// fields under the same keys for both sinks: error, duration, outcome,
// stack, panic. Zero fields are left out.
type logLine struct {
	// ctx is what the slog handler gets, and the logrus entry's Context:
	// the run's context for the lines about a run, the StopFunc's for a
	// StopFunc, else the parameters' Context. Nil: Background.
	ctx context.Context
	// pc is the source of the line for slog's AddSource: the program's
	// call into the library, for a line logged inside that call (a refused
	// install); 0, no source, for the lines of a controller's goroutine,
	// which no line of the program logs.
	pc       uintptr
	level    logLevel
	msg      string
	err      error
	duration time.Duration // with timed
	timed    bool
	outcome  string
	stack    []byte
	panicked any // a recovered panic's value, with hasPanic
	hasPanic bool
}

// A logSink is where a Manager's or a controller's lines go: to logrus
// when slog is nil, else to slog. Both carry subsys=controller, and a
// controller's its name and UUID as well: on logrus under Cilium's keys,
// name and uuid (logNameKey, logUUIDKey), so that a query written for
// Cilium's logs finds them; on slog in the group controller, so that a
// logger made with With("name", …) keeps its own name (a JSON line with
// two "name" keys is one most readers take the last of).
type logSink struct {
	entry *logrus.Entry
	slog  *slog.Logger
}

// The logrus keys of a controller's name and UUID, Cilium's. On slog the
// same two are "name" and "uuid" in the group "controller" (slogGroup).
const (
	logNameKey = "name"
	logUUIDKey = "uuid"
	slogGroup  = "controller"
)

// logrusKey returns the logrus key of a slog attribute whose key, behind
// its groups' names and dots, is key: a controller named as the core names
// it on slog (controller.name, controller.uuid, as ha's replicas do)
// gets the keys of the core's own logrus lines; any other keeps key.
func logrusKey(key string) string {
	switch key {
	case slogGroup + "." + logNameKey:
		return logNameKey
	case slogGroup + "." + logUUIDKey:
		return logUUIDKey
	}
	return key
}

// defaultSink is the zero Manager's: logrus' standard logger.
var defaultSink = logSink{entry: logrus.StandardLogger().WithField("subsys", "controller")}

// enabled reports whether a line at level, logged with ctx (nil:
// Background), would be written: a slog handler may decide by a value of
// the run's context, as it does for the line itself. It allocates nothing:
// the run loop asks it after every run.
func (s *logSink) enabled(ctx context.Context, level logLevel) bool {
	if s.slog != nil {
		return s.slog.Enabled(ctx, slogLevels[level])
	}
	return s.entry.Logger.IsLevelEnabled(logrusLevels[level])
}

// forController returns a sink that adds the name and UUID of a
// controller to every line.
func (s *logSink) forController(name, uuid string) *logSink {
	if s.slog != nil {
		return &logSink{slog: s.slog.With(slog.Group(slogGroup, logNameKey, name, logUUIDKey, uuid))}
	}
	return &logSink{entry: s.entry.WithFields(logrus.Fields{logNameKey: name, logUUIDKey: uuid})}
}

// write writes line. A handler, hook or formatter that panics is
// recovered (see recoverLog); name names the controller in that report.
func (s *logSink) write(name string, line *logLine) {
	defer recoverLog(name)
	ctx := line.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	if s.slog != nil {
		if !s.slog.Enabled(ctx, slogLevels[line.level]) {
			return
		}
		attrs := make([]slog.Attr, 0, 4)
		if line.err != nil {
			attrs = append(attrs, slog.Any("error", line.err))
		}
		if line.timed {
			attrs = append(attrs, slog.Duration("duration", line.duration))
		}
		if line.outcome != "" {
			attrs = append(attrs, slog.String("outcome", line.outcome))
		}
		if line.hasPanic {
			attrs = append(attrs, slog.Any("panic", line.panicked))
		}
		if line.stack != nil {
			attrs = append(attrs, slog.String("stack", string(line.stack)))
		}
		// A record of our own rather than Logger.LogAttrs, which would
		// take this line as its source.
		r := slog.NewRecord(time.Now(), slogLevels[line.level], line.msg, line.pc)
		r.AddAttrs(attrs...)
		_ = s.slog.Handler().Handle(ctx, r) // as Logger does, an error of the handler's is its own
		return
	}
	if !s.entry.Logger.IsLevelEnabled(logrusLevels[line.level]) {
		return
	}
	fields := make(logrus.Fields, 4)
	if line.err != nil {
		fields[logrus.ErrorKey] = line.err
	}
	if line.timed {
		fields["duration"] = line.duration
	}
	if line.outcome != "" {
		fields["outcome"] = line.outcome
	}
	if line.hasPanic {
		fields["panic"] = line.panicked
	}
	if line.stack != nil {
		fields["stack"] = string(line.stack)
	}
	s.entry.WithContext(ctx).WithFields(fields).Log(logrusLevels[line.level], line.msg)
}

// callerPC returns the program counter of the call into the library that
// called the function calling callerPC (UpdateController's caller, for
// install), as the source of a line logged inside it.
func callerPC() uintptr {
	var pcs [1]uintptr
	runtime.Callers(4, pcs[:]) // runtime.Callers, callerPC, install, UpdateController
	return pcs[0]
}

// recoverLog, deferred around writing a line, keeps a panicking logrus hook
// or formatter, or slog handler, from ending the goroutine that logs (a
// controller's, and the program with it). The panic goes to standard
// error, where logrus reports a hook that fails.
func recoverLog(name string) {
	if r := recover(); r != nil {
		fmt.Fprintf(os.Stderr, "controller %q: logging panicked: %v\n", name, r)
	}
}
