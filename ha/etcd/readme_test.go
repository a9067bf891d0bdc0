// The replica programs of README.md and of the guides in docs/, but for the
// one .ci/release-simulation runs, built and run against the tests' etcd
// as written.

package etcd

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The program .ci/release-simulation builds after a go get of ha/etcd and
// runs with -etcd: the one Go block of this section of this guide.
const (
	releaseProgramFile    = "docs/replicas-etcd.md"
	releaseProgramSection = "## Every replica runs one program"
)

// readmeReplicaPrograms returns the ```go blocks of README.md and
// docs/*.md under root that import ha and are programs, but for the one the
// release simulation runs and those on another store, by file:line of
// their opening fence.
func readmeReplicaPrograms(t *testing.T, root string) map[string]string {
	t.Helper()
	guides, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	progs := map[string]string{}
	for _, path := range append([]string{filepath.Join(root, "README.md")}, guides...) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		file, err := filepath.Rel(root, path)
		if err != nil {
			t.Fatal(err)
		}
		file = filepath.ToSlash(file)
		section, start := "", 0
		var code strings.Builder
		for i, line := range strings.Split(string(b), "\n") {
			switch {
			case start == 0 && strings.HasPrefix(line, "## "):
				section = line
			case start == 0 && line == "```go":
				start = i + 1
				code.Reset()
			case start != 0 && line == "```":
				src := code.String()
				released := file == releaseProgramFile && section == releaseProgramSection
				// A program on another store is its module's (ha/postgres's
				// TestReadmePostgresProgramsRun).
				onEtcd := !strings.Contains(src, `"github.com/bgctl/controller/ha/postgres"`) && !strings.Contains(src, `"github.com/bgctl/controller/ha/kube"`)
				if !released && onEtcd && strings.Contains(src, `"github.com/bgctl/controller/ha"`) && strings.Contains(src, "\npackage main\n") {
					progs[fmt.Sprintf("%s:%d", file, start)] = src
				}
				start = 0
			case start != 0:
				code.WriteString(line + "\n")
			}
		}
	}
	return progs
}

// programDir is the package directory of the program at where (file:line),
// named after it.
func programDir(where string) string {
	return regexp.MustCompile(`[^A-Za-z0-9]`).ReplaceAllString(where, "_")
}

// Each program is built in a module of its own that requires the core and
// ha of this checkout, run with ETCD_ENDPOINT naming the tests' etcd until
// it prints its first line (a DoFunc ran, or the name runs here), then
// interrupted: it must leave and exit with status 0. A program that serves
// /metrics does so at LISTEN_ADDR, and must serve there the replica
// metrics beside the core's, from one registry, once its name runs.
func TestReadmeReplicaProgramsRun(t *testing.T) {
	needEtcd(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	progs := readmeReplicaPrograms(t, root)
	if len(progs) == 0 {
		t.Fatalf("README.md and docs/ have no replica program but the one of %s's %q", releaseProgramFile, releaseProgramSection)
	}
	dir := t.TempDir()
	mod := fmt.Sprintf("module readme.example\n\ngo 1.26.0\n\nrequire (\n\tgithub.com/bgctl/controller v0.0.0\n\tgithub.com/bgctl/controller/ha v0.0.0\n\tgithub.com/bgctl/controller/ha/etcd v0.0.0\n)\n\nreplace github.com/bgctl/controller => %s\n\nreplace github.com/bgctl/controller/ha => %s\n\nreplace github.com/bgctl/controller/ha/etcd => %s\n", root, filepath.Join(root, "ha"), filepath.Join(root, "ha", "etcd"))
	var sum bytes.Buffer
	for _, f := range []string{filepath.Join(root, "go.sum"), filepath.Join(root, "ha", "go.sum"), filepath.Join(root, "ha", "etcd", "go.sum")} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		sum.Write(b)
	}
	write := func(name, content string) {
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "go.mod"), mod)
	write(filepath.Join(dir, "go.sum"), sum.String())
	for where, src := range progs {
		write(filepath.Join(dir, programDir(where), "main.go"), src)
	}
	gocmd := func(args ...string) {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s, in a module holding the replica programs of README.md and docs/ (each in <file>_<line>): %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	gocmd("mod", "tidy")
	gocmd("vet", "./...")
	servesMetrics := 0
	for where, src := range progs {
		bin := filepath.Join(dir, "bin", programDir(where))
		gocmd("build", "-o", bin, "./"+programDir(where))
		var env []string
		var whilePrinted func() error
		if strings.Contains(src, `"GET /metrics"`) {
			servesMetrics++
			addr := freeAddr(t)
			env = []string{"LISTEN_ADDR=" + addr}
			whilePrinted = func() error { return replicaMetricsServed(addr) }
		}
		runUntilItPrints(t, where, bin, env, whilePrinted)
	}
	if servesMetrics == 0 {
		t.Error("no replica program of README.md or docs/ (but the release simulation's) serves /metrics: the replica metrics are shown registered nowhere")
	}
}

// freeAddr returns a local address no one listens on, for a program to
// listen on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// replicaMetricsServed tells why addr's /metrics does not serve the
// core's metrics and the replica's, one controller running under its
// claim, or returns nil.
func replicaMetricsServed(addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	var missing []string
	for _, want := range []string{`controllers_active 1`, `controllers_replica_claims_held 1`, `controllers_replica_claims_acquired_total 1`} {
		if !regexp.MustCompile(`(?m)^(\w+_)?` + regexp.QuoteMeta(want) + `$`).Match(body) {
			missing = append(missing, want)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("/metrics (status %s) has no line %q:\n%s", resp.Status, missing, body)
	}
	return nil
}

// runUntilItPrints runs bin against the tests' etcd, with env added, until
// it prints a line, then calls whilePrinted (when not nil; an error fails
// the test), interrupts it, and fails the test unless it exits with
// status 0 within 30 s.
func runUntilItPrints(t *testing.T, where string, bin string, env []string, whilePrinted func() error) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(append(os.Environ(), "ETCD_ENDPOINT="+testEtcd), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	printed := make(chan string, 1)
	go func() { // ends when the program closes its output, which Wait below waits for
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			printed <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	exited := make(chan error, 1)
	select {
	case out := <-printed:
		t.Logf("%s printed %q", where, out)
		if whilePrinted != nil {
			if err := whilePrinted(); err != nil {
				t.Errorf("%s: %v", where, err)
			}
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("%s: the program printed nothing within 30s:\n%s", where, stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	go func() { exited <- cmd.Wait() }() // joined below
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("%s: after SIGINT the program exited with %v:\n%s", where, err, stderr.String())
		}
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-exited
		t.Errorf("%s: the program did not exit within 30s of SIGINT:\n%s", where, stderr.String())
	}
}
