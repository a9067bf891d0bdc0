// Tests of the log sinks: what a slog handler and a logrus hook are given.

package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/sirupsen/logrus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type traceKey struct{}

// contextHandler is a slog.Handler that records the trace ID of each
// record's context, then hands the record on.
type contextHandler struct {
	slog.Handler
	mu     *sync.Mutex
	traces *[]any
}

func (h contextHandler) Handle(ctx context.Context, r slog.Record) error {
	h.mu.Lock()
	*h.traces = append(*h.traces, ctx.Value(traceKey{}))
	h.mu.Unlock()
	return h.Handler.Handle(ctx, r)
}

func (h contextHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return contextHandler{h.Handler.WithAttrs(as), h.mu, h.traces}
}

func (h contextHandler) WithGroup(name string) slog.Handler {
	return contextHandler{h.Handler.WithGroup(name), h.mu, h.traces}
}

// The library's slog lines fit a user's logger: the controller's name and
// UUID are in a group of their own ("controller"), so a logger made with
// With("name", …) keeps its own name and the JSON has one "name" key; the
// handler gets the run's context (the values of params.Context reach it);
// and AddSource names no line of the library: a controller's lines have no
// source (they come from its goroutine, not from a line of the program),
// and a refused install names the program's call.
func TestSlogLinesFitTheUsersLogger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out bytes.Buffer
		var mu sync.Mutex
		var traces []any
		h := contextHandler{slog.NewJSONHandler(&out, &slog.HandlerOptions{AddSource: true}), &mu, &traces}
		m := NewManager(WithSlog(slog.New(h).With("name", "agent-7")), WithMetrics(nil))
		ctx := context.WithValue(context.Background(), traceKey{}, "trace-42")
		c := m.UpdateController("push", ControllerParams{DoFunc: func(context.Context) error { return errBoom }, Context: ctx})
		synctest.Wait()
		require.NoError(t, m.Shutdown(context.Background()))
		m.UpdateController("late", ControllerParams{DoFunc: NoopFunc})

		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		require.Len(t, lines, 2, "the Warn of the failure, the Warn of the refused install:\n%s", out.String())
		assert.Equal(t, 1, strings.Count(lines[0], `"name":`)-strings.Count(lines[0], `"controller":{"name":`), "one name of the user's: %s", lines[0])
		var failed struct {
			Name       string
			Msg        string
			Controller struct{ Name, UUID string }
			Source     any
		}
		require.NoError(t, json.Unmarshal([]byte(lines[0]), &failed))
		assert.Equal(t, "agent-7", failed.Name)
		assert.Equal(t, "controller failed; retrying", failed.Msg)
		assert.Equal(t, struct{ Name, UUID string }{"push", c.UUID()}, failed.Controller)
		assert.Nil(t, failed.Source, "a controller's line has no source: %s", lines[0])

		var refused struct {
			Msg    string
			Source struct{ File string }
		}
		require.NoError(t, json.Unmarshal([]byte(lines[1]), &refused))
		assert.Contains(t, refused.Msg, "refusing to install")
		assert.True(t, strings.HasSuffix(refused.Source.File, "log_test.go"), "a refused install names the call: %s", lines[1])

		assert.Equal(t, []any{"trace-42", nil}, traces, "the handler gets the run's context")
	})
}

// logrus gets the same: the run's context on the entry, and the
// controller's name and UUID under Cilium's keys.
func TestLogrusEntryHasTheRunContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		ctx := context.WithValue(context.Background(), traceKey{}, "trace-42")
		c := e.m.UpdateController("push", ControllerParams{DoFunc: func(context.Context) error { return errors.New("down") }, Context: ctx})
		synctest.Wait()
		e.m.RemoveAllAndWait()
		en := e.hook.LastEntry()
		require.NotNil(t, en)
		assert.Equal(t, logrus.WarnLevel, en.Level)
		require.NotNil(t, en.Context)
		assert.Equal(t, "trace-42", en.Context.Value(traceKey{}))
		assert.Equal(t, logrus.Fields{"subsys": "controller", "name": "push", "uuid": c.UUID(), "error": en.Data["error"]}, en.Data)
	})
}

// A program coming from Cilium keeps its log queries: on logrus a
// controller's name and UUID are under Cilium's keys, name and uuid (the
// contract's Logging section), in the core's own lines and in those that
// code around a Manager (ha's replicas) logs through Manager.Logger with
// the controller group the core uses on slog. The keys controller.name
// and controller.uuid, which a query on name= does not match, are gone.
func TestLogrusKeysAreCiliums(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out bytes.Buffer
		logger := logrus.New()
		logger.SetOutput(&out)
		logger.SetFormatter(&logrus.TextFormatter{DisableTimestamp: true, DisableColors: true})
		m := NewManager(WithLogger(logger), WithMetrics(nil))
		c := m.UpdateController("push", ControllerParams{DoFunc: func(context.Context) error { return errors.New("down") }})
		synctest.Wait()
		m.Logger().Info("claimed: running here", slog.Group("controller", slog.String("name", "push")))
		m.Logger().Info("other", slog.Group("controller", slog.String("version", "7")))
		m.RemoveAllAndWait()

		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		require.Len(t, lines, 3, out.String())
		for _, want := range []string{
			`level=warning msg="controller failed; retrying" error=down name=push subsys=controller uuid=` + c.UUID(),
			`level=info msg="claimed: running here" name=push subsys=controller`,
			`level=info msg=other controller.version=7 subsys=controller`,
		} {
			assert.Contains(t, lines, want, "a query on name=push or uuid= finds the line")
		}
		assert.NotContains(t, out.String(), "controller.name")
		assert.NotContains(t, out.String(), "controller.uuid")
	})
}

// Whether a line is wanted is asked with the run's context too, not
// context.Background: a handler that enables Debug by a value of the
// context (per tenant, per sampled trace) gets the "controller run" line
// of a plain run.
func TestSlogEnabledSeesTheRunContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := &ctxDebugHandler{}
		m := NewManager(WithSlog(slog.New(h)), WithMetrics(nil))
		ctx := context.WithValue(context.Background(), debugKey{}, true)
		m.UpdateController("c", ControllerParams{Context: ctx, DoFunc: NoopFunc})
		synctest.Wait()
		m.RemoveAllAndWait()
		h.mu.Lock()
		defer h.mu.Unlock()
		assert.Contains(t, h.msgs, "controller run", "Enabled(ctx, Debug) is true for the run's context")
	})
}

type debugKey struct{}

// ctxDebugHandler enables Debug only for a context carrying debugKey.
type ctxDebugHandler struct {
	mu   sync.Mutex
	msgs []string
}

func (h *ctxDebugHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelInfo || ctx.Value(debugKey{}) != nil
}

func (h *ctxDebugHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.msgs = append(h.msgs, r.Message)
	return nil
}

func (h *ctxDebugHandler) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h *ctxDebugHandler) WithGroup(string) slog.Handler { return h }
