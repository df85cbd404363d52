package idem_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// docPages returns README.md and every page under docs/, by path.
func docPages(t *testing.T) map[string]string {
	t.Helper()
	paths, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages := map[string]string{}
	for _, p := range append(paths, "README.md") {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		pages[p] = string(b)
	}
	return pages
}

// exampleFiles returns the text of every example_test.go of every module
// of the repository, with its lines' leading tabs removed, so that a
// snippet written without indentation matches a function body.
func exampleFiles(t *testing.T) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && strings.HasPrefix(d.Name(), ".") && path != "." {
			return filepath.SkipDir
		}
		if d.Name() != "example_test.go" {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files[path] = dedent(string(b))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// dedent removes the leading tabs of every line; the relative indentation
// of a snippet is lost, which the excerpt check tolerates: the compiler
// checked the example, the test checks that the snippet says the same.
func dedent(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimLeft(l, "\t")
	}
	return strings.Join(lines, "\n")
}

// Every Go snippet of the README and of docs/ is an excerpt of a compiled
// Example function (an example_test.go somewhere in the repository), so
// that no snippet can drift from the API.
func TestDocSnippetsAreExamples(t *testing.T) {
	examples := exampleFiles(t)
	block := regexp.MustCompile("(?s)```go\n(.*?)```")
	n := 0
	for page, text := range docPages(t) {
		for _, b := range block.FindAllStringSubmatch(text, -1) {
			n++
			snippet := dedent(b[1])
			found := false
			for _, src := range examples {
				if strings.Contains(src, "\n"+snippet) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s: this Go snippet is not an excerpt of any example_test.go:\n%s", page, b[1])
			}
		}
	}
	if n < 10 {
		t.Errorf("only %d Go snippets found in README.md and docs/", n)
	}
}

// anchor is the fragment GitHub gives a heading: lower case, punctuation
// dropped but for hyphens and underscores, spaces made hyphens.
func anchor(heading string) string {
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

// Every page under docs/ opens with a contents list that names each of its
// sections (## and ###) in order, with the anchor GitHub gives it, so a
// reader finds a section and a link to one does not break silently.
func TestDocPagesHaveContents(t *testing.T) {
	heading := regexp.MustCompile(`^(##|###) (.*)$`)
	for page, text := range docPages(t) {
		if page == "README.md" {
			continue
		}
		var want []string
		fence := false
		for _, l := range strings.Split(text, "\n") {
			if strings.HasPrefix(l, "```") {
				fence = !fence
				continue
			}
			if m := heading.FindStringSubmatch(l); m != nil && !fence {
				indent := ""
				if m[1] == "###" {
					indent = "  "
				}
				want = append(want, indent+"- ["+m[2]+"](#"+anchor(m[2])+")")
			}
		}
		_, rest, ok := strings.Cut(text, "\nContents\n")
		if !ok {
			t.Errorf("%s has no contents list", page)
			continue
		}
		got := strings.Split(rest, "\n")
		if len(got) < len(want) {
			got = append(got, make([]string, len(want)-len(got))...)
		}
		for i, w := range want {
			if got[i] != w {
				t.Errorf("%s: contents line %d is %q, want %q", page, i+1, got[i], w)
				break
			}
		}
		if len(got) > len(want) && strings.HasPrefix(strings.TrimSpace(got[len(want)]), "- [") {
			t.Errorf("%s: the contents list names a section the page does not have: %q", page, got[len(want)])
		}
	}
}

// The README links every page under docs/ (its table of pages, or the text).
func TestReadmeListsEveryPage(t *testing.T) {
	pages := docPages(t)
	for page := range pages {
		if page != "README.md" && !strings.Contains(pages["README.md"], "]("+filepath.ToSlash(page)+")") {
			t.Errorf("README.md does not link %s", page)
		}
	}
}

// Links between the pages (README.md, docs/*.md, BENCHMARKS.md) name files
// that exist and sections those files have.
func TestDocLinks(t *testing.T) {
	pages := docPages(t)
	if b, err := os.ReadFile("BENCHMARKS.md"); err == nil {
		pages["BENCHMARKS.md"] = string(b)
	} else {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{}
	heading := regexp.MustCompile(`(?m)^#{1,4} (.*)$`)
	for page, text := range pages {
		anchors[page] = map[string]bool{}
		for _, m := range heading.FindAllStringSubmatch(text, -1) {
			anchors[page][anchor(m[1])] = true
		}
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	for page, text := range pages {
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Clean(filepath.Join(filepath.Dir(page), file))
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s links to %s, which does not exist", page, target)
					continue
				}
			}
			if frag == "" || anchors[path] == nil {
				continue
			}
			if !anchors[path][frag] {
				t.Errorf("%s links to %s: %s has no such section", page, target, path)
			}
		}
	}
}

// .ci/run runs exactly the README's test command, with -race, and make test
// and make race are the same command.
func TestCIRunsTheReadmeTestCommand(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, quick, _ := strings.Cut(string(readme), "## Quick start\n\n```sh\n")
	quick, _, _ = strings.Cut(quick, "```")
	lines := strings.Split(strings.TrimSpace(quick), "\n")
	if len(lines) != 2 {
		t.Fatalf("the quick start has %d commands, want 2 (the proxy, the tests):\n%s", len(lines), quick)
	}
	test, _, _ := strings.Cut(lines[1], "#")
	test = strings.TrimSpace(test)
	args, ok := strings.CutPrefix(test, "go test ")
	if !ok {
		t.Fatalf("the quick start's test command %q is not go test", test)
	}
	ci, err := os.ReadFile(".ci/run")
	if err != nil {
		t.Fatal(err)
	}
	if want := "\ngo test -race " + args + " "; !strings.Contains(string(ci), want) {
		t.Errorf(".ci/run does not run %q", strings.TrimSpace(want))
	}
	// make test runs it as is (TESTFLAGS empty), make race with -race; make
	// doubles a shell's $.
	mk, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if want := " go test $(TESTFLAGS) " + strings.ReplaceAll(args, "$", "$$") + " "; !strings.Contains(string(mk), want) {
		t.Errorf("make test does not run %q", want)
	}
	if !strings.Contains(string(mk), "\nrace:\n\t@$(MAKE) --no-print-directory test TESTFLAGS=-race\n") {
		t.Error("make race does not run make test with -race")
	}
}
