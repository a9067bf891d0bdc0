// Tests of the server version check: the decision, the warning, and Join
// asking the tests' etcd.

package etcd

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgctl/controller"
	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"
)

func TestServerTooOld(t *testing.T) {
	for _, tc := range []struct {
		version string
		minimum string
		old     bool
	}{
		{"2.3.8", "3.5.23", true},
		{"3.4.23", "3.5.23", true},  // Debian's: neither fix
		{"3.4.45", "3.5.23", true},  // carries both, but the line ended untested
		{"3.5.22", "3.5.23", true},  // has #16822's backport, not #20590's
		{"3.5.23", "3.5.23", false}, // the oldest supported release
		{"3.5.31", "3.5.23", false},
		{"3.6.0", "3.6.5", true},
		{"3.6.4", "3.6.5", true},
		{"3.6.5", "3.6.5", false},
		{"v3.6.16", "3.6.5", false},
		{"3.6.5-rc.0", "3.6.5", false}, // a pre-release counts as its release
		{"3.7.0-rc.0", "3.7.0", false},
		{"3.7.3", "3.7.0", false},
		{"3.8.0", "3.7.0", false}, // a newer line branched after both fixes
		{"4.0.0-alpha.0", "3.7.0", false},
	} {
		v, err := parseServerVersion(tc.version)
		if err != nil {
			t.Errorf("parseServerVersion(%q): %v", tc.version, err)
			continue
		}
		minimum, old := serverTooOld(v)
		if minimum.String() != tc.minimum || old != tc.old {
			t.Errorf("serverTooOld(%s) = %s, %v; want %s, %v", tc.version, minimum, old, tc.minimum, tc.old)
		}
	}
}

func TestParseServerVersionNamesTheCulprit(t *testing.T) {
	for _, s := range []string{"", "3.7", "3.7.3.1", "3.x.1", "three", "3.-1.0"} {
		_, err := parseServerVersion(s)
		if err == nil || !strings.Contains(err.Error(), `"`+s+`"`) {
			t.Errorf("parseServerVersion(%q) = %v; want an error naming it", s, err)
		}
	}
}

func TestServerVersionWarningNamesTheVersionAndTheMinimum(t *testing.T) {
	for _, tc := range []struct{ version, want string }{
		{"3.6.4", "etcd at etcd-0:2379 runs 3.6.4, older than 3.6.5, the first 3.6 release this package supports: the fence may not hold (see Server versions in the package documentation)"},
		{"3.4.23", "etcd at etcd-0:2379 runs 3.4.23, older than 3.5.23, the oldest release this package supports: the fence may not hold (see Server versions in the package documentation)"},
	} {
		v, err := parseServerVersion(tc.version)
		if err != nil {
			t.Fatal(err)
		}
		minimum, _ := serverTooOld(v)
		if got := serverVersionWarning("etcd-0:2379", v, minimum); got != tc.want {
			t.Errorf("warning for %s:\n got %s\nwant %s", tc.version, got, tc.want)
		}
	}
}

// versions answers for warnOldServers from a table; an endpoint missing
// from it blocks until the context ends, as an unreachable one does.
func versions(m map[string]string) func(context.Context, string) (string, error) {
	return func(ctx context.Context, ep string) (string, error) {
		v, ok := m[ep]
		if !ok {
			<-ctx.Done()
			return "", ctx.Err()
		}
		if v == "refused" {
			return "", errors.New("connection refused")
		}
		return v, nil
	}
}

func TestWarnOldServers(t *testing.T) {
	for _, tc := range []struct {
		name      string
		answers   map[string]string
		endpoints []string
		warning   string // "" for none
		debug     int    // endpoints that could not tell
	}{
		{
			name:      "every server current: no warning",
			endpoints: []string{"a", "b"},
			answers:   map[string]string{"a": "3.7.3", "b": "3.6.16"},
		},
		{
			name:      "one old among several: one warning naming it",
			endpoints: []string{"a", "b", "c"},
			answers:   map[string]string{"a": "3.7.3", "b": "3.6.4", "c": "3.7.3"},
			warning:   "etcd at b runs 3.6.4, older than 3.6.5,",
		},
		{
			name:      "several old: one warning naming the oldest",
			endpoints: []string{"a", "b", "c"},
			answers:   map[string]string{"a": "3.6.4", "b": "3.4.23", "c": "3.5.21"},
			warning:   "etcd at b runs 3.4.23, older than 3.5.23,",
		},
		{
			name:      "failures and garbage: Debug only, the others still checked",
			endpoints: []string{"a", "b", "c", "d"},
			answers:   map[string]string{"a": "refused", "b": "not-a-version", "d": "3.5.22"},
			warning:   "etcd at d runs 3.5.22, older than 3.5.23,",
			debug:     3,
		},
		{
			name:      "nobody answers: Debug only",
			endpoints: []string{"a"},
			answers:   map[string]string{},
			debug:     1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger, hook := test.NewNullLogger()
			logger.SetLevel(logrus.DebugLevel)
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			warnOldServers(ctx, controller.NewManager(controller.WithLogger(logger)).Logger(), tc.endpoints, versions(tc.answers))
			var warnings []string
			debug := 0
			for _, e := range hook.AllEntries() {
				switch {
				case e.Level == logrus.WarnLevel:
					warnings = append(warnings, e.Message)
				case e.Level == logrus.DebugLevel && e.Data[logrus.ErrorKey] != nil:
					debug++
				}
			}
			switch {
			case tc.warning == "" && len(warnings) != 0:
				t.Errorf("warnings %q; want none", warnings)
			case tc.warning != "" && (len(warnings) != 1 || !strings.HasPrefix(warnings[0], tc.warning)):
				t.Errorf("warnings %q; want one starting %q", warnings, tc.warning)
			}
			if debug != tc.debug {
				t.Errorf("%d Debug entries with an error; want %d", debug, tc.debug)
			}
		})
	}
}

// recordingHook keeps every entry a logger fires, for tests that read
// them while replicas log from their own goroutines.
type recordingHook struct {
	mu      sync.Mutex
	entries []*logrus.Entry // guarded by mu
}

func (h *recordingHook) Levels() []logrus.Level { return logrus.AllLevels }

func (h *recordingHook) Fire(e *logrus.Entry) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.entries = append(h.entries, e)
	return nil
}

func (h *recordingHook) find(pred func(*logrus.Entry) bool) []*logrus.Entry {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*logrus.Entry
	for _, e := range h.entries {
		if pred(e) {
			out = append(out, e)
		}
	}
	return out
}

// Join asks the server it reaches, through the replica's own client, and
// warns exactly when the tests' etcd is older than supported (run the
// tests with -ha.etcd=v3.6.4 to see the warning come).
func TestJoinChecksTheServerVersion(t *testing.T) {
	needEtcd(t)
	v, err := parseServerVersion(testEtcdVersion)
	if err != nil {
		t.Fatal(err)
	}
	minimum, old := serverTooOld(v)
	c := newCluster(t, 0, testOptions())
	hook := &recordingHook{}
	logger := logrus.New()
	logger.SetOutput(io.Discard)
	logger.SetLevel(logrus.DebugLevel)
	logger.AddHook(hook)
	c.opts.Logger = logger
	n := c.joinEmpty("r0")

	asked := hook.find(func(e *logrus.Entry) bool { return e.Message == "etcd version" })
	if len(asked) != 1 || asked[0].Data["version"] != v.String() || asked[0].Data["endpoint"] != n.proxy.addr() {
		t.Fatalf("Join logged %d answers to its version check (%v); want one, %s from %s", len(asked), asked, v, n.proxy.addr())
	}
	warnings := hook.find(func(e *logrus.Entry) bool {
		return e.Level == logrus.WarnLevel && strings.HasPrefix(e.Message, "etcd at ")
	})
	var want []string
	if old {
		want = []string{serverVersionWarning(n.proxy.addr(), v, minimum)}
	}
	var got []string
	for _, e := range warnings {
		got = append(got, e.Message)
	}
	t.Logf("etcd %s: Join warned %q", v, got)
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("etcd %s: Join warned %q; want %q", v, got, want)
	}
}
