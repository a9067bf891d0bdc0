// Tests of the HTTP handlers: every format of the status, the health, and
// the choice of format.

package controller

import (
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// serve sends a request for target with an Accept header (none when empty)
// to h and returns the response.
func serve(h http.Handler, method, target, accept string) *http.Response {
	req := httptest.NewRequest(method, target, nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func body(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

// htmlTable is a table of the status page as a browser would show it: the
// class and the cells' text of each body row.
type htmlTable struct {
	classes []string
	rows    [][]string
}

// parsePage reads the status page as XML (it is well-formed XHTML) and
// returns its tables by id and the text of its summary paragraph.
func parsePage(t *testing.T, page string) (tables map[string]*htmlTable, summary string) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(page))
	d.Entity = xml.HTMLEntity
	tables = map[string]*htmlTable{}
	var table *htmlTable
	var inBody, inCell, inSummary bool
	var cell strings.Builder
	attr := func(se xml.StartElement, name string) string {
		for _, a := range se.Attr {
			if a.Name.Local == name {
				return a.Value
			}
		}
		return ""
	}
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "the page is well-formed")
		switch tok := tok.(type) {
		case xml.StartElement:
			switch tok.Name.Local {
			case "table":
				table = &htmlTable{}
				tables[attr(tok, "id")] = table
			case "tbody":
				inBody = true
			case "tr":
				if inBody {
					table.classes = append(table.classes, attr(tok, "class"))
					table.rows = append(table.rows, nil)
				}
			case "td":
				inCell = inBody
				cell.Reset()
			case "p":
				inSummary = attr(tok, "id") == "summary"
			}
		case xml.EndElement:
			switch tok.Name.Local {
			case "tbody":
				inBody = false
			case "td":
				if inCell {
					last := &table.rows[len(table.rows)-1]
					*last = append(*last, cell.String())
				}
				inCell = false
			case "p":
				inSummary = false
			}
		case xml.CharData:
			if inCell {
				cell.Write(tok)
			}
			if inSummary {
				summary += string(tok)
			}
		}
	}
	return tables, strings.Join(strings.Fields(summary), " ")
}

// column returns column i of every row.
func (tb *htmlTable) column(i int) []string {
	var out []string
	for _, r := range tb.rows {
		out = append(out, r[i])
	}
	return out
}

// handlerScene installs, in a bubble that starts at 2000-01-01T00:00:00Z,
// "ok", "failing" (fails every second), "hung" (RunTimeout 10s, ignores
// its context) and "gone" (its StopFunc blocks), removes gone at 30s and
// returns a millisecond before 1m, before failing's 61st run. release lets
// hung and gone return.
func handlerScene(t *testing.T) (e *env, release func()) {
	e = newEnv(t)
	never := make(chan struct{})
	e.m.UpdateController("ok", ControllerParams{DoFunc: NoopFunc})
	e.m.UpdateController("failing", ControllerParams{DoFunc: func(context.Context) error {
		return errors.New("connection refused\nby <peer> & co")
	}, ErrorRetryBaseDuration: time.Second, MaxRetryInterval: time.Second})
	e.m.UpdateController("hung", ControllerParams{DoFunc: func(context.Context) error { <-never; return nil }, RunTimeout: 10 * time.Second})
	e.m.UpdateController("gone", ControllerParams{DoFunc: NoopFunc, StopFunc: func(context.Context) error { <-never; return nil }})
	time.Sleep(30 * time.Second)
	require.NoError(t, e.m.RemoveController("gone"))
	time.Sleep(30*time.Second - time.Millisecond)
	return e, func() { close(never) }
}

// inHandlerScene runs test in a bubble with handlerScene's Manager and its
// StatusHandler, then lets the scene end.
func inHandlerScene(t *testing.T, test func(t *testing.T, h http.Handler)) {
	synctest.Test(t, func(t *testing.T) {
		e, release := handlerScene(t)
		test(t, StatusHandler(e.m))
		release()
		e.m.RemoveAllAndWait()
	})
}

// The JSON is Cilium's array of installed controllers, the stopping ones
// after them with their removal time; failing=1 keeps failing and stuck
// ones (and the stopping).
func TestStatusHandlerJSON(t *testing.T) {
	inHandlerScene(t, func(t *testing.T, h http.Handler) {
		for _, tc := range []struct {
			target, accept string
			want           []string
		}{
			{"/", "application/json", []string{"failing", "hung", "ok", "gone"}},
			{"/?format=json", "", []string{"failing", "hung", "ok", "gone"}},
			{"/?failing=1", "text/html;q=0.5, application/json", []string{"failing", "hung", "gone"}},
		} {
			resp := serve(h, http.MethodGet, tc.target, tc.accept)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
			var st ControllerStatuses
			require.NoError(t, json.Unmarshal([]byte(body(t, resp)), &st))
			assert.Equal(t, tc.want, statusNames(st), tc.target)
			gone := st[len(st)-1]
			assert.Equal(t, new(time.Date(2000, 1, 1, 0, 0, 30, 0, time.UTC)), gone.Status.RemovedTimestamp)
			assert.Nil(t, st[0].Status.RemovedTimestamp)
		}
	})
}

// The text is FormatStatus, then the stopping controllers; failing=1 is
// FormatStatus's all=false. A stuck run is marked, and not healthy. curl's Accept (*/*) and none at all get text.
func TestStatusHandlerText(t *testing.T) {
	inHandlerScene(t, func(t *testing.T, h http.Handler) {
		for _, accept := range []string{"", "*/*", "text/plain"} {
			resp := serve(h, http.MethodGet, "/controllers", accept)
			assert.Equal(t, "text/plain; charset=utf-8", resp.Header.Get("Content-Type"))
			assert.Equal(t, strings.Join([]string{
				"Controller Status: 1/3 healthy",
				"Name      Last success   Last error   Count   Message",
				"failing   never          1s ago       60      connection refused; by <peer> & co",
				"hung      never          never        0       [stuck, running 1m0s] no error",
				"ok        1m0s ago       never        0       no error",
				"",
				"Stopping: 1 removed controller has not terminated",
				"Name   Removed   Waiting for   Message",
				"gone   30s ago   StopFunc      no error",
				""}, "\n"), body(t, resp), "Accept %q", accept)
		}
		resp := serve(h, http.MethodGet, "/controllers?format=text&failing=true", "text/html")
		assert.True(t, strings.HasPrefix(body(t, resp), "Controller Status: 1/3 healthy\nName      Last success   Last error   Count   Message\nfailing "))
	})
}

// The HTML page, read as a browser would: a summary, the stuck and failing
// controllers first and marked, then the healthy ones, then the stopping
// ones; failing=1 leaves the healthy ones out. Text is escaped.
func TestStatusHandlerHTML(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, release := handlerScene(t)
		h := StatusHandler(e.m)
		resp := serve(h, http.MethodGet, "/", "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8")
		assert.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
		page := body(t, resp)
		tables, summary := parsePage(t, page)
		assert.Equal(t, "1/3 healthy, 1 failing, 1 stuck, 1 stopping, at 2000-01-01T00:00:59Z. Show only failing and stuck", summary, "healthy as Health counts: neither failing nor stuck")
		ctl := tables["controllers"]
		require.NotNil(t, ctl)
		assert.Equal(t, []string{"stuck", "failing", "ok"}, ctl.classes)
		assert.Equal(t, []string{"hung", "failing", "ok"}, ctl.column(1))
		assert.Equal(t, []string{"stuck", "failing", "ok"}, ctl.column(0))
		assert.Equal(t, []string{"1m0s", "", ""}, ctl.column(5), "how long the hung DoFunc has run")
		assert.Equal(t, "connection refused\nby <peer> & co", ctl.rows[1][6], "escaped, and read back whole")
		assert.Len(t, ctl.rows[0][7], 36, "the UUID")
		stopping := tables["stopping"]
		require.NotNil(t, stopping)
		assert.Equal(t, [][]string{{"stopping", "gone", "30s ago", "StopFunc", "", e.m.GetStoppingStatus()[0].UUID}}, stopping.rows)
		assert.NotContains(t, page, "<script")

		tables, summary = parsePage(t, body(t, serve(h, http.MethodGet, "/?format=html&failing=1", "")))
		assert.Equal(t, []string{"hung", "failing"}, tables["controllers"].column(1))
		assert.Contains(t, summary, "Showing the 2 failing or stuck. Show all")
		release()
		e.m.RemoveAllAndWait()

		tables, _ = parsePage(t, body(t, serve(h, http.MethodGet, "/?format=html", "")))
		assert.Empty(t, tables["controllers"].rows)
		assert.Nil(t, tables["stopping"], "no stopping table when none stops")
	})
}

// An unknown format is a 400, a method other than GET or HEAD a 405.
func TestStatusHandlerRefuses(t *testing.T) {
	h := StatusHandler(NewManager(WithMetrics(nil)))
	resp := serve(h, http.MethodGet, "/?format=xml", "")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	assert.Contains(t, body(t, resp), "want json, text or html")
	resp = serve(h, http.MethodPost, "/", "")
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, "GET, HEAD", resp.Header.Get("Allow"))
	assert.Equal(t, http.StatusMethodNotAllowed, serve(HealthHandler(nil), http.MethodDelete, "/", "").StatusCode)
	assert.Equal(t, http.StatusOK, serve(h, http.MethodHead, "/", "").StatusCode)
}

// The Accept header picks the offered type of the highest quality, as
// RFC 9110 reads it: a range's most specific match decides a type's
// quality (text/html over text/* over */*), a zero or unreadable quality
// is not acceptable, and of equals the one the client names first wins,
// then the handler's order (text, JSON, HTML). No header, or */*, gets
// text; a header that accepts none of them gets 406 and the list of types
// offered. The HTML page is labelled with the HTML type that won, and a
// parameter's quoted string splits neither ranges nor parameters.
func TestNegotiate(t *testing.T) {
	h := StatusHandler(FakeManager(1))
	for _, tc := range []struct{ accept, want string }{
		{"", "text/plain"},
		{"*/*", "text/plain"},
		{"application/json", "application/json"},
		{"text/html, application/json", "text/html"},
		{"text/html;q=0.2, application/json;q=0.9", "application/json"},
		{"application/json;q=0, text/plain;q=0.1", "text/plain"},
		{"application/json;q=x, text/html;q=0.1", "text/html"},
		{"application/xhtml+xml", "application/xhtml+xml"},
		{"text/html;q=0, application/xhtml+xml", "application/xhtml+xml"},           // never labelled with the type refused
		{`text/html;foo="a,b";q=0.1, application/json;q=0.5`, "application/json"},   // a quoted comma splits nothing
		{`text/html;foo="a;q=1";q=0.1, application/json;q=0.5`, "application/json"}, // nor a quoted semicolon
		{`text/html;foo="a\",b";q=0.1, application/json;q=0.5`, "application/json"}, // nor an escaped quote
		{"TEXT/PLAIN; Q=1", "text/plain"},
		{"application/*", "application/json"},
		{"text/*", "text/plain"},
		{"text/*;q=0.5, text/html", "text/html"},
		{"text/*, text/plain;q=0", "text/html"},
		{"*/*;q=0.1, application/json;q=0", "text/plain"},
		{"image/png, */*;q=0.01", "text/plain"},
		{"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", "text/html"},
		{"image/png", "406"},
		{"application/*;q=0, text/*;q=0", "406"},
		{"application/xml", "406"},
	} {
		resp := serve(h, http.MethodGet, "/", tc.accept)
		if tc.want == "406" {
			assert.Equal(t, http.StatusNotAcceptable, resp.StatusCode, "Accept %q", tc.accept)
			assert.Equal(t, "not acceptable: the status is offered as text/plain, application/json, text/html or application/xhtml+xml (or ask with ?format=text|json|html)\n",
				body(t, resp), "Accept %q", tc.accept)
			continue
		}
		assert.Equal(t, http.StatusOK, resp.StatusCode, "Accept %q", tc.accept)
		mediaType, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";")
		assert.Equal(t, tc.want, mediaType, "Accept %q", tc.accept)
	}
	resp := serve(h, http.MethodGet, "/?format=json", "image/png")
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the format parameter wins over the header")
}

// The health handler: 200 "ok", or 503 and the text of Health, for one
// Manager or for every Manager.
func TestHealthHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, release := handlerScene(t)
		resp := serve(HealthHandler(e.m), http.MethodGet, "/healthz", "")
		assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		assert.Equal(t, "text/plain; charset=utf-8", resp.Header.Get("Content-Type"))
		assert.Equal(t, e.m.Health().Error()+"\n", body(t, resp))
		assert.Contains(t, body(t, serve(HealthHandler(nil), http.MethodGet, "/healthz", "")), `controller "hung": run stuck: DoFunc has run for 59.999s, over its RunTimeout of 10s`)
		release()
		e.m.RemoveAllAndWait()

		healthy := newEnv(t)
		healthy.m.UpdateController("fine", ControllerParams{DoFunc: NoopFunc})
		synctest.Wait()
		resp = serve(HealthHandler(healthy.m), http.MethodGet, "/healthz", "")
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, "ok\n", body(t, resp))
		healthy.m.RemoveAllAndWait()
	})
}

// With a nil Manager the handler serves every Manager's controllers.
func TestStatusHandlerGlobal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := newEnv(t), newEnv(t)
		a.m.UpdateController("global-from-a", ControllerParams{DoFunc: NoopFunc})
		b.m.UpdateController("global-from-b", ControllerParams{DoFunc: NoopFunc})
		synctest.Wait()
		var st ControllerStatuses
		require.NoError(t, json.Unmarshal([]byte(body(t, serve(StatusHandler(nil), http.MethodGet, "/?format=json", ""))), &st))
		assert.Subset(t, statusNames(st), []string{"global-from-a", "global-from-b"})
		tables, _ := parsePage(t, body(t, serve(StatusHandler(nil), http.MethodGet, "/?format=html", "")))
		assert.Subset(t, tables["controllers"].column(1), []string{"global-from-a", "global-from-b"})
		a.m.RemoveAllAndWait()
		b.m.RemoveAllAndWait()
	})
}

// A removed controller whose DoFunc still runs is listed as waiting for
// its DoFunc, with how long that has run.
func TestStatusHandlerStoppingDoFunc(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t)
		never := make(chan struct{})
		e.m.UpdateController("hung", ControllerParams{DoFunc: func(context.Context) error { <-never; return nil }})
		time.Sleep(time.Minute)
		require.NoError(t, e.m.RemoveController("hung"))
		time.Sleep(5 * time.Second)
		h := StatusHandler(e.m)
		assert.Equal(t, "Controller Status: 0/0 healthy\n\n"+
			"Stopping: 1 removed controller has not terminated\n"+
			"Name   Removed   Waiting for            Message\n"+
			"hung   5s ago    DoFunc, running 1m5s   no error\n", body(t, serve(h, http.MethodGet, "/", "")))
		tables, _ := parsePage(t, body(t, serve(h, http.MethodGet, "/?format=html", "")))
		assert.Equal(t, []string{"DoFunc, running 1m5s"}, tables["stopping"].column(3))
		close(never)
		e.m.RemoveAllAndWait()
	})
}
