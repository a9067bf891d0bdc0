// TestReadmeGoSnippets: every Go snippet of README.md, built and run as
// written.

package controller

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

var readmeEtcd = flag.Bool("readme.etcd", false, "TestReadmeGoSnippets also runs the README's replica snippet, against an etcd it starts from PATH (CI does)")

// readmeSnippet is one ```go block of README.md.
type readmeSnippet struct {
	line int    // of its opening fence
	code string // as written
}

// dir is the package directory the snippet is built in: its line in the
// README names it, so that the go command's messages point there.
func (s readmeSnippet) dir() string { return fmt.Sprintf("readme_line_%d", s.line) }

func (s readmeSnippet) isMain() bool {
	return regexp.MustCompile(`(?m)^package main$`).MatchString(s.code)
}

func (s readmeSnippet) usesReplicas() bool {
	return strings.Contains(s.code, `"github.com/bgctl/controller/ha"`)
}

// readmeSnippets returns the Go snippets of README.md.
func readmeSnippets(t *testing.T) []readmeSnippet {
	t.Helper()
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []readmeSnippet
	var cur *readmeSnippet
	for i, line := range strings.Split(string(b), "\n") {
		switch {
		case cur == nil && line == "```go":
			cur = &readmeSnippet{line: i + 1}
		case cur != nil && line == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.code += line + "\n"
		}
	}
	if cur != nil {
		t.Fatalf("README.md:%d: a Go snippet is not closed", cur.line)
	}
	return out
}

// Every Go snippet of the README is a whole file that builds and runs as
// written: one with package main is a program that must exit with status
// 0 on its own, any other is a test file whose tests must pass. Each is
// built in a module of its own that requires this one (replaced by this
// checkout), so a snippet can be copied into a user's project as it is.
//
// The snippet that runs replicas needs the ha module and an etcd: it runs
// with -readme.etcd, which CI passes once it has installed etcd, against
// an etcd started from PATH; it is interrupted once its DoFunc has run,
// and must then leave and exit with status 0.
func TestReadmeGoSnippets(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the README's snippets: %v", err)
	}
	var core, replicas []readmeSnippet
	for _, s := range readmeSnippets(t) {
		switch {
		case !regexp.MustCompile(`(?m)^package \w+$`).MatchString(s.code):
			t.Errorf("README.md:%d: a Go snippet must be a whole file, from its package clause on, so that it runs as written:\n%s", s.line, s.code)
		case s.usesReplicas():
			replicas = append(replicas, s)
		default:
			core = append(core, s)
		}
	}
	if len(core) == 0 {
		t.Fatal("README.md has no Go snippet of the core module")
	}
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("core", func(t *testing.T) {
		dir := snippetModule(t, core, []string{root}, map[string]string{"github.com/bgctl/controller": root})
		buildAndRun(t, goCmd, dir, core, nil)
	})
	if len(replicas) == 0 {
		return
	}
	t.Run("replicas", func(t *testing.T) {
		if !*readmeEtcd {
			t.Logf("README.md:%d: the replica snippet needs an etcd: it runs with -readme.etcd (CI does)", replicas[0].line)
			return
		}
		addr, stop, err := startReadmeEtcd(t)
		if err != nil {
			t.Fatalf("-readme.etcd: no etcd could start: %v", err)
		}
		defer stop()
		ha := filepath.Join(root, "ha")
		dir := snippetModule(t, replicas, []string{ha, root},
			map[string]string{"github.com/bgctl/controller": root, "github.com/bgctl/controller/ha": ha})
		buildAndRun(t, goCmd, dir, replicas, []string{"ETCD_ENDPOINT=" + addr})
	})
}

// snippetModule writes snippets into a new module, each in its own
// package directory, and returns its directory. The module requires what
// the modules in from require (their go.mod and go.sum), and the modules of
// replace at v0.0.0, replaced by their directories.
func snippetModule(t *testing.T, snippets []readmeSnippet, from []string, replace map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	var mod, sum bytes.Buffer
	mod.WriteString("module readme.example\n\ngo 1.26.0\n\n")
	for _, m := range slices.Sorted(maps.Keys(replace)) {
		fmt.Fprintf(&mod, "require %s v0.0.0\n\nreplace %s => %s\n\n", m, m, replace[m])
	}
	for _, d := range from {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		for _, block := range regexp.MustCompile(`(?s)\nrequire \(\n(.*?)\n\)`).FindAllSubmatch(b, -1) {
			for _, req := range strings.Split(string(block[1]), "\n") {
				if f := strings.Fields(req); len(f) >= 2 && replace[f[0]] == "" {
					fmt.Fprintf(&mod, "require %s %s\n", f[0], f[1])
				}
			}
		}
		s, err := os.ReadFile(filepath.Join(d, "go.sum"))
		if err != nil {
			t.Fatal(err)
		}
		sum.Write(s)
	}
	write := func(name string, b []byte) {
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "go.mod"), mod.Bytes())
	write(filepath.Join(dir, "go.sum"), sum.Bytes())
	for _, s := range snippets {
		file := "snippet_test.go"
		if s.isMain() {
			file = "main.go"
		}
		write(filepath.Join(dir, s.dir(), file), []byte(s.code))
	}
	return dir
}

// buildAndRun vets the snippets of the module in dir, runs the tests of
// those that are test files, and builds and runs those that are programs,
// with env added to their environment.
func buildAndRun(t *testing.T, goCmd, dir string, snippets []readmeSnippet, env []string) {
	t.Helper()
	goEnv := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	gorun := func(args ...string) {
		t.Helper()
		cmd := exec.Command(goCmd, args...)
		cmd.Dir, cmd.Env = dir, goEnv
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s, in a module holding README.md's snippets (each in readme_line_<line of README.md>): %v\n%s",
				strings.Join(args, " "), err, out)
		}
	}
	gorun("vet", "./...")
	var tests, mains []string
	for _, s := range snippets {
		if s.isMain() {
			mains = append(mains, "./"+s.dir())
		} else {
			tests = append(tests, "./"+s.dir())
		}
	}
	if len(tests) > 0 {
		gorun(append([]string{"test", "-count=1"}, tests...)...)
	}
	for _, s := range snippets {
		if !s.isMain() {
			continue
		}
		bin := filepath.Join(dir, "bin", s.dir())
		gorun("build", "-o", bin, "./"+s.dir())
		if s.usesReplicas() {
			runUntilRan(t, s, bin, env)
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, bin)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("README.md:%d: the program did not exit with status 0 within a minute: %v\n%s", s.line, err, out)
		}
	}
}

// runUntilRan runs the replica snippet's program until it prints a line
// (its DoFunc ran), then interrupts it: it must leave and exit with
// status 0.
func runUntilRan(t *testing.T, s readmeSnippet, bin string, env []string) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ran := make(chan string, 1)
	go func() { // ends when the program closes its output, which Wait below waits for
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			ran <- sc.Text()
		}
		io.Copy(io.Discard, stdout)
	}()
	select {
	case line := <-ran:
		t.Logf("README.md:%d: the program printed %q", s.line, line)
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("README.md:%d: the program printed nothing within 30 s:\n%s", s.line, stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // joined below
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("README.md:%d: after SIGINT the program exited with %v:\n%s", s.line, err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-exited
		t.Errorf("README.md:%d: the program did not exit within 30 s of SIGINT:\n%s", s.line, stderr.String())
	}
}

// startReadmeEtcd starts the etcd found on PATH on free loopback ports,
// with its data in a temporary directory and without the ETCD_* variables
// (which etcd reads as flags), and returns its client address once it
// reports itself healthy.
func startReadmeEtcd(t *testing.T) (addr string, stop func(), err error) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return "", nil, err
	}
	var ports [2]int
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", nil, err
		}
		ports[i] = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
	client, peer := fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	cmd := exec.Command(bin, "--name", "readme", "--data-dir", filepath.Join(t.TempDir(), "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "readme="+peer, "--log-level", "error", "--logger", "zap")
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "ETCD_") })
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop = func() {
		cmd.Process.Kill()
		cmd.Wait()
	}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		res, err := http.Get(client + "/health")
		if err != nil {
			continue
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if bytes.Contains(body, []byte(`"health":"true"`)) {
			return fmt.Sprintf("127.0.0.1:%d", ports[0]), stop, nil
		}
	}
	stop()
	return "", nil, fmt.Errorf("etcd at %s was not healthy within 15 s", client)
}
