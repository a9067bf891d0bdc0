// The token file reread before each request, tested against an HTTP
// server that records the Authorization header each request carries: no
// kube-apiserver is needed to see which token goes out.

package kube

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"k8s.io/client-go/rest"
)

// authRecorder is a server that answers every request 200 and records
// the Authorization header of each.
type authRecorder struct {
	srv *httptest.Server

	mu    sync.Mutex
	seen  []string // guarded by mu: each request's Authorization header, in the order they came
	paths []string // guarded by mu: each request's path, in the same order
}

func newAuthRecorder(t *testing.T) *authRecorder {
	a := &authRecorder{}
	a.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		a.seen = append(a.seen, r.Header.Get("Authorization"))
		a.paths = append(a.paths, r.URL.Path)
		a.mu.Unlock()
	}))
	t.Cleanup(a.srv.Close)
	return a
}

// get sends one request through c and returns the Authorization header
// the server saw.
func (a *authRecorder) get(t *testing.T, c *http.Client) string {
	t.Helper()
	resp, err := c.Get(a.srv.URL + "/api")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.seen[len(a.seen)-1]
}

// tokenFileClient returns a client made as the store makes its own from
// a config naming the token file path.
func tokenFileClient(t *testing.T, a *authRecorder, cfg *rest.Config) *http.Client {
	t.Helper()
	cfg.Host = a.srv.URL
	c, err := rest.HTTPClientFor(withTokenFile(cfg))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// writeAtomically replaces path's content by renaming a new file over
// it, as the kubelet's atomic writer swaps a directory.
func writeAtomically(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// A token file that is briefly missing, or empty (rewritten in place:
// truncated, then written), must not send the token client-go read up
// to a minute before, which may have been revoked when it was replaced:
// the last token the file held goes on being sent.
func TestTokenFileUnreadableKeepsTheLastTokenRead(t *testing.T) {
	for _, gap := range []struct {
		name string
		make func(t *testing.T, path string)
	}{
		{"missing", func(t *testing.T, path string) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		}},
		{"empty", func(t *testing.T, path string) {
			if err := os.Truncate(path, 0); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(gap.name, func(t *testing.T) {
			a := newAuthRecorder(t)
			path := filepath.Join(t.TempDir(), "token")
			writeAtomically(t, path, "old\n")
			c := tokenFileClient(t, a, &rest.Config{BearerTokenFile: path})
			if got := a.get(t, c); got != "Bearer old" {
				t.Fatalf("first request carried %q, want the file's token", got)
			}
			writeAtomically(t, path, "newer token\n") // old is revoked now
			if got := a.get(t, c); got != "Bearer newer token" {
				t.Fatalf("after a rewrite the request carried %q, want the new token", got)
			}
			gap.make(t, path)
			if got := a.get(t, c); got != "Bearer newer token" {
				t.Errorf("with the file %s the request carried %q, want the last token read, %q", gap.name, got, "Bearer newer token")
			}
			writeAtomically(t, path, "newest")
			if got := a.get(t, c); got != "Bearer newest" {
				t.Errorf("once the file is back the request carried %q, want %q", got, "Bearer newest")
			}
		})
	}
}

// A token renamed over the file with the same size and the same
// modification time as the one it replaces (ServiceAccount tokens of one
// account are often of one length, and a file system's clock may tick
// coarsely) is another file: it is read at the next request, not up to
// a second later.
func TestTokenFileRenamedOverWithTheSameSizeAndTime(t *testing.T) {
	a := newAuthRecorder(t)
	path := filepath.Join(t.TempDir(), "token")
	writeAtomically(t, path, "token-1")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	c := tokenFileClient(t, a, &rest.Config{BearerTokenFile: path})
	if got := a.get(t, c); got != "Bearer token-1" {
		t.Fatalf("first request carried %q, want the file's token", got)
	}
	writeAtomically(t, path, "token-2")
	if err := os.Chtimes(path, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	if got := a.get(t, c); got != "Bearer token-2" {
		t.Errorf("after the rename the request carried %q, want %q", got, "Bearer token-2")
	}
}

// A config with both a token and a token file, and a WrapTransport of
// its own: the file's token goes out, the config's wrapper sees that
// token (it runs beneath the store's), and the config itself is left as
// it was.
func TestTokenFileWithBearerTokenAndWrapTransport(t *testing.T) {
	a := newAuthRecorder(t)
	path := filepath.Join(t.TempDir(), "token")
	writeAtomically(t, path, "from-file")
	var wrapped []string // written by the requests, sent one at a time
	cfg := &rest.Config{BearerToken: "from-config", BearerTokenFile: path}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			wrapped = append(wrapped, r.Header.Get("Authorization"))
			return rt.RoundTrip(r)
		})
	}
	wrap := cfg.WrapTransport
	c := tokenFileClient(t, a, cfg)
	writeAtomically(t, path, "rotated")
	if got := a.get(t, c); got != "Bearer rotated" {
		t.Errorf("the request carried %q, want the file's token", got)
	}
	if len(wrapped) != 1 || wrapped[0] != "Bearer rotated" {
		t.Errorf("the config's WrapTransport saw %q, want the file's token once", wrapped)
	}
	if cfg.BearerToken != "from-config" || cfg.BearerTokenFile != path || fmt.Sprint(cfg.WrapTransport) != fmt.Sprint(wrap) {
		t.Errorf("the config was changed: %+v", cfg)
	}
}

// roundTripFunc is an http.RoundTripper made of a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Requests sent while the file is rewritten again and again (atomically,
// as the kubelet does) each carry a whole token the file held, never an
// empty or a partial one, and a client's requests one after the other
// never go back to an older token.
func TestTokenFileConcurrentRequestsDuringRewrites(t *testing.T) {
	a := newAuthRecorder(t)
	path := filepath.Join(t.TempDir(), "token")
	const rewrites = 200
	writeAtomically(t, path, "token-0")
	c := tokenFileClient(t, a, &rest.Config{BearerTokenFile: path})
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				resp, err := c.Get(fmt.Sprintf("%s/api/%d", a.srv.URL, g))
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
			}
		})
	}
	for i := 1; i <= rewrites; i++ {
		writeAtomically(t, path, fmt.Sprintf("token-%d", i))
	}
	close(done)
	wg.Wait()
	a.mu.Lock()
	last := map[string]int{} // by client, the token its last request carried
	for i, got := range a.seen {
		var n int
		if _, err := fmt.Sscanf(got, "Bearer token-%d", &n); err != nil || got != fmt.Sprintf("Bearer token-%d", n) {
			t.Errorf("a request carried %q, not a token the file held", got)
			continue
		}
		if n < last[a.paths[i]] {
			t.Errorf("a request of %s carried token %d after one carried %d", a.paths[i], n, last[a.paths[i]])
		}
		last[a.paths[i]] = n
	}
	if len(a.seen) < rewrites {
		t.Logf("only %d requests during %d rewrites", len(a.seen), rewrites)
	}
	a.mu.Unlock()
	if got := a.get(t, c); got != fmt.Sprintf("Bearer token-%d", rewrites) {
		t.Errorf("after the last rewrite a request carried %q", got)
	}
}
