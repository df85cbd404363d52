package cli

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/idem-go/idem"
)

// ietfVectors are the conformance vectors of the IETF Idempotency-Key
// draft (-07); their format is described in their folder's README.md.
//
//go:embed testdata/ietf-07/*.json
var ietfVectors embed.FS

// vector is one requirement of the draft as a sequence of requests.
type vector struct {
	ID          string            `json:"id"`
	Clause      string            `json:"clause"`
	Level       string            `json:"level"`
	Requirement string            `json:"requirement"`
	Differs     map[string]string `json:"differs"`
	Steps       []vectorStep      `json:"steps"`
}

type vectorStep struct {
	Key        string                  `json:"key"`
	Spell      string                  `json:"spell"`
	Raw        []string                `json:"raw"`
	Body       string                  `json:"body"`
	Concurrent int                     `json:"concurrent"`
	Expect     map[string]vectorExpect `json:"expect"`
}

type vectorExpect struct {
	Status   int      `json:"status"`
	Problem  string   `json:"problem"`
	Executes *bool    `json:"executes"`
	SameAs   *int     `json:"same_as"`
	Headers  []string `json:"headers"`
	InFlight bool     `json:"in_flight"`
}

// loadVectors reads every vector, in file and then list order.
func loadVectors() ([]vector, error) {
	names, err := fs.Glob(ietfVectors, "testdata/ietf-07/*.json")
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var all []vector
	for _, name := range names {
		b, err := ietfVectors.ReadFile(name)
		if err != nil {
			return nil, err
		}
		var vs []vector
		if err := json.Unmarshal(b, &vs); err != nil {
			return nil, fmt.Errorf("%s: %w", path.Base(name), err)
		}
		all = append(all, vs...)
	}
	return all, nil
}

// expectFor returns what the step expects under profile.
func (s vectorStep) expectFor(profile idem.Profile) vectorExpect {
	if e, ok := s.Expect[string(profile)]; ok {
		return e
	}
	return s.Expect["*"]
}

// differs returns how idem departs from the vector's clause under profile.
func (v vector) differs(profile idem.Profile) string {
	var notes []string
	for _, k := range []string{"*", string(profile)} {
		if d := v.Differs[k]; d != "" {
			notes = append(notes, d)
		}
	}
	return strings.Join(notes, " ")
}

// executed reports whether an answer is a new execution: answered by the
// API itself, not replayed.
func (a answer) executed() bool {
	return a.err == nil && a.status < 400 && !a.replayed()
}

// runVector runs v and returns its result and how many executions it
// expects of the API.
func (c *checker) runVector(ctx context.Context, v vector) (checkResult, int) {
	keys := map[string]string{}
	key := func(name string) string {
		if keys[name] == "" {
			keys[name] = newKey()
		}
		return keys[name]
	}
	answers := make([]answer, len(v.Steps))
	var executions int
	var notes []string
	for i, s := range v.Steps {
		e := s.expectFor(c.cfg.Profile)
		if e.Executes != nil && *e.Executes {
			executions++
		}
		var fields []string
		switch {
		case s.Raw != nil:
			for _, r := range s.Raw {
				fields = append(fields, strings.NewReplacer("{A}", key("A"), "{B}", key("B")).Replace(r))
			}
		case s.Key != "" && s.Spell == "string":
			fields = []string{quoted(key(s.Key))}
		case s.Key != "" && s.Spell == "token":
			fields = []string{key(s.Key)}
		case s.Key != "":
			fields = c.spell(key(s.Key))
		}
		body := c.cfg.Body
		if s.Body == "alt" {
			if c.cfg.AltBody == nil {
				return skipped("step %d needs a second valid body: give --alt-body", i+1), 0
			}
			body = c.cfg.AltBody
		}
		if s.Concurrent > 1 {
			a, note, res := c.concurrentStep(ctx, s.Concurrent, fields, body)
			if res != nil {
				return *res, executions
			}
			answers[i] = a
			executions++
			notes = append(notes, note)
			continue
		}
		a := c.post(ctx, fields, body, nil)
		answers[i] = a
		if why := checkStep(a, e, answers, c.cfg.Profile); why != "" {
			return failed("step %d: %s", i+1, why), executions
		}
		notes = append(notes, a.String())
	}
	return passed("%s", strings.Join(notes, "; ")), executions
}

// concurrentStep sends n copies at once: exactly one may run, every other
// copy gets its answer replayed or an in-flight refusal with Retry-After.
// It returns the executed copy's answer and a note of what the others got.
func (c *checker) concurrentStep(ctx context.Context, n int, fields []string, body []byte) (answer, string, *checkResult) {
	out := c.burst(ctx, n, fields, body)
	var ran []answer
	for _, a := range out {
		if a.executed() {
			ran = append(ran, a)
		}
	}
	if len(ran) != 1 {
		r := failed("%d of %d copies sent at once ran (answered without Idempotent-Replayed), want exactly 1", len(ran), n)
		return answer{}, "", &r
	}
	var refused, replayed int
	for _, a := range out {
		switch {
		case a.executed():
		case a.inFlight():
			if _, ok := retryAfter(a.header); !ok {
				r := failed("an in-flight answer without Retry-After: %s", a)
				return answer{}, "", &r
			}
			refused++
		case !a.replayed() || !a.same(ran[0]):
			r := failed("a copy got %s, neither the execution's answer (%s) replayed nor an in-flight refusal", a, ran[0])
			return answer{}, "", &r
		default:
			replayed++
		}
	}
	return ran[0], fmt.Sprintf("%d copies at once: one ran (%s), %d got its answer replayed, %d an in-flight refusal with Retry-After",
		n, ran[0], replayed, refused), nil
}

// checkStep compares an answer with what its step expects; it returns why
// it does not match, or "".
func checkStep(a answer, e vectorExpect, earlier []answer, profile idem.Profile) string {
	if a.err != nil {
		return fmt.Sprintf("no answer: %v", a.err)
	}
	if e.Status != 0 && a.status != e.Status {
		return fmt.Sprintf("got %s, want %d", a, e.Status)
	}
	if e.Status == 0 && a.status >= 400 {
		return fmt.Sprintf("got %s, want the API's own answer", a)
	}
	if e.Problem != "" {
		if got := problemName(a.body); got != e.Problem {
			return fmt.Sprintf("got %s, want the problem %s", a, e.Problem)
		}
		if mt := a.header.Get("Content-Type"); profile == idem.ProfileIETF && !strings.HasPrefix(mt, "application/problem+json") {
			return fmt.Sprintf("a problem answered as %q, not application/problem+json", mt)
		}
	}
	if e.Executes != nil && a.executed() != *e.Executes {
		if *e.Executes {
			return fmt.Sprintf("got %s, want a new execution (not a replay)", a)
		}
		if e.Status == 0 {
			return fmt.Sprintf("got %s without Idempotent-Replayed: the request ran again", a)
		}
	}
	if e.SameAs != nil {
		if *e.SameAs < 0 || *e.SameAs >= len(earlier) || !a.same(earlier[*e.SameAs]) {
			return fmt.Sprintf("got %s, want step %d's answer repeated byte for byte", a, *e.SameAs+1)
		}
	}
	for _, h := range e.Headers {
		if a.header.Get(h) == "" {
			return fmt.Sprintf("got %s without %s", a, h)
		}
	}
	return ""
}

// errVectorsFailed reports vectors that failed.
var errVectorsFailed = errors.New("conformance vectors failed")

// runVectors runs every vector against the API and reports each; it returns
// the executions the vectors expect of the API (for a test that counts
// them upstream) and an error naming the vectors that failed.
func runVectors(ctx context.Context, cfg checkConfig, out io.Writer) (int, error) {
	vs, err := loadVectors()
	if err != nil {
		return 0, err
	}
	c, closeChecker := newChecker(cfg)
	defer closeChecker()
	fmt.Fprintf(out, "idem check: %s %s against the Idempotency-Key draft -07 (profile %s)\n\n", cfg.Method, cfg.URL, cfg.Profile)
	counts := map[verdict]int{}
	var failedIDs []string
	var executions int
	for _, v := range vs {
		if err := ctx.Err(); err != nil {
			return executions, err
		}
		r, n := c.runVector(ctx, v)
		executions += n
		counts[r.verdict]++
		if r.verdict == fail {
			failedIDs = append(failedIDs, v.ID)
		}
		fmt.Fprintf(out, "%s  %-20s %s, %s: %s\n      %s\n", r.verdict, v.ID, v.Clause, v.Level, v.Requirement, r.detail)
		if d := v.differs(cfg.Profile); d != "" {
			fmt.Fprintf(out, "      idem differs: %s\n", d)
		}
	}
	fmt.Fprintf(out, "\n%d vectors: %d passed, %d failed, %d skipped\n", len(vs), counts[pass], counts[fail], counts[skip])
	if len(failedIDs) > 0 {
		return executions, fmt.Errorf("%w: %s", errVectorsFailed, strings.Join(failedIDs, ", "))
	}
	return executions, nil
}
