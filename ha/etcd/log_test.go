// Tests of the replica's logging: one sink, its inner Manager's, with the
// replica's ID on every line.

package etcd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
)

// lockedBuffer is a bytes.Buffer safe for the writes of the replica's
// goroutines and the test's reads.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// logScene joins a replica with opts, registers "job" (its DoFunc fails,
// so the controller logs), waits until the replica claimed it and the
// controller failed, and leaves. seen reports whether the sink has the
// replica's "claimed" line and the controller's failure yet.
func logScene(t *testing.T, opts ha.Options, seen func() bool) {
	t.Helper()
	needEtcd(t)
	cli := newClient(t, testEtcd)
	defer cli.Close()
	opts.Prefix = fmt.Sprintf("/test/%s/%d", t.Name(), time.Now().UnixNano())
	opts.TTL, opts.Margin = 2*time.Second, 500*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := ha.Join(ctx, Store(cli), opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.UpdateController("job", controller.ControllerParams{
		DoFunc:                 func(context.Context) error { return errors.New("backend down") },
		ErrorRetryBaseDuration: time.Hour,
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the claim and the controller's failure in the log", seen)
	if err := r.Leave(ctx); err != nil {
		t.Fatal(err)
	}
}

// A service on log/slog passes WithSlog in ManagerOptions: the replica's
// lines and its controllers' are slog JSON, each with the replica's ID,
// and logrus (the standard logger, the default) gets nothing.
func TestReplicaLogsToTheManagersSlog(t *testing.T) {
	std := logrus.StandardLogger()
	var logrusOut lockedBuffer
	savedOut, savedLevel := std.Out, std.GetLevel()
	std.SetOutput(&logrusOut)
	std.SetLevel(logrus.TraceLevel)
	defer func() { std.SetOutput(savedOut); std.SetLevel(savedLevel) }()

	var out lockedBuffer
	sl := slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	lines := func() []map[string]any {
		var ls []map[string]any
		for _, text := range strings.SplitAfter(out.String(), "\n") {
			if text == "" {
				continue
			}
			var l map[string]any
			if err := json.Unmarshal([]byte(text), &l); err != nil {
				t.Fatalf("a line that is not slog JSON: %q: %v", text, err)
			}
			ls = append(ls, l)
		}
		return ls
	}
	has := func(msg string) bool {
		return slices.ContainsFunc(lines(), func(l map[string]any) bool {
			// The replica's lines and the core's name the controller in
			// the group "controller".
			group, _ := l["controller"].(map[string]any)
			return l["msg"] == msg && group["name"] == "job"
		})
	}
	logScene(t, ha.Options{ID: "slogger", ManagerOptions: []controller.Option{controller.WithSlog(sl), controller.WithMetrics(nil)}},
		func() bool { return has("claimed: running here") && has("controller failed; retrying") })

	msgs := map[string]bool{}
	for _, l := range lines() {
		if l["replica"] != "slogger" {
			t.Errorf("a line without replica=slogger: %v", l)
		}
		msgs[strings.SplitN(fmt.Sprint(l["msg"]), " ", 2)[0]] = true
	}
	for _, want := range []string{"joined", "claimed:", "controller", "left:"} {
		if !msgs[want] {
			t.Errorf("no line starting with %q in the slog output:\n%s", want, out.String())
		}
	}
	if s := logrusOut.String(); s != "" {
		t.Errorf("logrus got lines although the Manager logs to slog:\n%s", s)
	}
}

// Options.Logger, a logrus logger, gets the replica's lines and its
// controllers', each with the field replica=<ID>.
func TestReplicaLogsToOptionsLogger(t *testing.T) {
	logger, hook := test.NewNullLogger()
	logger.SetLevel(logrus.DebugLevel)
	has := func(msg string) bool {
		return slices.ContainsFunc(hook.AllEntries(), func(e *logrus.Entry) bool {
			// Cilium's key, in the replica's entries as in the core's.
			return e.Message == msg && e.Data["name"] == "job"
		})
	}
	logScene(t, ha.Options{ID: "logrusser", Logger: logger, ManagerOptions: []controller.Option{controller.WithMetrics(nil)}},
		func() bool { return has("claimed: running here") && has("controller failed; retrying") })
	for _, e := range hook.AllEntries() {
		if e.Data["replica"] != "logrusser" || e.Data["subsys"] != "controller" {
			t.Errorf("an entry without replica=logrusser and subsys=controller: %q %v", e.Message, e.Data)
		}
	}
	if !slices.ContainsFunc(hook.AllEntries(), func(e *logrus.Entry) bool { return strings.HasPrefix(e.Message, "left:") }) {
		t.Error("no entry for the Leave")
	}
}
