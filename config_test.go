package idem_test

import (
	"testing"

	"github.com/idem-go/idem"
)

// WithDefaults is what New applies: a front end that reads settings
// before it builds an engine relies on it.
func TestConfigWithDefaults(t *testing.T) {
	t.Parallel()
	c, err := idem.Config{KeyHeader: "x-request-key"}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.KeyHeader != "X-Request-Key" || c.MaxBodyBytes != idem.DefaultMaxBodyBytes ||
		c.MaxResponseBytes != idem.DefaultMaxResponseBytes || c.RetryAfter != idem.DefaultRetryAfter ||
		c.TTL != idem.DefaultTTL || c.InProgressStatus != idem.DefaultInProgressStatus {
		t.Errorf("WithDefaults = KeyHeader %q MaxBodyBytes %d MaxResponseBytes %d RetryAfter %v TTL %v InProgressStatus %d",
			c.KeyHeader, c.MaxBodyBytes, c.MaxResponseBytes, c.RetryAfter, c.TTL, c.InProgressStatus)
	}
	if _, err := (idem.Config{KeyHeader: "bad header"}).WithDefaults(); err == nil {
		t.Error("an invalid KeyHeader passed")
	}
}
