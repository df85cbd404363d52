package plural

import "testing"

func TestCount(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{{0, "0 keys"}, {1, "1 key"}, {2, "2 keys"}, {-1, "-1 keys"}} {
		if got := Count(c.n, "key", "keys"); got != c.want {
			t.Errorf("Count(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}
