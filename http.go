// http.go: the status and health of controllers over HTTP: JSON, text and
// an HTML page, from the standard library alone.

package controller

import (
	"cmp"
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// StatusHandler returns an [http.Handler] serving the status of m's
// controllers, or of every Manager's in the process (but [FakeManager]s)
// when m is nil. It answers GET and HEAD in three formats, chosen by the
// query parameter format=json|text|html or else by the Accept header, read
// as RFC 9110 says (wildcards such as application/* and text/*, q-values;
// text for no header, or for */*); a header that accepts none of the three
// gets a 406 that lists the types offered:
//
//   - json: Cilium's model, the array [Manager.GetStatusModel] returns,
//     followed by the controllers still stopping
//     ([Manager.GetStoppingStatus]), told apart by their
//     "removed-timestamp".
//   - text: [FormatStatus] of every controller, for curl, then a table of
//     the controllers still stopping.
//   - html: a page for a browser, server-rendered without script: a
//     summary, then one row per controller, stuck and failing ones first
//     and marked, then the stopping ones.
//
// With failing=1, every format lists only the controllers that are not
// healthy, failing or stuck (text is FormatStatus with all=false), and the
// stopping ones. Every format counts healthy as the package documentation
// defines it, as [Manager.Health] does. An unknown format is a 400.
func StatusHandler(m *Manager) http.Handler {
	return &statusHandler{m: m}
}

// HealthHandler returns an [http.Handler] serving the health of m's
// controllers, or of every Manager's in the process when m is nil: 200 and
// "ok" when [Manager.Health] is nil, else 503 and its text, one line per
// failing or stuck controller (one, not two, for a controller that is
// both).
func HealthHandler(m *Manager) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !allowRead(w, r) {
			return
		}
		cs, _ := collect(m)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if err := healthOf(cs, time.Now()); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, err.Error()+"\n")
			return
		}
		io.WriteString(w, "ok\n")
	})
}

type statusHandler struct {
	m *Manager // nil: every Manager
}

func (h *statusHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	format, mediaType, ok := negotiateMedia(w, r)
	if !ok {
		return
	}
	failingOnly, _ := strconv.ParseBool(r.URL.Query().Get("failing"))
	cs, ss := collect(h.m)
	now := time.Now()
	installed, stopping := statusesOf(cs, formatUUIDs(cs), now.UnixNano()), stoppingStatuses(ss, now.UnixNano())
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Add("Vary", "Accept")
	var err error
	switch format {
	case "json":
		w.Header().Set("Content-Type", "application/json")
		out := make(ControllerStatuses, 0, len(installed)+len(stopping))
		for _, s := range installed {
			if !failingOnly || !s.healthy() {
				out = append(out, s)
			}
		}
		err = json.NewEncoder(w).Encode(append(out, stopping...))
	case "text":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err = FormatStatus(w, installed, !failingOnly); err == nil {
			err = formatStopping(w, stopping, now)
		}
	default:
		w.Header().Set("Content-Type", mediaType+"; charset=utf-8") // text/html or application/xhtml+xml
		err = statusPage.Execute(w, newPage(h.m == nil, installed, stopping, failingOnly, now))
	}
	_ = err // the client went away; nothing to tell it
}

// allowRead answers a method other than GET and HEAD with a 405.
func allowRead(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET, HEAD")
	http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
	return false
}

// collect returns the installed and the stopping controllers of m, or of
// every registered Manager when m is nil, each sorted.
func collect(m *Manager) ([]*Controller, []stoppingController) {
	ms := []*Manager{m}
	if m == nil {
		ms = registry.snapshot()
	}
	var cs []*Controller
	var ss []stoppingController
	for _, m := range ms {
		m.mu.Lock()
		cs = m.installedLocked(cs)
		ss = m.stillStoppingLocked(ss)
		m.mu.Unlock()
	}
	slices.SortFunc(cs, compareController)
	return cs, ss
}

// formatStopping writes the table of the controllers still stopping, if
// any, after FormatStatus's:
//
//	Stopping: 1 removed controller has not terminated
//	Name    Removed   Waiting for   Message
//	stuck   1m5s ago  DoFunc, running 1h0m2s   connection refused
func formatStopping(w io.Writer, stopping ControllerStatuses, now time.Time) error {
	if len(stopping) == 0 {
		return nil
	}
	noun := "controllers have"
	if len(stopping) == 1 {
		noun = "controller has"
	}
	if _, err := fmt.Fprintf(w, "\nStopping: %d removed %s not terminated\n", len(stopping), noun); err != nil {
		return err
	}
	tw := newTable(w)
	fmt.Fprintln(tw, "Name\tRemoved\tWaiting for\tMessage")
	for _, s := range stopping {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", oneLine(s.Name), ago(now, *s.Status.RemovedTimestamp), waitingFor(s.Status, now), s.Status.message())
	}
	return tw.Flush()
}

// waitingFor says which function a stopping controller waits for.
func waitingFor(st *ControllerStatusStatus, now time.Time) string {
	if st.RunningSince == nil {
		return "StopFunc"
	}
	return "DoFunc, running " + since(now, *st.RunningSince)
}

// page is what the HTML template shows.
type page struct {
	Global                                   bool
	Total, Healthy, Failing, Stuck, Stopping int
	FailingOnly                              bool
	Shown                                    int
	Rows, StoppingRows                       []row
	Now                                      string
}

// row is one controller in the page.
type row struct {
	State, Class                                                  string // Class: State's words, for the style sheet
	Name, UUID, LastSuccess, LastError, Running, Message, Removed string
	Failures                                                      int64
	rank                                                          int // 0 stuck, 1 failing, 2 ok: the order of the rows
}

func newPage(global bool, installed, stopping ControllerStatuses, failingOnly bool, now time.Time) *page {
	p := &page{Global: global, Total: len(installed), Stopping: len(stopping), FailingOnly: failingOnly, Now: now.UTC().Format(time.RFC3339)}
	for _, s := range installed {
		r := newRow(s, now)
		stuck, failing := s.Status.Stuck, s.failing()
		switch {
		case stuck && failing:
			r.State, r.Class, r.rank = "stuck, failing", "stuck failing", 0
		case stuck:
			r.State, r.rank = "stuck", 0
		case failing:
			r.State, r.rank = "failing", 1
		default:
			r.State, r.rank = "ok", 2
		}
		if r.Class == "" {
			r.Class = r.State
		}
		if stuck {
			p.Stuck++
		}
		if failing {
			p.Failing++
		}
		if s.healthy() {
			p.Healthy++
		}
		if !failingOnly || r.rank < 2 {
			p.Rows = append(p.Rows, r)
		}
	}
	slices.SortStableFunc(p.Rows, func(a, b row) int { return cmp.Compare(a.rank, b.rank) })
	p.Shown = len(p.Rows)
	for _, s := range stopping {
		r := newRow(s, now)
		r.State, r.Class, r.Removed = "stopping", "stopping", ago(now, *s.Status.RemovedTimestamp)
		r.Running = waitingFor(s.Status, now)
		p.StoppingRows = append(p.StoppingRows, r)
	}
	return p
}

func newRow(s *ControllerStatus, now time.Time) row {
	st := s.Status
	r := row{Name: s.Name, UUID: s.UUID, LastSuccess: ago(now, st.LastSuccessTimestamp), LastError: ago(now, st.LastFailureTimestamp),
		Failures: st.ConsecutiveFailureCount, Message: st.markedMessage()}
	if st.RunningSince != nil {
		r.Running = since(now, *st.RunningSince)
	}
	return r
}

// statusPage is well-formed XHTML as well as HTML, so that a test can
// read it with encoding/xml.
//
//go:embed status.html
var statusPageText string

var statusPage = template.Must(template.New("status").Parse(statusPageText))
