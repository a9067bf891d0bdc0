// Tests of ClientLogger: zap's entries reach the slog handler with
// their levels and fields, and a request its caller cancelled is not a
// warning, as none is during a Leave.

package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/ha"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// jsonLines returns the lines a JSON handler wrote to buf, decoded, time
// left out.
func jsonLines(t *testing.T, buf *lockedBuffer) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%v: %s", err, line)
		}
		delete(m, "time")
		lines = append(lines, m)
	}
	return lines
}

func TestEtcdClientLoggerLevels(t *testing.T) {
	cancelled := status.Error(codes.Canceled, "context canceled")
	for _, tc := range []struct {
		name  string
		level zapcore.Level
		err   error
		want  string // the slog level written
	}{
		{"debug", zapcore.DebugLevel, nil, "DEBUG"},
		{"info", zapcore.InfoLevel, nil, "INFO"},
		{"warn", zapcore.WarnLevel, nil, "WARN"},
		{"error", zapcore.ErrorLevel, nil, "ERROR"},
		{"dpanic is an error", zapcore.DPanicLevel, nil, "ERROR"},
		{"a warning about a request its caller cancelled is a debug line", zapcore.WarnLevel, cancelled, "DEBUG"},
		{"as is one with a wrapped context.Canceled", zapcore.WarnLevel, fmt.Errorf("watch: %w", context.Canceled), "DEBUG"},
		{"a request out of time stays a warning", zapcore.WarnLevel, status.Error(codes.DeadlineExceeded, "context deadline exceeded"), "WARN"},
		{"another error stays a warning", zapcore.WarnLevel, status.Error(codes.Unavailable, "connection refused"), "WARN"},
		{"an error about a cancelled request stays an error", zapcore.ErrorLevel, cancelled, "ERROR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf lockedBuffer
			lg := ClientLogger(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
			var fields []zap.Field
			if tc.err != nil {
				fields = append(fields, zap.Error(tc.err))
			}
			if ce := lg.Check(tc.level, "a line"); ce != nil {
				ce.Write(fields...)
			}
			lines := jsonLines(t, &buf)
			if len(lines) != 1 || lines[0]["level"] != tc.want {
				t.Fatalf("wrote %v, want one line at %s", lines, tc.want)
			}
		})
	}
}

func TestEtcdClientLoggerLevelsFollowTheHandler(t *testing.T) {
	var buf lockedBuffer
	lg := ClientLogger(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if lg.Core().Enabled(zapcore.DebugLevel) || !lg.Core().Enabled(zapcore.InfoLevel) {
		t.Error("a handler at Info: want zap's Debug disabled and Info enabled")
	}
	lg.Debug("retrying of unary invoker")
	lg.Warn("retrying of unary invoker failed", zap.Error(status.Error(codes.Canceled, "context canceled")))
	lg.Info("kept")
	if lines := jsonLines(t, &buf); len(lines) != 1 || lines[0]["msg"] != "kept" {
		t.Errorf("a handler at Info wrote %v, want only the Info line", lines)
	}
}

func TestEtcdClientLoggerFields(t *testing.T) {
	var buf lockedBuffer
	lg := ClientLogger(slog.New(slog.NewJSONHandler(&buf, nil)).With("service", "svc"))
	lg = lg.With(zap.String("endpoint", "e1"), zap.Namespace("lease"), zap.Int64("id", 7))
	lg.Warn("retrying of unary invoker failed",
		zap.String("method", "/etcdserverpb.KV/Txn"),
		zap.Uint("attempt", 2),
		zap.Duration("took", 1500*time.Millisecond),
		zap.Error(errors.New("connection refused")),
		zap.Namespace("extra"),
		zap.Bool("last", true),
	)
	lines := jsonLines(t, &buf)
	if len(lines) != 1 {
		t.Fatalf("wrote %v, want one line", lines)
	}
	got, _ := json.Marshal(lines[0])
	// Namespaces nest what follows them, as zap's JSON encoder writes
	// them; logger, which zap writes beside the message, is among what
	// follows (the etcd client opens no namespace).
	want := `{"endpoint":"e1","lease":{"attempt":2,"error":"connection refused","extra":{"last":true},"id":7,"logger":"etcd-client","method":"/etcdserverpb.KV/Txn","took":1500000000},"level":"WARN","msg":"retrying of unary invoker failed","service":"svc"}`
	if string(got) != want {
		t.Errorf("wrote\n%s\nwant\n%s", got, want)
	}
}

// A DoFunc sends requests until one fails; Leave cancels its context, so
// the last one fails with Canceled, which the client logs as a warning.
// Through EtcdClientLogger it is a debug line, and Leave writes no
// warning at all.
func TestEtcdClientLoggerLeaveWritesNoWarning(t *testing.T) {
	needEtcd(t)
	var buf lockedBuffer
	logger := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{testEtcd}, DialTimeout: 2 * time.Second, Logger: ClientLogger(logger)})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	opts := testOptions()
	opts.Prefix = fmt.Sprintf("/test/%s/%d", t.Name(), time.Now().UnixNano())
	opts.Logger = nil
	opts.ManagerOptions = []controller.Option{controller.WithSlog(logger)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := ha.Join(ctx, Store(cli), opts)
	if err != nil {
		t.Fatal(err)
	}
	sending, lastErr := make(chan struct{}), make(chan error, 1)
	err = r.UpdateController("job", controller.ControllerParams{
		DoFunc: func(ctx context.Context) error {
			close(sending)
			for {
				if _, err := cli.Put(ctx, opts.Prefix+"/job", "ran"); err != nil {
					lastErr <- err
					return nil
				}
			}
		},
		RunInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-sending:
	case <-ctx.Done():
		t.Fatal("job did not run within 10s")
	}
	if err := r.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-lastErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("the DoFunc's last request failed with %v, want context.Canceled", err)
	}
	var cancelled int
	for _, line := range jsonLines(t, &buf) {
		if line["logger"] != "etcd-client" {
			continue
		}
		if line["level"] != "DEBUG" {
			t.Errorf("the client logged at %s during the scene: %v", line["level"], line)
		}
		if line["msg"] == "retrying of unary invoker failed" && strings.Contains(fmt.Sprint(line["error"]), "Canceled") {
			cancelled++
		}
	}
	if cancelled == 0 {
		t.Errorf("no debug line about the cancelled request:\n%s", buf.String())
	}
}
