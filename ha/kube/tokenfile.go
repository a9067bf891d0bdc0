// A bearer token file read again as soon as it changes: a Pod's
// ServiceAccount token, which the kubelet rewrites before it expires and
// which may be revoked the moment it has been replaced.

package kube

import (
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/rest"
)

// withTokenFile returns cfg, or, when cfg names a bearer token file, a
// copy whose requests carry the token the file holds when each is sent.
//
// client-go reads cfg.BearerTokenFile once a minute at most: a token the
// kubelet rewrote goes on being sent for up to a minute after, which is
// harmless while the old token stays valid until its own expiry, but
// makes every request fail (401) when the old one is revoked as soon as
// it is replaced (its Pod, Secret or ServiceAccount bound object
// deleted and made anew, an administrator revoking it): the session's
// renewals would fail until the fence passed. So the store looks at the
// file before each request (one stat), reads it again when it changed
// (or a second after it last did), and sets the Authorization header to
// what it holds, beneath client-go's own header. Nothing of the token is
// kept but what the file held last; cfg itself is not changed, and the
// copy's BearerToken is client-go's alone, sent only until the file has
// been read with a token in it.
func withTokenFile(cfg *rest.Config) *rest.Config {
	if cfg.BearerTokenFile == "" {
		return cfg
	}
	own := rest.CopyConfig(cfg)
	wrap := cfg.WrapTransport
	tf := &tokenFile{path: cfg.BearerTokenFile}
	own.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		if wrap != nil {
			rt = wrap(rt)
		}
		return &tokenFileTransport{rt: rt, tf: tf}
	}
	return own
}

// tokenFile is the token a file holds, read again whenever the file is
// another (renamed over it) or its size or modification time changes (the kubelet swaps a symlink to a
// new directory; an editor may rewrite it in place), and at least once a
// second, in case a rewrite kept both.
type tokenFile struct {
	path string // immutable

	mu     sync.Mutex
	seen   fileStamp // guarded by mu: the file as it was when token was read
	readAt time.Time // guarded by mu: when token was read
	token  string    // guarded by mu: the last token the file held; "" until it held one
}

// fileStamp is what tells one version of a file from the next.
type fileStamp struct {
	info os.FileInfo // nil until read
	size int64
	mod  time.Time
}

// same reports whether st and o are one version of one file: a file
// renamed over it (the kubelet's swap) is another file even with the
// same size and modification time, which a token of the same length,
// written within one tick of a coarse file system clock, has.
func (st fileStamp) same(o fileStamp) bool {
	return st.info != nil && o.info != nil && os.SameFile(st.info, o.info) && st.size == o.size && st.mod.Equal(o.mod)
}

// rereadEvery bounds how long tokenFile keeps a token whose file seems
// unchanged.
const rereadEvery = time.Second

// current returns the token the file holds now; while the file cannot be
// read or holds none, the last token it held; false when it never held
// one (the request then goes as client-go made it).
//
// A file briefly missing, or empty (rewritten in place: truncated, then
// written), keeps the last token read: client-go's own may be up to a
// minute older, and revoked when the file was rewritten.
func (f *tokenFile) current() (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fi, err := os.Stat(f.path)
	if err != nil {
		return f.token, f.token != ""
	}
	st := fileStamp{info: fi, size: fi.Size(), mod: fi.ModTime()}
	if st.same(f.seen) && f.token != "" && time.Since(f.readAt) < rereadEvery {
		return f.token, true
	}
	b, err := os.ReadFile(f.path)
	if token := strings.TrimSpace(string(b)); err == nil && token != "" {
		f.seen, f.readAt, f.token = st, time.Now(), token
	}
	return f.token, f.token != ""
}

// tokenFileTransport sets each request's bearer token to tf's. Immutable.
type tokenFileTransport struct {
	rt http.RoundTripper
	tf *tokenFile
}

func (t *tokenFileTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	token, ok := t.tf.current()
	if !ok || req.Header.Get("Authorization") == "Bearer "+token {
		return t.rt.RoundTrip(req)
	}
	req = req.Clone(req.Context()) // a RoundTripper must not change the request it was given
	req.Header.Set("Authorization", "Bearer "+token)
	return t.rt.RoundTrip(req)
}
