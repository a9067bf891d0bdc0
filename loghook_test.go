// Tests of Manager.Logger and WithLogAttrs: lines of the code around a
// Manager reach the Manager's sink, and every line carries the attributes
// added.

package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type ctxKey struct{}

// On logrus, each record of Logger is one entry of the Manager's logger:
// the level nearest to the record's, its message, time and context, and
// its attributes (the Manager's, WithAttrs', the record's; groups as key
// prefixes) as fields.
func TestLoggerWritesLogrusEntries(t *testing.T) {
	logger, hook := test.NewNullLogger()
	logger.SetLevel(logrus.TraceLevel)
	l := NewManager(WithLogger(logger)).Logger()

	at := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		level slog.Level
		want  logrus.Level
	}{
		{slog.LevelDebug - 1, logrus.TraceLevel},
		{slog.LevelDebug, logrus.DebugLevel},
		{slog.LevelInfo, logrus.InfoLevel},
		{slog.LevelInfo + 2, logrus.InfoLevel},
		{slog.LevelWarn, logrus.WarnLevel},
		{slog.LevelError, logrus.ErrorLevel},
		{slog.LevelError + 4, logrus.ErrorLevel},
	} {
		hook.Reset()
		r := slog.NewRecord(at, tc.level, "joined", 0)
		r.AddAttrs(slog.String("lease", "7f"), slog.Group("view", slog.Int("members", 3), slog.Group("", slog.Bool("inline", true))), slog.Group("empty"))
		ctx := context.WithValue(context.Background(), ctxKey{}, "trace-1")
		require.NoError(t, l.With("replica", "r0").WithGroup("g").Handler().Handle(ctx, r))
		e := hook.LastEntry()
		require.NotNil(t, e, "level %v", tc.level)
		assert.Equal(t, tc.want, e.Level, "level %v", tc.level)
		assert.Equal(t, "joined", e.Message)
		assert.Equal(t, at, e.Time)
		assert.Equal(t, "trace-1", e.Context.Value(ctxKey{}))
		assert.Equal(t, logrus.Fields{"subsys": "controller", "replica": "r0", "g.lease": "7f", "g.view.members": int64(3), "g.view.inline": true}, e.Data)
	}

	hook.Reset()
	logger.SetLevel(logrus.InfoLevel)
	l.Debug("hidden")
	assert.False(t, l.Enabled(context.Background(), slog.LevelDebug))
	assert.Empty(t, hook.AllEntries(), "a level the logrus logger leaves out is not written")
	l.Info("shown", "error", errBoom)
	require.Len(t, hook.AllEntries(), 1)
	assert.Equal(t, errBoom, hook.LastEntry().Data[logrus.ErrorKey], "an error is the error field logrus formats")
	assert.False(t, hook.LastEntry().Time.IsZero())
}

// On slog, Logger writes to the Manager's slog logger, with its attributes
// and those of WithLogAttrs, and nothing to logrus.
func TestLoggerWritesToTheSlogLogger(t *testing.T) {
	var out bytes.Buffer
	logger, hook := test.NewNullLogger()
	m := NewManager(WithLogger(logger), WithSlog(slog.New(slog.NewJSONHandler(&out, nil))), WithLogAttrs(slog.String("replica", "r0")))
	m.Logger().Warn("fence passed", "lease", "7f")
	var line map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &line))
	delete(line, "time")
	assert.Equal(t, map[string]any{"level": "WARN", "msg": "fence passed", "subsys": "controller", "replica": "r0", "lease": "7f"}, line)
	assert.Empty(t, hook.AllEntries(), "WithSlog replaced the logrus logger")
}

// WithLogAttrs adds its attributes to every line of the controllers and of
// Logger, on either sink; it follows the logger option it adds to.
func TestWithLogAttrs(t *testing.T) {
	forEachSink(t, func(t *testing.T, sink string) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnvOn(t, sink)
			WithLogAttrs(slog.String("replica", "r0"), slog.Int("shard", 2))(e.m)
			e.m.UpdateController("c", ControllerParams{DoFunc: newRecorder(errBoom, nil).do})
			synctest.Wait()
			e.m.Logger().Info("joined")
			e.m.RemoveAllAndWait()
			entries := e.hook.AllEntries()
			require.GreaterOrEqual(t, len(entries), 2, "the controller's warning and Logger's line")
			for _, en := range entries {
				assert.Equal(t, "r0", en.Data["replica"], en.Message)
				assert.EqualValues(t, 2, en.Data["shard"], en.Message)
				assert.Equal(t, "controller", en.Data["subsys"], en.Message)
			}
			assert.Contains(t, e.logs(logrus.InfoLevel), "joined")
		})
	})

	var out bytes.Buffer
	m := NewManager(WithLogAttrs(slog.String("replica", "r0")), WithSlog(slog.New(slog.NewTextHandler(&out, nil))))
	m.Logger().Info("joined")
	assert.NotContains(t, out.String(), "replica", "a later WithSlog replaces the logger and its attributes")
}

// A logrus hook or slog handler that panics under Logger is recovered and
// reported on standard error, as for the Manager's own lines.
func TestLoggerRecoversAPanickingSink(t *testing.T) {
	stderr := captureStderr(t)
	logger, _ := test.NewNullLogger()
	logger.AddHook(panickingHook{})
	NewManager(WithLogger(logger)).Logger().Warn("fence passed")
	NewManager(WithSlog(slog.New(&faultyHandler{panicAt: slog.LevelWarn}))).Logger().Warn("fence passed")
	assert.Equal(t, 2, strings.Count(stderr(), "controller: Manager.Logger: logging panicked: "), stderr())
}
