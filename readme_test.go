// TestReadmeGoSnippets: every Go snippet of README.md and of the guides in
// docs/, built and run as written.

package controller

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// readmeSnippet is one ```go block of README.md or of a guide in docs/.
type readmeSnippet struct {
	file string // README.md, docs/testing.md, …
	line int    // of its opening fence
	code string // as written
}

// dir is the package directory the snippet is built in: its file and line
// name it (docs_testing_md_line_42), so that the go command's messages
// point there.
func (s readmeSnippet) dir() string {
	return fmt.Sprintf("%s_line_%d", regexp.MustCompile(`[^A-Za-z0-9]`).ReplaceAllString(s.file, "_"), s.line)
}

// where is file:line, for messages.
func (s readmeSnippet) where() string { return fmt.Sprintf("%s:%d", s.file, s.line) }

func (s readmeSnippet) isMain() bool {
	return regexp.MustCompile(`(?m)^package main$`).MatchString(s.code)
}

func (s readmeSnippet) usesReplicas() bool {
	return strings.Contains(s.code, `"github.com/bgctl/controller/ha"`)
}

// usesKube tells a snippet of the Kubernetes store, which ha/kube's tests
// vet and build with that module (TestReadmeKubeSnippetsBuild).
func (s readmeSnippet) usesKube() bool {
	return strings.Contains(s.code, `"github.com/bgctl/controller/ha/kube"`)
}

// usesPostgres tells a snippet of the PostgreSQL store, which
// ha/postgres's tests vet, build and run against their server with that
// module (TestReadmePostgresProgramsRun).
func (s readmeSnippet) usesPostgres() bool {
	return strings.Contains(s.code, `"github.com/bgctl/controller/ha/postgres"`)
}

// docFiles returns README.md and every guide in docs/, the files whose Go
// snippets are built and run.
func docFiles(t *testing.T) []string {
	t.Helper()
	guides, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	return append([]string{"README.md"}, guides...)
}

// readmeSnippets returns the Go snippets of README.md and of docs/*.md.
func readmeSnippets(t *testing.T) []readmeSnippet {
	t.Helper()
	var out []readmeSnippet
	for _, file := range docFiles(t) {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		file = filepath.ToSlash(file)
		var cur *readmeSnippet
		for i, line := range strings.Split(string(b), "\n") {
			switch {
			case cur == nil && line == "```go":
				cur = &readmeSnippet{file: file, line: i + 1}
			case cur != nil && line == "```":
				out = append(out, *cur)
				cur = nil
			case cur != nil:
				cur.code += line + "\n"
			}
		}
		if cur != nil {
			t.Fatalf("%s: a Go snippet is not closed", cur.where())
		}
	}
	return out
}

// Every Go snippet of the README and of the guides in docs/ is a whole
// file that builds and runs as written: one with package main is a
// program that must exit with status 0 on its own, any other is a test
// file whose tests must pass. Each is built in a module of its own that
// requires this one (replaced by this checkout), so a snippet can be
// copied into a user's project as it is.
//
// A snippet that uses the ha module is vetted and built here with ha and
// its store on etcd (ha/etcd), not run: it needs an etcd. ha/etcd's
// TestReadmeReplicaProgramsRun runs those programs against the tests'
// etcd, and .ci/release-simulation the one of docs/replicas-etcd.md's
// "Every replica runs one program", after a go get of ha/etcd from a
// simulated release.
// A snippet of the Kubernetes store (ha/kube) is vetted and built by that
// module's tests instead, with its dependencies; one of the PostgreSQL
// store (ha/postgres) by that module's, which also run its programs.
func TestReadmeGoSnippets(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build the snippets of README.md and docs/: %v", err)
	}
	var core, replicas []readmeSnippet
	for _, s := range readmeSnippets(t) {
		switch {
		case !regexp.MustCompile(`(?m)^package \w+$`).MatchString(s.code):
			t.Errorf("%s: a Go snippet must be a whole file, from its package clause on, so that it runs as written:\n%s", s.where(), s.code)
		case s.usesKube():
			// built in ha/kube
		case s.usesPostgres():
			// built and run in ha/postgres
		case s.usesReplicas():
			replicas = append(replicas, s)
		default:
			core = append(core, s)
		}
	}
	if len(core) == 0 {
		t.Fatal("README.md and docs/ have no Go snippet of the core module")
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
		ha, haEtcd := filepath.Join(root, "ha"), filepath.Join(root, "ha", "etcd")
		dir := snippetModule(t, replicas, []string{haEtcd, ha, root},
			map[string]string{"github.com/bgctl/controller": root, "github.com/bgctl/controller/ha": ha, "github.com/bgctl/controller/ha/etcd": haEtcd})
		buildAndRun(t, goCmd, dir, replicas, nil)
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
			t.Fatalf("go %s, in a module holding the snippets of README.md and docs/ (each in <file>_line_<line of its fence>): %v\n%s",
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
			continue // run by .ci/release-simulation, against an etcd
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, bin)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		cancel()
		if err != nil {
			t.Errorf("%s: the program did not exit with status 0 within a minute: %v\n%s", s.where(), err, out)
		}
	}
}
