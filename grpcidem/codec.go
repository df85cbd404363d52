package grpcidem

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/idem-go/idem/store"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The stored form of a gRPC answer, as a store.Response:
//
//	answer     Status                      Content-Type       Body
//	response   200                         AnyContentType     google.protobuf.Any holding the message
//	error      HTTP equivalent of its code StatusContentType  google.rpc.Status: code, message, details
//
// The body decides: Status is informational, for operators reading the
// record (`idem inspect` shows 404 for a stored NotFound), and several codes
// share a status (InvalidArgument, FailedPrecondition and OutOfRange are all
// 400). The Any keeps the message's type name, so a replay rebuilds the
// right message type from the types linked into the server.
const (
	AnyContentType    = "application/x-protobuf; messageType=google.protobuf.Any"
	StatusContentType = "application/x-protobuf; messageType=google.rpc.Status"
)

// Encode returns the stored form of a handler's answer: resp when err is
// nil, else the gRPC status of err (status.Convert: a plain Go error becomes
// Unknown). A Resolver settling a gRPC record that happened returns this as
// its Response.
func Encode(resp proto.Message, err error) (store.Response, error) {
	if err != nil {
		st := status.Convert(err)
		if st.Code() == codes.OK {
			return store.Response{}, errors.New("grpcidem: an error with code OK is not an error answer")
		}
		body, merr := deterministic.Marshal(st.Proto())
		if merr != nil {
			return store.Response{}, fmt.Errorf("grpcidem: encode status: %w", merr)
		}
		return store.Response{
			Status: httpStatus(st.Code()),
			Header: http.Header{"Content-Type": {StatusContentType}},
			Body:   body,
		}, nil
	}
	if resp == nil {
		return store.Response{}, errors.New("grpcidem: no response message to store")
	}
	a := new(anypb.Any)
	if merr := anypb.MarshalFrom(a, resp, deterministic); merr != nil {
		return store.Response{}, fmt.Errorf("grpcidem: encode response: %w", merr)
	}
	body, merr := deterministic.Marshal(a)
	if merr != nil {
		return store.Response{}, fmt.Errorf("grpcidem: encode response: %w", merr)
	}
	return store.Response{
		Status: http.StatusOK,
		Header: http.Header{"Content-Type": {AnyContentType}},
		Body:   body,
	}, nil
}

// Decode rebuilds the answer stored by Encode: the response message, or the
// stored error (status.FromError recovers its code, message and details).
// An answer that cannot be rebuilt is reported as an error too, as the
// client should see it:
//
//   - a body not kept (larger than Config.MaxResponseBytes):
//     FailedPrecondition with ReasonResponseNotKept;
//   - a record this package did not write, such as one the maintainer closed
//     as abandoned with an HTTP timeout answer: the gRPC equivalent of its
//     HTTP status (504 is DeadlineExceeded) with ReasonForeignResponse;
//   - a message type not linked into this server: Internal.
func Decode(r store.Response) (proto.Message, error) {
	ct := r.Header.Get("Content-Type")
	switch {
	case r.BodyOmitted:
		return nil, refusal(codes.FailedPrecondition, ReasonResponseNotKept,
			"idempotency: the call with this key was executed, but its answer was too large to keep for replay", 0)
	case ct == AnyContentType:
		a := new(anypb.Any)
		if err := proto.Unmarshal(r.Body, a); err != nil {
			return nil, status.Errorf(codes.Internal, "idempotency: the stored response is corrupt: %v", err)
		}
		msg, err := a.UnmarshalNew()
		if err != nil {
			return nil, status.Errorf(codes.Internal, "idempotency: cannot rebuild the stored response %s: %v", a.GetTypeUrl(), err)
		}
		return msg, nil
	case ct == StatusContentType:
		sp := new(spb.Status)
		if err := proto.Unmarshal(r.Body, sp); err != nil {
			return nil, status.Errorf(codes.Internal, "idempotency: the stored error is corrupt: %v", err)
		}
		if codes.Code(sp.GetCode()) == codes.OK {
			return nil, status.Error(codes.Internal, "idempotency: the stored error has code OK")
		}
		return nil, status.FromProto(sp).Err()
	}
	st := status.New(codeFromHTTP(r.Status), fmt.Sprintf(
		"idempotency: the outcome of the call with this key was settled outside gRPC (HTTP status %d, %s)", r.Status, ct))
	if d, err := st.WithDetails(&errdetails.ErrorInfo{
		Reason: ReasonForeignResponse, Domain: ErrorDomain,
		Metadata: map[string]string{"http_status": strconv.Itoa(r.Status)},
	}); err == nil {
		st = d
	}
	return nil, st.Err()
}

// ErrorDomain is the ErrorInfo domain of the interceptor's own errors.
const ErrorDomain = "github.com/idem-go/idem"

// ErrorInfo reasons of the interceptor's own errors, stable for clients to
// match on.
const (
	// ReasonKeyMissing: a Required method was called without a key
	// (InvalidArgument).
	ReasonKeyMissing = "IDEMPOTENCY_KEY_MISSING"
	// ReasonKeyMalformed: the key is empty, longer than 255 characters, or
	// neither an sf-string nor a bare token (InvalidArgument).
	ReasonKeyMalformed = "IDEMPOTENCY_KEY_MALFORMED"
	// ReasonKeyRepeated: the key metadata was given more than once
	// (InvalidArgument).
	ReasonKeyRepeated = "IDEMPOTENCY_KEY_REPEATED"
	// ReasonKeyReused: the key was used before with a different request
	// (Config.KeyReusedCode).
	ReasonKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// ReasonInProgress: the first call with the key is still running
	// (Aborted, with RetryInfo).
	ReasonInProgress = "IDEMPOTENCY_IN_PROGRESS"
	// ReasonOutcomeUnknown: the first call may or may not have taken effect;
	// retries are refused until reconciliation settles it (Aborted, with
	// RetryInfo).
	ReasonOutcomeUnknown = "IDEMPOTENCY_OUTCOME_UNKNOWN"
	// ReasonStoreUnavailable: the idempotency store failed before the
	// handler ran, which did not run (Unavailable, with RetryInfo).
	ReasonStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
	// ReasonTenantLimited: the caller's tenant is over its rate of new keys
	// or its cap of calls in progress (idem.Config.TenantRate,
	// TenantMaxActive); nothing was reserved and the handler did not run
	// (ResourceExhausted, with RetryInfo).
	ReasonTenantLimited = "IDEMPOTENCY_TENANT_LIMITED"
	// ReasonNewKeysLimited: the server is over its own rate of new keys,
	// whatever the tenant (idem.Config.NewKeyRate); nothing was reserved
	// and the handler did not run (ResourceExhausted, with RetryInfo).
	ReasonNewKeysLimited = "IDEMPOTENCY_NEW_KEYS_LIMITED"
	// ReasonOverCapacity: the store holds idem.Config.StoreMaxActive calls
	// in progress; nothing was reserved and the handler did not run
	// (Unavailable: the service is full, not the caller at fault; with
	// RetryInfo).
	ReasonOverCapacity = "IDEMPOTENCY_OVER_CAPACITY"
	// ReasonScopeInvalid: the tenant and method name cannot name a record:
	// too long, or not valid UTF-8 (InvalidArgument).
	ReasonScopeInvalid = "IDEMPOTENCY_SCOPE_INVALID"
	// ReasonResponseNotKept: the call was executed but its answer was too
	// large to keep (FailedPrecondition).
	ReasonResponseNotKept = "IDEMPOTENCY_RESPONSE_NOT_KEPT"
	// ReasonForeignResponse: the record was settled with an answer that is
	// not a gRPC one, such as the maintainer's answer for an abandoned call.
	ReasonForeignResponse = "IDEMPOTENCY_FOREIGN_RESPONSE"
	// ReasonStreamNotProtected: a streaming call to a method listed in
	// Config.Required, or one that carries a key, which an idempotency key
	// cannot protect; the handler did not run (Unimplemented).
	ReasonStreamNotProtected = "IDEMPOTENCY_STREAM_NOT_PROTECTED"
)

// refusal builds one of the interceptor's own errors, with a RetryInfo when
// retryAfter is positive.
func refusal(code codes.Code, reason, msg string, retryAfter time.Duration) error {
	st := status.New(code, msg)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}}
	if retryAfter > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retryAfter)})
	}
	if d, err := st.WithDetails(details...); err == nil {
		st = d
	}
	return st.Err()
}

// httpStatus is the usual HTTP equivalent of a gRPC code (as gRPC-gateway
// maps them), for the informational Status of a stored error.
func httpStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.Canceled:
		return 499
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError // Unknown, Internal, DataLoss
}

// codeFromHTTP maps an HTTP status back to the closest gRPC code, for
// answers stored by something other than this package.
func codeFromHTTP(s int) codes.Code {
	switch s {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return codes.InvalidArgument
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.NotFound
	case http.StatusConflict:
		return codes.Aborted
	case http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case 499:
		return codes.Canceled
	case http.StatusNotImplemented:
		return codes.Unimplemented
	case http.StatusServiceUnavailable:
		return codes.Unavailable
	case http.StatusGatewayTimeout:
		return codes.DeadlineExceeded
	}
	return codes.Unknown
}
