// Server versions: the etcd releases whose leases the fence can trust, and
// the check Join makes of the servers it reaches.

package etcd

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
)

// serverVersion is an etcd release number, as the maintenance Status call
// reports it ("3.6.5"). A pre-release ("3.7.0-rc.0") counts as its release:
// the fixes the fence needs were on etcd's main branch before any 3.7
// pre-release was cut.
type serverVersion struct {
	major, minor, patch int
}

// parseServerVersion reads "3.6.5", "v3.6.5" or "3.7.0-rc.0".
func parseServerVersion(s string) (serverVersion, error) {
	release, _, _ := strings.Cut(strings.TrimPrefix(s, "v"), "-")
	fields := strings.Split(release, ".")
	if len(fields) != 3 {
		return serverVersion{}, fmt.Errorf("ha: etcd version %q: want major.minor.patch", s)
	}
	var n [3]int
	for i, f := range fields {
		v, err := strconv.Atoi(f)
		if err != nil || v < 0 {
			return serverVersion{}, fmt.Errorf("ha: etcd version %q: %q is not a release number", s, f)
		}
		n[i] = v
	}
	return serverVersion{n[0], n[1], n[2]}, nil
}

func (v serverVersion) String() string {
	return fmt.Sprintf("%d.%d.%d", v.major, v.minor, v.patch)
}

// compare returns -1, 0 or +1 as v is older than, the same as, or newer
// than w.
func (v serverVersion) compare(w serverVersion) int {
	for _, d := range [...]int{v.major - w.major, v.minor - w.minor, v.patch - w.patch} {
		if d != 0 {
			return min(max(d, -1), 1)
		}
	}
	return 0
}

// sameLine reports whether v and w are of one release line (3.6.x).
func (v serverVersion) sameLine(w serverVersion) bool {
	return v.major == w.major && v.minor == w.minor
}

// supportedServers holds, for each supported release line, oldest first,
// its first release that carries both server fixes the fence relies on:
//
//   - etcd #15247, an old leader stuck on a slow disk or CPU revoking
//     leases after a new leader was elected: fixed by #16822 (in 3.6.0),
//     backported to 3.5.13 (#17425) and 3.4.31 (#17465);
//   - a keepalive answered for a lease being revoked at that moment: fixed
//     by #20590, backported to 3.6.5 (#20615), 3.5.23 (#20616) and 3.4.38
//     (#20813).
//
// Every 3.7 release carries both. The 3.4 line carries both from 3.4.38,
// but it ended with 3.4.45 and the tests cannot build it (it predates the
// go.etcd.io/etcd/server/v3 module), so it is not supported. The package
// documentation states the same; keep them together.
var supportedServers = []serverVersion{
	{3, 5, 23},
	{3, 6, 5},
	{3, 7, 0},
}

// serverTooOld decides whether a server of version v is older than this
// package supports, and returns the oldest supported release to name in
// the warning: the first good release of v's line, or the oldest supported
// release when v's line is older than every supported one. A line newer
// than every listed one is supported: it branched after both fixes.
func serverTooOld(v serverVersion) (minimum serverVersion, old bool) {
	for _, m := range supportedServers {
		if v.sameLine(m) {
			return m, v.compare(m) < 0
		}
	}
	oldest, newest := supportedServers[0], supportedServers[len(supportedServers)-1]
	if v.compare(newest) > 0 {
		return newest, false
	}
	return oldest, true
}

// serverVersionWarning is what Join logs at Warn for a server of version
// v, older than minimum (from serverTooOld).
func serverVersionWarning(endpoint string, v, minimum serverVersion) string {
	which := "oldest release"
	if v.sameLine(minimum) {
		which = fmt.Sprintf("first %d.%d release", minimum.major, minimum.minor)
	}
	return fmt.Sprintf("etcd at %s runs %s, older than %s, the %s this package supports: the fence may not hold (see Server versions in the package documentation)", endpoint, v, minimum, which)
}

// CheckServers asks every endpoint of the client for its etcd version and
// warns, once, about the oldest one that is too old. It waits at most
// RequestTimeout; a failure to ask is logged at Debug.
func (b *etcdBackend) CheckServers(ctx context.Context) {
	if b.cli.Maintenance == nil { // a client made by clientv3.NewCtxClient
		b.log.Debug("asking etcd for its version: the client has no maintenance API")
		return
	}
	ctx, cancel := context.WithTimeout(ctx, b.requestTimeout)
	defer cancel()
	warnOldServers(ctx, b.log, b.cli.Endpoints(), func(ctx context.Context, endpoint string) (string, error) {
		resp, err := b.cli.Status(ctx, endpoint)
		if err != nil {
			return "", err
		}
		return resp.Version, nil
	})
}

// warnOldServers asks every endpoint for its version with ask, all at once,
// and logs one warning naming the oldest server that is too old, if any.
// ask must return when ctx ends.
func warnOldServers(ctx context.Context, log *slog.Logger, endpoints []string, ask func(context.Context, string) (string, error)) {
	type answer struct {
		version string
		err     error
	}
	answers := make([]answer, len(endpoints))
	var wg sync.WaitGroup
	for i, ep := range endpoints {
		// Owned by warnOldServers, joined below; each writes only its
		// own element of answers.
		wg.Go(func() {
			v, err := ask(ctx, ep)
			answers[i] = answer{v, err}
		})
	}
	wg.Wait()

	var (
		worst    serverVersion
		worstAt  string
		worstMin serverVersion
	)
	for i, a := range answers {
		if a.err != nil {
			log.Debug("asking etcd for its version", "endpoint", endpoints[i], "error", a.err)
			continue
		}
		v, err := parseServerVersion(a.version)
		if err != nil {
			log.Debug("asking etcd for its version", "endpoint", endpoints[i], "error", err)
			continue
		}
		log.Debug("etcd version", "endpoint", endpoints[i], "version", v.String())
		minimum, old := serverTooOld(v)
		if old && (worstAt == "" || v.compare(worst) < 0) {
			worst, worstAt, worstMin = v, endpoints[i], minimum
		}
	}
	if worstAt != "" {
		log.Warn(serverVersionWarning(worstAt, worst, worstMin), "endpoint", worstAt, "version", worst.String())
	}
}
