// log.go: the log sinks, logrus and log/slog, behind one path: every line
// the library logs is built once, as a logLine, and written by the sink.

package controller

import (
	"context"
	"fmt"
	"log/slog"
	"os"
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
// controller's its name and uuid as well.
type logSink struct {
	entry *logrus.Entry
	slog  *slog.Logger
}

// defaultSink is the zero Manager's: logrus' standard logger.
var defaultSink = logSink{entry: logrus.StandardLogger().WithField("subsys", "controller")}

// enabled reports whether a line at level would be written. It allocates
// nothing: the run loop asks it after every run.
func (s *logSink) enabled(level logLevel) bool {
	if s.slog != nil {
		return s.slog.Enabled(context.Background(), slogLevels[level])
	}
	return s.entry.Logger.IsLevelEnabled(logrusLevels[level])
}

// forController returns a sink that adds the name and uuid of a
// controller to every line.
func (s *logSink) forController(name, uuid string) *logSink {
	if s.slog != nil {
		return &logSink{slog: s.slog.With("name", name, "uuid", uuid)}
	}
	return &logSink{entry: s.entry.WithFields(logrus.Fields{"name": name, "uuid": uuid})}
}

// write writes line. A handler, hook or formatter that panics is
// recovered (see recoverLog); name names the controller in that report.
func (s *logSink) write(name string, line *logLine) {
	defer recoverLog(name)
	if !s.enabled(line.level) {
		return
	}
	if s.slog != nil {
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
		s.slog.LogAttrs(context.Background(), slogLevels[line.level], line.msg, attrs...)
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
	s.entry.WithFields(fields).Log(logrusLevels[line.level], line.msg)
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
