// negotiate.go: the format StatusHandler serves, chosen from a request's
// format parameter or its Accept header.

package controller

import (
	"net/http"
	"strconv"
	"strings"
)

// offers are the media types StatusHandler serves and the format of each,
// in the handler's order of preference among types a client accepts
// equally (curl's */* gets text).
var offers = [...]struct{ mediaType, format string }{
	{"text/plain", "text"},
	{"application/json", "json"},
	{"text/html", "html"},
	{"application/xhtml+xml", "html"},
}

// notAcceptable is the body of a 406: what a client could have asked for.
const notAcceptable = "not acceptable: the status is offered as text/plain, application/json, text/html or application/xhtml+xml (or ask with ?format=text|json|html)"

// negotiate returns the format a request asks for and the media type to
// label it with, and 0; or http.StatusBadRequest for an unknown format
// parameter, or http.StatusNotAcceptable when its Accept header accepts
// none of the offers. The format parameter wins over the header. Of the
// offers the header accepts, the one of the highest quality wins; of
// equals, the one whose range the client names first, then the first of
// offers. The html format is labelled with the offer that won, text/html
// or application/xhtml+xml, so a client that refused one is not sent it.
func negotiate(r *http.Request) (format, mediaType string, status int) {
	if f := r.URL.Query().Get("format"); f != "" {
		for _, o := range offers {
			if o.format == f {
				return f, o.mediaType, 0 // the first offer of the format
			}
		}
		return "", "", http.StatusBadRequest
	}
	accept := strings.Join(r.Header.Values("Accept"), ",")
	if strings.TrimSpace(accept) == "" {
		return "text", offers[0].mediaType, 0 // no header: any type will do
	}
	ranges := parseAccept(accept)
	best, bestQ, bestPos := -1, 0.0, 0
	for i, o := range offers {
		q, pos := quality(ranges, o.mediaType)
		if q > bestQ || (q == bestQ && q > 0 && pos < bestPos) {
			best, bestQ, bestPos = i, q, pos
		}
	}
	if best < 0 {
		return "", "", http.StatusNotAcceptable
	}
	return offers[best].format, offers[best].mediaType, 0
}

// mediaRange is one element of an Accept header: type/subtype, either of
// which may be *, and its quality.
type mediaRange struct {
	typ, sub string
	q        float64
}

// parseAccept returns the media ranges of an Accept header, in its order,
// their types in lower case. A quality that does not parse, or lies
// outside [0, 1], reads as 0: not acceptable. An element that is not a
// media range is left out; a lone "*" reads as "*/*", as some clients send
// it. Commas and semicolons inside a parameter's quoted string (RFC 9110
// allows them) split nothing.
func parseAccept(header string) []mediaRange {
	var out []mediaRange
	for _, part := range splitUnquoted(header, ',') {
		mediaType, params, _ := strings.Cut(part, ";") // a media type has no quotes
		mediaType = strings.ToLower(strings.TrimSpace(mediaType))
		if mediaType == "*" {
			mediaType = "*/*"
		}
		typ, sub, ok := strings.Cut(mediaType, "/")
		if !ok || typ == "" || sub == "" || (typ == "*" && sub != "*") {
			continue
		}
		q := 1.0
		for _, p := range splitUnquoted(params, ';') {
			if k, v, _ := strings.Cut(strings.TrimSpace(p), "="); strings.EqualFold(k, "q") {
				var err error
				if q, err = strconv.ParseFloat(strings.TrimSpace(v), 64); err != nil || !(q >= 0 && q <= 1) {
					q = 0
				}
			}
		}
		out = append(out, mediaRange{typ, sub, q})
	}
	return out
}

// quality returns the quality ranges give mediaType, from the most
// specific range that matches it (type/subtype, then type/*, then */*; the
// first of equals), and that range's position; 0 when none matches.
func quality(ranges []mediaRange, mediaType string) (q float64, pos int) {
	typ, sub, _ := strings.Cut(mediaType, "/")
	best := -1 // the specificity of the range that decides
	for i, r := range ranges {
		specificity := -1
		switch {
		case r.typ == typ && r.sub == sub:
			specificity = 2
		case r.typ == typ && r.sub == "*":
			specificity = 1
		case r.typ == "*":
			specificity = 0
		}
		if specificity > best {
			best, q, pos = specificity, r.q, i
		}
	}
	return q, pos
}

// splitUnquoted splits s at every sep outside a quoted string ("…", in
// which a backslash escapes the next byte).
func splitUnquoted(s string, sep byte) []string {
	var out []string
	quoted, start := false, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++ // the escaped byte
		case c == '"':
			quoted = !quoted
		case !quoted && c == sep:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}
