// Checks of the repository's prose: rules stated once and linked to, the
// core's performance figures in one table that names its sources, and
// links between the README and the guides that lead somewhere.

package controller

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
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

// The section of docs/performance.md that holds a controller's costs is one
// table of current figures: it names the machine (lscpu's model) and the
// commands that produced it, and every benchmark or test a row names
// exists, so that a renamed one is not left quoted with an old figure.
func TestDocsPerformanceIsOneTable(t *testing.T) {
	const file, heading = "docs/performance.md", "## A controller's costs"
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	section := string(b)
	start := strings.Index(section, "\n"+heading+"\n")
	if start < 0 {
		t.Fatalf("%s has no %q section", file, heading)
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

// Every relative link of the README, of the guides in docs/ and of the
// repository's other Markdown leads to a file that exists, and its
// #anchor, if any, to a heading of that file (as GitHub makes anchors),
// so that a section that moves or is renamed takes its links with it.
func TestDocsLinksResolve(t *testing.T) {
	var files []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata"):
			return filepath.SkipDir
		case !d.IsDir() && strings.HasSuffix(path, ".md"):
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	anchors := map[string]map[string]bool{} // by file: its headings' anchors
	anchorsOf := func(file string) (map[string]bool, error) {
		if a, ok := anchors[file]; ok {
			return a, nil
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		a := map[string]bool{}
		for _, line := range proseLines(string(b)) {
			if h, ok := strings.CutPrefix(line, "#"); ok {
				a[headingAnchor(strings.TrimLeft(h, "#"))] = true
			}
		}
		anchors[file] = a
		return a, nil
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range proseLines(string(b)) {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				dest := file
				if path != "" {
					dest = filepath.Join(filepath.Dir(file), path)
				}
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s: link %s: %v", file, target, err)
					continue
				}
				if anchor == "" {
					continue
				}
				a, err := anchorsOf(dest)
				if err != nil {
					t.Errorf("%s: link %s: %v", file, target, err)
				} else if !a[anchor] {
					t.Errorf("%s: link %s: %s has no heading with the anchor #%s", file, target, dest, anchor)
				}
			}
		}
	}
}

// proseLines returns the lines of a Markdown text outside its fenced code
// blocks.
func proseLines(md string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out = append(out, line)
		}
	}
	return out
}

// headingAnchor is the anchor GitHub gives a heading: lower case, spaces
// as hyphens, and every character but letters, digits, hyphens and
// underscores dropped.
func headingAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
