// Building a server once per release, and the go command that builds it.

package gobuild

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// Cached returns <user cache dir>/bgctl-controller-ha/<name>/<release>/<name>,
// built first by build when it is missing or reports another release
// (releaseOf). build gets a scratch directory for its module and the path
// to write the binary to; both sit beside the cached binary, so the rename
// that puts it in place is atomic.
func Cached(name, release string, releaseOf func(bin string) (string, error), build func(ctx context.Context, tmp, out string) error) (string, error) {
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for the tests' %s: %w", name, err)
	}
	dir := filepath.Join(base, "bgctl-controller-ha", name, release)
	bin := filepath.Join(dir, name)
	if v, err := releaseOf(bin); err == nil && v == release {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Test binaries that start at once (go test ./..., several modules'
	// tests, several checkouts) build one at a time: the later ones find the
	// binary after the lock.
	unlock, err := lockFile(filepath.Join(dir, "lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if v, err := releaseOf(bin); err == nil && v == release {
		return bin, nil
	}
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	fmt.Fprintf(os.Stderr, "tests: building %s %s from the Go module proxy into %s (once)\n", name, release, bin)
	start := time.Now()
	// Generous: a cold build of kube-apiserver takes about five minutes
	// on two cores (half an hour under load). The tests build in TestMain,
	// before m.Run starts their -timeout alarm, but go test kills a test
	// binary still running at -timeout + 1 minute from its start, the
	// build included: ./test builds first, outside go test
	// (ha/internal/testservers).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	built := filepath.Join(tmp, name)
	if err := build(ctx, tmp, built); err != nil {
		return "", fmt.Errorf("building %s %s: %w", name, release, err)
	}
	if v, err := releaseOf(built); err != nil || v != release {
		return "", fmt.Errorf("building %s %s: the binary reports %q (%v)", name, release, v, err)
	}
	if err := os.Rename(built, bin); err != nil {
		return "", err
	}
	fmt.Fprintf(os.Stderr, "tests: built %s %s in %v\n", name, release, time.Since(start).Round(time.Second))
	return bin, nil
}

// GoIn runs the go command in dir for the host's platform, whatever the
// environment sets for the caller, in module mode of its own (the build
// modules are not part of this one, nor of any workspace), and returns its
// standard output. No C toolchain is needed, as for the projects' own
// release builds of these servers.
func GoIn(ctx context.Context, dir string, args ...string) ([]byte, error) {
	gocmd, err := exec.LookPath("go") // go test puts its own first on PATH
	if err != nil {
		return nil, fmt.Errorf("no go command to build with: %w", err)
	}
	var env []string
	for _, kv := range os.Environ() {
		switch strings.SplitN(kv, "=", 2)[0] {
		case "GOFLAGS", "GOWORK", "GOOS", "GOARCH", "CGO_ENABLED":
		default:
			env = append(env, kv)
		}
	}
	env = append(env, "GOWORK=off", "GOFLAGS=-mod=mod", "CGO_ENABLED=0", "GOOS="+runtime.GOOS, "GOARCH="+runtime.GOARCH)
	cmd := exec.CommandContext(ctx, gocmd, args...)
	cmd.Dir, cmd.Env = dir, env
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go %s: %v: %s", strings.Join(args, " "), err, tail([]byte(stderr.String()), 2000))
	}
	return out, nil
}

// VersionLine runs bin --version and returns what follows prefix on the
// line of its output that starts with it.
func VersionLine(bin, prefix string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(string(out)) {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("%s --version names no version: %s", bin, tail(out, 200))
}

// lockFile takes an exclusive lock on path, waiting for it, and returns
// its release.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() { f.Close() }, nil // closing the file drops the lock
}

// CurrentEtcd is the etcd release the tests of ha/etcd and the
// kube-apiserver of ha/kube's run on by default: the latest release of the
// current line, one pin for both, so they share one build.
const CurrentEtcd = "v3.7.3"

// Etcd returns the cached etcd of release ("v3.7.3"), built first
// if need be.
func Etcd(release string) (string, error) {
	return Cached("etcd", release, EtcdRelease, func(ctx context.Context, tmp, out string) error {
		for _, args := range [][]string{
			{"mod", "init", "etcd-for-ha-tests"},
			{"get", "go.etcd.io/etcd/server/v3@" + release},
			{"build", "-trimpath", "-o", out, "go.etcd.io/etcd/server/v3"},
		} {
			if _, err := GoIn(ctx, tmp, args...); err != nil {
				return err
			}
		}
		return nil
	})
}

// EtcdRelease returns the release the etcd at bin reports, "v3.7.3".
func EtcdRelease(bin string) (string, error) {
	v, err := VersionLine(bin, "etcd Version:")
	return "v" + v, err
}

// tail returns the last n bytes of b.
func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
