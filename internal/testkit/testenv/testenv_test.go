package testenv_test

import (
	"testing"

	"github.com/idem-go/idem/internal/testkit/testenv"
)

func TestParseRedisAddr(t *testing.T) {
	for in, want := range map[string]struct {
		addr string
		db   int
	}{
		"127.0.0.1:6379":   {"127.0.0.1:6379", 0},
		"127.0.0.1:6379/3": {"127.0.0.1:6379", 3},
		"[::1]:6380/15":    {"[::1]:6380", 15},
		"localhost:6379/0": {"localhost:6379", 0},
	} {
		addr, db, err := testenv.ParseRedisAddr(in)
		if err != nil || addr != want.addr || db != want.db {
			t.Errorf("ParseRedisAddr(%q) = %q, %d, %v; want %q, %d", in, addr, db, err, want.addr, want.db)
		}
	}
	for _, in := range []string{"127.0.0.1", "127.0.0.1:6379/", "127.0.0.1:6379/x", "127.0.0.1:6379/-1", "redis://127.0.0.1:6379/3"} {
		if _, _, err := testenv.ParseRedisAddr(in); err == nil {
			t.Errorf("ParseRedisAddr(%q): no error", in)
		}
	}
}

func TestRedisURL(t *testing.T) {
	t.Setenv(testenv.RedisEnv, "127.0.0.1:6379/3")
	if got := testenv.RedisURL(t); got != "redis://127.0.0.1:6379/3" {
		t.Errorf("RedisURL = %q", got)
	}
	if testenv.RedisAddr(t) != "127.0.0.1:6379" || testenv.RedisDB(t) != 3 {
		t.Errorf("RedisAddr, RedisDB = %q, %d", testenv.RedisAddr(t), testenv.RedisDB(t))
	}
	t.Setenv(testenv.RedisEnv, "127.0.0.1:6379")
	if got := testenv.RedisURL(t); got != "redis://127.0.0.1:6379/0" {
		t.Errorf("RedisURL = %q", got)
	}
}
