// Tests of NegotiateFormat: it chooses and refuses as StatusHandler does.

package controller

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
)

// For every request, NegotiateFormat gives the format whose content type
// StatusHandler answers with, or refuses it with StatusHandler's answer:
// a handler built on it serves the same forms for the same requests.
func TestNegotiateFormatAgreesWithStatusHandler(t *testing.T) {
	contentTypes := map[string]string{"json": "application/json", "text": "text/plain; charset=utf-8", "html": "text/html; charset=utf-8"}
	h := StatusHandler(NewManager(WithMetrics(nil)))
	for _, tc := range []struct {
		method, target, accept string
		want                   int // status code
	}{
		{http.MethodGet, "/", "", http.StatusOK},
		{http.MethodGet, "/", "*/*", http.StatusOK},
		{http.MethodGet, "/", "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", http.StatusOK},
		{http.MethodGet, "/", "text/html;q=0.2, application/json;q=0.9", http.StatusOK},
		{http.MethodHead, "/?format=json", "text/html", http.StatusOK},
		{http.MethodGet, "/?format=html", "", http.StatusOK},
		{http.MethodGet, "/?format=text", "application/json", http.StatusOK},
		{http.MethodGet, "/?format=xml", "", http.StatusBadRequest},
		{http.MethodPost, "/", "", http.StatusMethodNotAllowed},
	} {
		want := serve(h, tc.method, tc.target, tc.accept)
		req := httptest.NewRequest(tc.method, tc.target, nil)
		if tc.accept != "" {
			req.Header.Set("Accept", tc.accept)
		}
		rec := httptest.NewRecorder()
		format, ok := NegotiateFormat(rec, req)
		name := tc.method + " " + tc.target + " Accept: " + tc.accept
		assert.Equal(t, tc.want, want.StatusCode, name)
		assert.Equal(t, tc.want == http.StatusOK, ok, name)
		if ok {
			assert.Equal(t, want.Header.Get("Content-Type"), contentTypes[format], name)
			assert.Empty(t, rec.Body.String(), "%s: nothing written when ok", name)
			continue
		}
		got := rec.Result()
		assert.Equal(t, want.StatusCode, got.StatusCode, name)
		assert.Equal(t, want.Header.Get("Allow"), got.Header.Get("Allow"), name)
		assert.Equal(t, body(t, want), body(t, got), name)
	}
}
