// httpformat.go: the choice of format of StatusHandler, for handlers that
// serve other data in the same three forms.

package controller

import "net/http"

// NegotiateFormat chooses the format of the answer to r as [StatusHandler]
// does, for a handler that serves its own data in the same three forms:
// "json", "text" or "html", from the query parameter format=json|text|html,
// else from the Accept header (text when neither names one). When r
// cannot be served so, for a method other than GET and HEAD (405) or an
// unknown format (400), or an Accept header that accepts none of the three
// (406, listing the types offered), it answers r itself, as StatusHandler would, and
// returns ok false. A handler that varies by Accept should say so:
//
//	format, ok := controller.NegotiateFormat(w, r)
//	if !ok {
//		return
//	}
//	w.Header().Add("Vary", "Accept")
//
// "html" answers text/html and application/xhtml+xml alike; StatusHandler
// labels its page with the one the client preferred.
//
// The replicas of github.com/bgctl/controller/ha serve their placement
// with it.
func NegotiateFormat(w http.ResponseWriter, r *http.Request) (format string, ok bool) {
	format, _, ok = negotiateMedia(w, r)
	return format, ok
}

// negotiateMedia is NegotiateFormat, with the media type to label the
// format with (for html, the one of text/html and application/xhtml+xml
// the client preferred).
func negotiateMedia(w http.ResponseWriter, r *http.Request) (format, mediaType string, ok bool) {
	if !allowRead(w, r) {
		return "", "", false
	}
	format, mediaType, status := negotiate(r)
	switch status {
	case http.StatusBadRequest:
		http.Error(w, "unknown format: want json, text or html", status)
		return "", "", false
	case http.StatusNotAcceptable:
		w.Header().Add("Vary", "Accept")
		http.Error(w, notAcceptable, status)
		return "", "", false
	}
	return format, mediaType, true
}
