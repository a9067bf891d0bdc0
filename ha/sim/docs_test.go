// The guide docs/testing-replicas.md shows guide_test.go as it is, so
// that its snippet is compiled and run with the package's tests.

package sim_test

import (
	"os"
	"strings"
	"testing"
)

// guidePath is the guide, from this package's directory.
const guidePath = "../../docs/testing-replicas.md"

// The guide's Go snippet is guide_test.go from its imports on, under a
// package clause of a user's test package. Outside the repository's
// checkout (module ha from the module cache), where the guide is not,
// it is skipped.
func TestGuideSnippetIsGuideTest(t *testing.T) {
	if _, err := os.Stat("../../go.mod"); err != nil {
		t.Skip("not in the repository's checkout, which holds the guide:", err)
	}
	guide, err := os.ReadFile(guidePath)
	if err != nil {
		t.Fatal(err)
	}
	_, snippet, ok := strings.Cut(string(guide), "```go\n")
	snippet, _, closed := strings.Cut(snippet, "```\n")
	if !ok || !closed {
		t.Fatalf("%s has no ```go block", guidePath)
	}
	source, err := os.ReadFile("guide_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, imports, _ := strings.Cut(string(source), "\nimport (")
	if want := "package myservice_test\n\nimport (" + imports; snippet != want {
		t.Errorf("the snippet of %s differs from guide_test.go; write guide_test.go's text from its imports on into the guide", guidePath)
	}
}
