// The snippets of the PostgreSQL store in README.md and in the guides in
// docs/: vetted and built with this module as written, and each program
// run against the tests' server.

package postgres

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// postgresSnippets returns the ```go blocks of README.md and docs/*.md
// under root that import this module, by file:line of their opening
// fence.
func postgresSnippets(t *testing.T, root string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	snippets := map[string]string{}
	for _, path := range append(files, filepath.Join(root, "README.md")) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, path)
		fence := 0 // the line of the open fence; 0 outside a block
		var block []string
		for i, line := range strings.Split(string(b), "\n") {
			if fence == 0 {
				if line == "```go" {
					fence, block = i+1, nil
				}
				continue
			}
			if line != "```" {
				block = append(block, line)
				continue
			}
			if src := strings.Join(block, "\n") + "\n"; strings.Contains(src, `"github.com/bgctl/controller/ha/postgres"`) {
				snippets[fmt.Sprintf("%s:%d", filepath.ToSlash(rel), fence)] = src
			}
			fence = 0
		}
	}
	return snippets
}

// Each snippet that uses this module is a whole file: it is vetted and
// built in a module of its own that requires the core, ha and this module
// of this checkout (the root's README test and ha/etcd's leave these
// snippets to this one). Each program is then run with DATABASE_URL
// naming the tests' server until it prints its first line, and
// interrupted: it must leave and exit with status 0 within 30 s.
func TestReadmePostgresProgramsRun(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	snippets := postgresSnippets(t, root)
	if len(snippets) == 0 {
		t.Fatal("README.md and docs/ have no Go snippet that imports github.com/bgctl/controller/ha/postgres")
	}
	dir := t.TempDir()
	mod := "module readme.example\n\ngo 1.26.0\n"
	var sum strings.Builder
	for m, d := range map[string]string{"": root, "/ha": filepath.Join(root, "ha"), "/ha/postgres": filepath.Join(root, "ha", "postgres")} {
		m = "github.com/bgctl/controller" + m
		mod += fmt.Sprintf("\nrequire %s v0.0.0\n\nreplace %s => %s\n", m, m, d)
		b, err := os.ReadFile(filepath.Join(d, "go.sum"))
		if err != nil {
			t.Fatal(err)
		}
		sum.Write(b)
	}
	files := map[string]string{"go.mod": mod, "go.sum": sum.String()}
	pkgOf := func(where string) string { return regexp.MustCompile(`[^A-Za-z0-9]`).ReplaceAllString(where, "_") }
	for where, src := range snippets {
		files[filepath.Join(pkgOf(where), "snippet.go")] = src
	}
	for name, content := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{{"mod", "tidy"}, {"vet", "./..."}, {"build", "-o", "bin/", "./..."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s, in a module holding the snippets of ha/postgres of README.md and docs/ (each in <file>_<line>): %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	programs := 0
	for where, src := range snippets {
		if regexp.MustCompile(`(?m)^package main$`).MatchString(src) {
			programs++
			runUntilItPrints(t, where, filepath.Join(dir, "bin", pkgOf(where)))
		}
	}
	if programs == 0 {
		t.Error("README.md and docs/ have no program on the PostgreSQL store")
	}
}

// runUntilItPrints runs the program bin (of the snippet at where) with
// DATABASE_URL naming the tests' server until it prints a line, then
// sends it SIGINT; it fails t unless the program exits with status 0
// within 30 s.
func runUntilItPrints(t *testing.T, where, bin string) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+testServer.DSN)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	printed := make(chan string, 1)
	exited := make(chan error, 1)
	go func() { // ends with the program: reads its output whole, then waits for it
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			printed <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, stdout)
		exited <- cmd.Wait()
	}()
	select {
	case line := <-printed:
		t.Logf("%s printed %q", where, line)
	case err := <-exited:
		t.Fatalf("%s: the program exited (%v) before it printed a line:\n%s", where, err, stderr.String())
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		t.Fatalf("%s: the program printed nothing within 30 s:\n%s", where, stderr.String())
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("%s: after SIGINT the program exited with %v:\n%s", where, err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		t.Errorf("%s: the program did not exit within 30 s of SIGINT:\n%s", where, stderr.String())
	}
}
