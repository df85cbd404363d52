package store_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/idem-go/idem/store"
)

func TestIsRetryable(t *testing.T) {
	driver := errors.New("connection reset by peer")
	wrapped := fmt.Errorf("idem/x: reserve: %w", store.Retryable(driver))
	if !store.IsRetryable(wrapped) || !errors.Is(wrapped, driver) {
		t.Fatalf("a wrapped retryable error: IsRetryable %v, reaches the driver error %v",
			store.IsRetryable(wrapped), errors.Is(wrapped, driver))
	}
	var re *store.RetryableError
	if !errors.As(wrapped, &re) || re.Err != driver {
		t.Fatalf("errors.As: %v", re)
	}
	if store.Retryable(nil) != nil {
		t.Fatal("Retryable(nil) is not nil")
	}
	for _, err := range []error{
		nil,
		driver, // not marked by a store
		io.EOF,
		store.ErrLeaseLost, store.ErrNotFound, store.ErrStateConflict, store.ErrInvalidParams, store.ErrTooLong,
		// Definite answers and the caller's own end stay final even if
		// something marked them.
		store.Retryable(store.ErrLeaseLost),
		fmt.Errorf("x: %w", store.Retryable(fmt.Errorf("y: %w", store.ErrNotFound))),
		store.Retryable(context.Canceled),
		store.Retryable(fmt.Errorf("read: %w", context.DeadlineExceeded)),
	} {
		if store.IsRetryable(err) {
			t.Errorf("IsRetryable(%v) = true", err)
		}
	}
}
