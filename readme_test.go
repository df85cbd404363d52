package idem_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// The README's snippets of the phase and maintenance packages are excerpts
// of their compiled examples, so that they cannot drift from the API.
func TestReadmeSnippetsAreExamples(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	for marker, example := range map[string]string{
		"phase.Run(":       "internal/integration/phase/example_test.go",
		"maintenance.New(": "maintenance/example_test.go",
	} {
		src, err := os.ReadFile(example)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, b := range blocks {
			if !strings.Contains(b[1], marker) {
				continue
			}
			found = true
			// The README's snippet is not indented; the example's lines are,
			// once or more.
			excerpt := false
			for indent := "\n\t"; len(indent) < 5; indent += "\t" {
				excerpt = excerpt || strings.Contains(strings.ReplaceAll(string(src), indent, "\n"), "\n"+b[1])
			}
			if !excerpt {
				t.Errorf("README's snippet with %s is not an excerpt of %s:\n%s", marker, example, b[1])
			}
		}
		if !found {
			t.Errorf("README has no snippet with %s", marker)
		}
	}
}
