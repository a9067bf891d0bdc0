// The code of the README's "Testing your controllers" section, each snippet
// a test that runs in CI; TestReadmeGuideSnippetsAreTested keeps the README
// and this file in step.

package controller_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/bgctl/controller"
	"github.com/bgctl/controller/controllertest"
)

func TestGuideExactRetryTimes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := controller.NewManager(controller.WithMetrics(nil))
		start := time.Now()
		var runs []time.Duration
		m.UpdateController("push", controller.ControllerParams{
			DoFunc: func(context.Context) error {
				runs = append(runs, time.Since(start))
				return errors.New("store unavailable")
			},
		})
		time.Sleep(6 * time.Second)
		synctest.Wait() // let the run due at 6s finish before reading
		want := []time.Duration{0, time.Second, 3 * time.Second, 6 * time.Second}
		if !slices.Equal(runs, want) {
			t.Errorf("runs at %v, want %v", runs, want)
		}
		st := m.Lookup("push").GetStatusModel().Status
		if st.ConsecutiveFailureCount != 4 || st.LastFailureMsg != "store unavailable" {
			t.Errorf("status %+v", st)
		}
		m.RemoveAllAndWait()
	})
}

func TestGuideWaitForRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := controller.NewManager(controller.WithMetrics(nil))
		runs := &controllertest.Runs{}
		attempts := 0
		m.UpdateController("push", controller.ControllerParams{
			DoFunc: func(context.Context) error {
				if attempts++; attempts < 3 {
					return errors.New("store unavailable")
				}
				return nil
			},
			Health: runs, // told after every run; never blocks the controller
		})
		start := time.Now()
		if err := runs.Wait(t.Context(), "push", 3); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took != 3*time.Second {
			t.Errorf("third run after %v, want 3s", took)
		}
		m.RemoveAllAndWait()
	})
}

// Endpoint is an object under test that embeds its Manager.
type Endpoint struct {
	controller.Manager

	mu     sync.Mutex
	synced int
}

func (ep *Endpoint) Start() {
	ep.UpdateController("endpoint-sync", controller.ControllerParams{
		DoFunc:      ep.sync,
		RunInterval: time.Minute,
	})
}

func (ep *Endpoint) sync(context.Context) error {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	ep.synced++
	return nil
}

func TestGuideEmbeddedManager(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ep := &Endpoint{}
		controller.WithMetrics(nil)(&ep.Manager) // options apply before first use
		ep.Start()
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		ep.mu.Lock()
		synced := ep.synced
		ep.mu.Unlock()
		if synced != 11 { // at 0, 1, …, 10 minutes
			t.Errorf("synced %d times, want 11", synced)
		}
		if err := ep.Shutdown(t.Context()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestGuideReproducibleJitter(t *testing.T) {
	runTimes := func() (times []time.Duration) {
		synctest.Test(t, func(t *testing.T) {
			src := rand.NewPCG(1, 2) // the same seed, the same waits
			m := controller.NewManager(controller.WithJitterSource(src), controller.WithMetrics(nil))
			start := time.Now()
			m.UpdateController("resync", controller.ControllerParams{
				DoFunc: func(context.Context) error {
					times = append(times, time.Since(start))
					return nil
				},
				RunInterval: time.Minute,
				Jitter:      10 * time.Second,
			})
			time.Sleep(5 * time.Minute)
			m.RemoveAllAndWait()
		})
		return times
	}
	if a, b := runTimes(), runTimes(); !slices.Equal(a, b) {
		t.Errorf("two runs of the same schedule differ: %v and %v", a, b)
	}
}

func TestGuideFakeManager(t *testing.T) {
	m := controller.FakeManager(2) // two failing controllers, no goroutines
	var out strings.Builder
	if err := controller.FormatStatus(&out, m.GetStatusModel(), false); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "Controller Status: 0/2 healthy") {
		t.Errorf("got %q", out.String())
	}
	if err := m.Health(); err == nil {
		t.Error("Health() = nil, want the failing controllers")
	}
}

// Every Go snippet of the README's "Testing your controllers" section is
// code of a test file in this directory (whitespace at the start of lines
// aside), so that what the guide shows runs in CI.
func TestReadmeGuideSnippetsAreTested(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(readme)
	start := strings.Index(section, "\n## Testing your controllers\n")
	if start < 0 {
		t.Fatal(`README.md has no "## Testing your controllers" section`)
	}
	section = section[start+1:]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	snippets := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(section, -1)
	if len(snippets) < 4 {
		t.Fatalf("found %d Go snippets in the section, want at least 4", len(snippets))
	}
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	var code strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		code.WriteString(unindent(string(b)))
	}
	for _, s := range snippets {
		if !strings.Contains(code.String(), unindent(s[1])) {
			t.Errorf("this README snippet is not code of any test file:\n%s", s[1])
		}
	}
}

// unindent removes the white space at the start of every line of s.
func unindent(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimLeft(l, " \t")
	}
	return strings.Join(lines, "\n")
}
