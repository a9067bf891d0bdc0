// Checks of the repository's prose: rules stated once and linked to.

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
