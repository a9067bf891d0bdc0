// The snippets of the Kubernetes store in README.md and in the guides in
// docs/, vetted and built with this module as written.

package kube

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readmeKubeSnippets returns the ```go blocks of README.md and docs/*.md
// under root that import this module, by file:line of their opening fence.
func readmeKubeSnippets(t *testing.T, root string) map[string]string {
	t.Helper()
	guides, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	snippets := map[string]string{}
	for _, path := range append([]string{filepath.Join(root, "README.md")}, guides...) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		file, err := filepath.Rel(root, path)
		if err != nil {
			t.Fatal(err)
		}
		start := 0
		var code strings.Builder
		for i, line := range strings.Split(string(b), "\n") {
			switch {
			case start == 0 && line == "```go":
				start = i + 1
				code.Reset()
			case start != 0 && line == "```":
				if strings.Contains(code.String(), `"github.com/bgctl/controller/ha/kube"`) {
					snippets[fmt.Sprintf("%s:%d", filepath.ToSlash(file), start)] = code.String()
				}
				start = 0
			case start != 0:
				code.WriteString(line + "\n")
			}
		}
	}
	return snippets
}

// Each snippet of the README or of a guide that makes a replica on this module's store
// is a whole file that builds: it is vetted and built in a module of its
// own that requires the core, ha and this module of this checkout (the
// root's README test leaves these snippets to this one).
func TestReadmeKubeSnippetsBuild(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	snippets := readmeKubeSnippets(t, root)
	if len(snippets) == 0 {
		t.Fatal("README.md and docs/ have no Go snippet that imports github.com/bgctl/controller/ha/kube")
	}
	dir := t.TempDir()
	var mod, sum strings.Builder
	mod.WriteString("module readme.example\n\ngo 1.26.0\n")
	for m, d := range map[string]string{"github.com/bgctl/controller": root, "github.com/bgctl/controller/ha": filepath.Join(root, "ha"), "github.com/bgctl/controller/ha/kube": filepath.Join(root, "ha", "kube")} {
		fmt.Fprintf(&mod, "\nrequire %s v0.0.0\n\nreplace %s => %s\n", m, m, d)
		b, err := os.ReadFile(filepath.Join(d, "go.sum"))
		if err != nil {
			t.Fatal(err)
		}
		sum.Write(b)
	}
	files := map[string]string{"go.mod": mod.String(), "go.sum": sum.String()}
	for where, src := range snippets {
		dir := regexp.MustCompile(`[^A-Za-z0-9]`).ReplaceAllString(where, "_") // docs/replicas.md:12: docs_replicas_md_12
		files[filepath.Join(dir, "snippet.go")] = src
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
	for _, args := range [][]string{{"mod", "tidy"}, {"vet", "./..."}, {"build", "./..."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s, in a module holding the snippets of ha/kube of README.md and docs/ (each in <file>_<line>): %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
