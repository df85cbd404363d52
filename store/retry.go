package store

import (
	"context"
	"errors"
)

// RetryableError marks a store failure that says nothing about the record:
// the connection broke, the server is restarting, a transaction lost a
// deadlock or a serialization check, a lock was busy. The operation may or
// may not have been applied (a write whose connection broke after the
// server committed it has been), so only an operation that is safe to run
// twice should be retried blindly; every transition of the contract is, as
// it is guarded by state and fence: a Complete run again after a lost
// answer fails with ErrLeaseLost only if another holder moved the record.
//
// Each store's error wrapper wraps its driver's transient errors in a
// RetryableError; errors.Is and errors.As still reach the driver's error
// through Unwrap.
type RetryableError struct {
	Err error
}

func (e *RetryableError) Error() string { return e.Err.Error() }

// Unwrap returns the driver's error.
func (e *RetryableError) Unwrap() error { return e.Err }

// Retryable wraps err in a RetryableError; nil stays nil.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return &RetryableError{Err: err}
}

// IsRetryable reports whether err is a transient store failure after which
// the same operation may succeed. Definite answers of the contract
// (ErrLeaseLost, ErrNotFound, ErrStateConflict, ErrInvalidParams) and the
// caller's own cancellation or deadline are never retryable, whatever wraps
// them.
func IsRetryable(err error) bool {
	switch {
	case err == nil,
		errors.Is(err, ErrLeaseLost), errors.Is(err, ErrNotFound),
		errors.Is(err, ErrStateConflict), errors.Is(err, ErrInvalidParams),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	}
	var r *RetryableError
	return errors.As(err, &r)
}
