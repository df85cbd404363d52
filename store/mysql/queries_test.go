package mysql

import (
	"slices"
	"testing"
)

func TestCompile(t *testing.T) {
	q, err := compile("t", `
		-- a comment with :not_a_param
		SELECT ':quoted', "x:y", `+"`a:b`"+`, 'it''s :x' /* :c */
		FROM t WHERE a = :a AND b = :b # trailing :d
		AND c = :a;
	`)
	if err != nil {
		t.Fatal(err)
	}
	want := "SELECT ':quoted', \"x:y\", `a:b`, 'it''s :x' FROM t WHERE a = ? AND b = ? AND c = ?"
	if q.sql != want {
		t.Fatalf("sql\n got %s\nwant %s", q.sql, want)
	}
	if !slices.Equal(q.params, []string{"a", "b", "a"}) {
		t.Fatalf("params %v", q.params)
	}
	if _, err := q.bind(args{"a": 1}); err == nil {
		t.Fatal("bind without :b succeeded")
	}
	if _, err := compile("bad", "SELECT 'open"); err == nil {
		t.Fatal("unterminated quote accepted")
	}
}

func TestSplitStatements(t *testing.T) {
	got, err := splitStatements("CREATE TABLE a (x VARCHAR(3) DEFAULT ';'); -- c;\n/* ; */ INSERT INTO a VALUES ('\\';');\n;")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"CREATE TABLE a (x VARCHAR(3) DEFAULT ';')", "INSERT INTO a VALUES ('\\';')"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q", got)
	}
}

func TestEveryQueryBinds(t *testing.T) {
	for name, q := range queries {
		if name == "record_columns" {
			continue
		}
		a := args{}
		for _, p := range q.params {
			a[p] = nil
		}
		if _, err := q.bind(a); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
