// The etcd client's logs, written to a log/slog handler: a zap core that
// hands each entry to the handler, for clientv3.Config.Logger.

package etcd

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ClientLogger returns a logger for clientv3.Config.Logger that writes
// the etcd client's lines to l's handler, beside the service's own,
// rather than as zap's JSON on stderr (the client's default). A nil l is
// [slog.Default]. Each line has logger=etcd-client, as the default names
// them, then the client's fields as attributes.
//
// zap's Debug, Info, Warn and Error are slog's levels of the same names;
// DPanic, Panic and Fatal are Error (zap still panics or exits after the
// line, as it would). l's handler decides which levels it writes; the
// client's default writes Info and above, and at Debug the client logs a
// line for every request it sends.
//
// One kind of line is lowered from Warn to Debug: a request that failed
// because its caller cancelled it (gRPC code Canceled, or
// [context.Canceled]; a closed client cancels its requests too). The
// caller got that error back and caused it, so the line tells nothing the
// caller does not know. A Replica's Leave and Close (package ha) cause
// such lines: they cancel the DoFuncs' contexts, so a DoFunc's request in
// flight fails that way, and end the replica's own requests (its watch, a
// keepalive waiting for its period). A request that ran out of time
// (DeadlineExceeded), or failed otherwise, stays at Warn.
//
// For no client lines at all, set clientv3.Config.Logger to zap.NewNop().
func ClientLogger(l *slog.Logger) *zap.Logger {
	if l == nil {
		l = slog.Default()
	}
	return zap.New(slogCore{h: l.Handler()}, zap.AddCaller()).Named("etcd-client")
}

// slogCore is a [zapcore.Core] that hands every entry to h.
type slogCore struct {
	h slog.Handler
}

func (c slogCore) Enabled(level zapcore.Level) bool {
	return c.h.Enabled(context.Background(), slogLevel(level))
}

func (c slogCore) With(fields []zapcore.Field) zapcore.Core {
	return slogCore{h: withFields(c.h, fields)}
}

func (c slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	level := slogLevel(e.Level)
	if level == slog.LevelWarn && cancelledByCaller(fields) {
		level = slog.LevelDebug
	}
	ctx := context.Background()
	if !c.h.Enabled(ctx, level) {
		return nil
	}
	r := slog.NewRecord(e.Time, level, e.Message, e.Caller.PC)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(fieldAttrs(fields)...)
	if e.Stack != "" {
		r.AddAttrs(slog.String("stacktrace", e.Stack))
	}
	return c.h.Handle(ctx, r)
}

func (slogCore) Sync() error { return nil }

// slogLevel maps zap's levels to slog's: those above Error are Error.
func slogLevel(level zapcore.Level) slog.Level {
	switch {
	case level <= zapcore.DebugLevel:
		return slog.LevelDebug
	case level == zapcore.InfoLevel:
		return slog.LevelInfo
	case level == zapcore.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

// cancelledByCaller tells whether an error among fields says the request
// was cancelled by its caller.
func cancelledByCaller(fields []zapcore.Field) bool {
	for _, f := range fields {
		err, ok := f.Interface.(error)
		if f.Type == zapcore.ErrorType && ok && (errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled) {
			return true
		}
	}
	return false
}

// withFields returns h with fields as attributes; a zap.Namespace among
// them opens a group holding the fields after it.
func withFields(h slog.Handler, fields []zapcore.Field) slog.Handler {
	i := slices.IndexFunc(fields, func(f zapcore.Field) bool { return f.Type == zapcore.NamespaceType })
	if i < 0 {
		if len(fields) == 0 {
			return h
		}
		return h.WithAttrs(fieldAttrs(fields))
	}
	if i > 0 {
		h = h.WithAttrs(fieldAttrs(fields[:i]))
	}
	return withFields(h.WithGroup(fields[i].Key), fields[i+1:])
}

// fieldAttrs converts fields to attributes, in order, with the values zap's
// own encoders would write (an error's message under its key, an object
// as a map); a zap.Namespace among them becomes a group holding the fields
// after it.
func fieldAttrs(fields []zapcore.Field) []slog.Attr {
	attrs := make([]slog.Attr, 0, len(fields))
	for i, f := range fields {
		if f.Type == zapcore.NamespaceType {
			return append(attrs, slog.Attr{Key: f.Key, Value: slog.GroupValue(fieldAttrs(fields[i+1:])...)})
		}
		// A field may add several keys (an error adds errorVerbose when
		// its %+v says more): sorted, so that lines compare.
		enc := zapcore.NewMapObjectEncoder()
		f.AddTo(enc)
		for _, k := range slices.Sorted(maps.Keys(enc.Fields)) {
			attrs = append(attrs, slog.Any(k, enc.Fields[k]))
		}
	}
	return attrs
}
