// Checks of the repository's prose: rules stated once and linked to, and
// the README's performance figures in one table that names its sources.

package controller

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The retry formula is stated once, as rule 4 in doc.go; every other
// place links to it (a restated copy is one that goes stale when the
// formula changes). The test looks for a multiplication by
// ErrorRetryBaseDuration in the module's Go files and Markdown, ha/ aside
// (a module of its own).
func TestRetryFormulaIsStatedOnce(t *testing.T) {
	formula := regexp.MustCompile("[×*]\\s*`?(p\\.)?ErrorRetryBaseDuration")
	var where []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (path == "ha" || strings.HasPrefix(d.Name(), ".")) && path != ".":
			return filepath.SkipDir
		case d.IsDir() || !(strings.HasSuffix(path, ".go") || strings.HasSuffix(path, ".md")) || strings.HasSuffix(path, "_test.go"):
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if formula.MatchString(line) {
				where = append(where, fmt.Sprintf("%s:%d: %s", path, i+1, strings.TrimSpace(line)))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(where) != 1 || !strings.HasPrefix(where[0], "doc.go:") {
		t.Errorf("the retry formula is stated in %d places, want once, in doc.go (rule 4), linked to from the others:\n%s",
			len(where), strings.Join(where, "\n"))
	}
}

// The README's Performance section is one table of current figures: it
// names the machine (lscpu's model) and the commands that produced it, and
// every benchmark or test a row names exists, so that a renamed one is
// not left quoted with an old figure.
func TestReadmePerformanceIsOneTable(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	section := string(b)
	start := strings.Index(section, "\n## Performance\n")
	if start < 0 {
		t.Fatal(`README.md has no "## Performance" section`)
	}
	section = section[start+1:]
	if end := strings.Index(section[1:], "\n## "); end >= 0 {
		section = section[:end+1]
	}
	if n := strings.Count(section, "\n|---"); n != 1 {
		t.Errorf("the Performance section has %d tables, want one", n)
	}
	if !strings.Contains(section, "`lscpu`") || !strings.Contains(section, "```sh\n") {
		t.Error("the Performance section must name the machine (lscpu's model) and show the commands in a sh block")
	}
	var code strings.Builder
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		code.Write(b)
	}
	named := regexp.MustCompile("`((?:Benchmark|Test)[A-Za-z0-9]+)`").FindAllStringSubmatch(section, -1)
	if len(named) == 0 {
		t.Error("the Performance table names no benchmark or test")
	}
	for _, m := range named {
		if !strings.Contains(code.String(), "func "+m[1]+"(") {
			t.Errorf("the Performance section quotes %s, which no test file declares", m[1])
		}
	}
}
