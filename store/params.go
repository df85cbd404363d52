package store

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Every parameter type of the contract checks itself: stores call Validate
// first, before touching their database, so a request breaking the contract
// gets ErrInvalidParams (or ErrTooLong) from every store alike, never a
// driver error.

// MaxFingerprintBytes bounds a request's fingerprint (the engine's is a
// short digest).
const MaxFingerprintBytes = 512

func invalid(msg string) error { return errors.Join(ErrInvalidParams, errors.New(msg)) }

// Validate checks the parameters every store must refuse.
func (p *ReserveParams) Validate() error {
	if err := CheckID(p.Scope, p.Key); err != nil {
		return err
	}
	switch {
	case p.Fingerprint == "":
		return invalid("fingerprint is required")
	case len(p.Fingerprint) > MaxFingerprintBytes:
		return errors.Join(ErrTooLong, fmt.Errorf("fingerprint of %d bytes, the limit is %d", len(p.Fingerprint), MaxFingerprintBytes))
	case p.Lease <= 0 || p.TTL <= 0:
		return invalid("lease and ttl must be positive")
	case !p.LeasePolicy.Valid():
		return invalid("unknown lease policy " + string(p.LeasePolicy))
	case p.MaxActive < 0:
		return invalid("max active must not be negative")
	case len(p.Tenant) > MaxScopeBytes:
		return errors.Join(ErrTooLong, fmt.Errorf("tenant of %d bytes, the limit is %d", len(p.Tenant), MaxScopeBytes))
	case !utf8.ValidString(p.Tenant) || strings.IndexByte(p.Tenant, 0) >= 0:
		return invalid("tenant is not valid UTF-8 without NUL")
	}
	return nil
}

// Validate checks the record's identity and that the fence is one a store
// could have issued (positive).
func (p *FenceParams) Validate() error {
	if err := CheckID(p.Scope, p.Key); err != nil {
		return err
	}
	if p.Fence <= 0 {
		return invalid("fence must be positive")
	}
	return nil
}

// Validate checks a stored response: a status a client can receive.
func (r *Response) Validate() error {
	if r.Status < 100 || r.Status > 999 {
		return invalid(fmt.Sprintf("response status %d out of range", r.Status))
	}
	return nil
}

// Validate checks a completion.
func (p *CompleteParams) Validate() error {
	if err := p.FenceParams.Validate(); err != nil {
		return err
	}
	if p.TTL < 0 {
		return invalid("ttl must not be negative")
	}
	return p.Response.Validate()
}

// Validate checks a release or a MarkUnknown.
func (p *ReleaseParams) Validate() error {
	if err := p.FenceParams.Validate(); err != nil {
		return err
	}
	if r := p.Request; r != nil {
		if r.Queue != "" {
			return invalid("a request summary names no queue: no worker may claim it")
		}
		return r.check(MaxRequestSummaryBytes)
	}
	return nil
}

// Validate checks a checkpoint.
func (p *CheckpointParams) Validate() error { return p.FenceParams.Validate() }

// Validate checks a lease renewal.
func (p *ExtendParams) Validate() error {
	if err := p.FenceParams.Validate(); err != nil {
		return err
	}
	if p.Lease <= 0 {
		return invalid("lease must be positive")
	}
	return nil
}

func checkLimit(limit int) error {
	if limit <= 0 {
		return invalid("limit must be positive")
	}
	return nil
}

// Validate checks a sweep.
func (p *SweepParams) Validate() error {
	if err := checkLimit(p.Limit); err != nil {
		return err
	}
	if p.Grace < 0 {
		return invalid("grace must not be negative")
	}
	return nil
}

// Validate checks a reap.
func (p *ReapParams) Validate() error {
	if err := checkLimit(p.Limit); err != nil {
		return err
	}
	if p.AbandonedTTL < 0 {
		return invalid("abandoned ttl must not be negative")
	}
	if p.Grace < 0 {
		return invalid("grace must not be negative")
	}
	return p.Abandoned.Validate()
}

// Validate checks a listing.
func (p *ListUnknownParams) Validate() error { return checkLimit(p.Limit) }

// Validate checks a resolution.
func (p *ResolveParams) Validate() error {
	if err := p.FenceParams.Validate(); err != nil {
		return err
	}
	switch {
	case p.To == StateCompleted && p.Response == nil:
		return invalid("resolving to completed needs a response")
	case p.To != StateCompleted && p.To != StateFailedRetryable:
		return invalid("resolve target must be completed or failed_retryable")
	case p.TTL < 0:
		return invalid("ttl must not be negative")
	case p.To == StateCompleted:
		return p.Response.Validate()
	}
	return nil
}

// Validate checks a deferral.
func (p *DeferParams) Validate() error {
	if err := p.FenceParams.Validate(); err != nil {
		return err
	}
	switch {
	case p.Attempts < 0:
		return invalid("attempts must not be negative")
	case p.Delay < 0:
		return invalid("delay must not be negative")
	}
	return nil
}

// Validate checks a delete: the record's identity, and a fence that is
// either one a store could have issued or zero (any execution).
func (p *DeleteParams) Validate() error {
	if err := CheckID(p.Scope, p.Key); err != nil {
		return err
	}
	if p.Fence < 0 {
		return invalid("fence must not be negative")
	}
	return nil
}

// MaxErrorBytes bounds the text ErrorText keeps for a record's LastError.
const MaxErrorBytes = 1024

// ErrorText makes s storable as a record's LastError by every store
// (ReleaseParams.Error, DeferParams.Error): valid UTF-8 without NUL (text
// columns of SQL databases refuse the others), at most MaxErrorBytes,
// cut at a character. Callers pass what they did not write themselves
// through it: a handler's reason, a resolver's error.
func ErrorText(s string) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
	if len(s) <= MaxErrorBytes {
		return s
	}
	cut := MaxErrorBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// Resolution is the finest time every store keeps: times and durations are
// stored in whole microseconds, durations rounded up (storekit.Micros).
const Resolution = time.Microsecond

// CheckActiveLimit checks the limit of ActiveCounter.CountActive.
func CheckActiveLimit(limit int) error { return checkLimit(limit) }
