package payments

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"syscall"
	"time"
)

// providerClient calls the card provider.
type providerClient struct {
	base    string
	http    *http.Client
	timeout time.Duration
}

// ProviderError is an answer of the provider that refuses a call: the
// provider said what happened, so the caller knows.
type ProviderError struct {
	Status  int
	Code    string
	Message string
}

func (e *ProviderError) Error() string {
	return fmt.Sprintf("provider: %d %s: %s", e.Status, e.Code, e.Message)
}

// errNoAnswer marks a call that was sent but never answered (a timeout, a
// connection cut): the provider may or may not have acted on it.
var errNoAnswer = errors.New("provider did not answer")

// errNotSent marks a call that certainly never reached the provider
// (connection refused).
var errNotSent = errors.New("provider unreachable; the call was not sent")

func (c *providerClient) charge(ctx context.Context, key string, fence int64, req chargeRequest) (providerObject, error) {
	return c.post(ctx, "/v1/charges", key, fence, req)
}

func (c *providerClient) refund(ctx context.Context, key string, fence int64, req refundRequest) (providerObject, error) {
	return c.post(ctx, "/v1/refunds", key, fence, req)
}

// find asks for the object of kind ("charges" or "refunds") made with key;
// found is false when the provider has none.
func (c *providerClient) find(ctx context.Context, kind, key string) (obj providerObject, found bool, err error) {
	u := c.base + "/v1/" + kind + "?" + url.Values{"idempotency_key": {key}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return obj, false, err
	}
	obj, err = c.do(req)
	var pe *ProviderError
	if errors.As(err, &pe) && pe.Status == http.StatusNotFound {
		return obj, false, nil
	}
	return obj, err == nil, err
}

// post sends a mutating call with the idempotency key and the fence.
func (c *providerClient) post(ctx context.Context, path, key string, fence int64, body any) (providerObject, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return providerObject{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(b))
	if err != nil {
		return providerObject{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Idempotency-Fence", strconv.FormatInt(fence, 10))
	return c.do(req)
}

func (c *providerClient) do(req *http.Request) (providerObject, error) {
	ctx, cancel := context.WithTimeout(req.Context(), c.timeout)
	defer cancel()
	resp, err := c.http.Do(req.WithContext(ctx))
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return providerObject{}, fmt.Errorf("%w: %w", errNotSent, err)
		}
		return providerObject{}, fmt.Errorf("%w: %w", errNoAnswer, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return providerObject{}, fmt.Errorf("%w: reading the answer: %w", errNoAnswer, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct{ Code, Message string }
		}
		_ = json.Unmarshal(b, &e) // a body that is not ours still has a status
		return providerObject{}, &ProviderError{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message}
	}
	var obj providerObject
	if err := json.Unmarshal(b, &obj); err != nil || obj.ID == "" {
		return providerObject{}, fmt.Errorf("%w: unreadable answer %q", errNoAnswer, b)
	}
	return obj, nil
}
