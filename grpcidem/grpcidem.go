// Package grpcidem gives gRPC unary methods the idempotency contract of the
// idem HTTP middleware: a client attaches an idempotency-key to a call, and
// every retry of the same call produces its effect once and gets the
// original answer back, across concurrent duplicates, crashes and many
// server instances sharing one store. Streaming methods cannot be
// protected: a streaming call that expects the protection is refused (see
// Streaming methods below).
//
// # Using the interceptor
//
// Create one idem.Engine over a store and install the two interceptors,
// for unary and for streaming calls, with ServerOptions:
//
//	engine, _ := idem.New(st, idem.Config{})
//	cfg := grpcidem.Config{
//		Required: []string{"/payments.v1.Payments/Charge"},
//		Tenant:   func(ctx context.Context) string { return accountFromAuth(ctx) },
//	}
//	srv := grpc.NewServer(grpcidem.ServerOptions(engine, cfg)...)
//
// A server with interceptors of its own puts grpcidem's inside them, after
// recovery and authentication:
//
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(
//			recovery, // yours: grpcidem re-panics after recording the panic
//			auth,
//			grpcidem.UnaryServerInterceptor(engine, cfg),
//		),
//		grpc.ChainStreamInterceptor(streamAuth, grpcidem.StreamServerInterceptor(engine, cfg)),
//	)
//
// Without the streaming interceptor, a streaming method listed in Required,
// or a streaming call with a key, runs unprotected and nobody is told.
//
// A client sends the key as request metadata:
//
//	ctx = metadata.AppendToOutgoingContext(ctx, "idempotency-key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
//
// The key follows the rules of the HTTP header: an RFC 8941 sf-string such
// as "abc" (quotes included) or a bare token of visible ASCII such as abc,
// which are the same key; at most 255 characters; given once.
//
// # What a client sees
//
//   - The first call with a key runs the handler. Its answer (the response
//     message, or an error whose code is a final answer) is stored and
//     replayed to every retry of the same call, with the header metadata
//     idempotent-replayed: true. Header and trailer metadata the handler set
//     are not stored.
//   - A call to a Required method without a key, with a malformed key or with
//     the key given twice: InvalidArgument. A call to another method without
//     a key passes through untouched; with a key it is protected too.
//   - The same key with a different request message: FailedPrecondition
//     (Config.KeyReusedCode). The same key sent to another method is another
//     record (see Scope and fingerprint below).
//   - The same key while the first call is still running: Aborted with a
//     RetryInfo (or, with Config.Wait, the call waits for the first one and
//     gets its answer).
//   - The same key after an outcome that may or may not have happened (a
//     panic, an Uncertain call, a server that died): Aborted with a distinct
//     reason, until reconciliation settles the record.
//   - The store cannot be reached: Unavailable with a RetryInfo, and the
//     handler does not run (fail closed).
//   - A streaming call to a Required method, with a key or without:
//     Unimplemented with ReasonStreamNotProtected, and the handler does not
//     run. A streaming call to another method with a key: the same, unless
//     Config.PassKeyedStreams lets it run unprotected. Without a key: passes
//     through untouched.
//
// Every refusal of the interceptor's own carries an errdetails.ErrorInfo
// with Domain ErrorDomain and one of the Reason constants, so a client can
// tell a reused key (ReasonKeyReused) from the handler's own
// FailedPrecondition.
//
// # Scope and fingerprint
//
// A record is identified by the tenant (Config.Tenant, from the call's
// authentication, never from the message), the pseudo-method "GRPC", the
// full method name and the key. The fingerprint is the request message
// marshalled deterministically (proto.MarshalOptions{Deterministic: true}):
// the server re-encodes the message it decoded, so a retry that sends the
// same fields matches even if the client's encoder ordered them differently.
// Deterministic output is stable within one build of the server; servers
// built with different protobuf versions could, rarely, take a retry for a
// different request: a false mismatch, the safe direction.
//
// # Streaming methods
//
// An idempotency key cannot protect a stream: its answer is a sequence of
// messages sent while it runs, which cannot be stored before the client
// sees them nor replayed as one answer, and its request is not one message
// whose fingerprint could tell a retry from another request. Running such
// a call as if it were protected would deceive the client that sent a key
// and the operator who listed the method, so StreamServerInterceptor
// refuses it. The code is Unimplemented, as for a feature the server does
// not offer: the call cannot succeed as sent, however often it is retried.
// Its ErrorInfo tells it from a method the server does not have. The
// server logs a warning at each call to a streaming method listed in
// Required: only its operator can mend it.
//
// A client that attaches a key to every call, streams included, is served
// by Config.PassKeyedStreams: its keyed streams run unprotected, the key
// ignored whatever its form, as on an HTTP GET.
//
// # Which errors are final
//
// As in the HTTP response policy, a definite answer is stored and replayed
// and a transient failure releases the key so that a retry runs again; see
// DefaultClassify and Config.Classify. A handler whose effect may have
// happened without its knowing (a downstream call timed out) must call
// idem.FromContext(ctx).Uncertain: the record then goes to reconciliation
// whatever it returns.
//
// # Transactions
//
// A handler on a SQL store can commit its business write and the record's
// completion in one transaction: encode its answer with Encode, pass
// idem.FromContext(ctx).CompleteParams(answer) to the store's CompleteTx
// inside the transaction, commit, call idem.FromContext(ctx).Committed,
// then return the same answer.
//
// # Metadata
//
// Header and trailer metadata set by the handler are not stored, and a
// replay carries only idempotent-replayed: true. Capturing them would mean
// replacing the call's grpc.ServerTransportStream, which breaks
// grpc.SetSendCompressor and anything else that expects gRPC's own stream.
//
// # Panics and cancelled calls
//
// A panicking handler leaves its record unknown (it may have been part way
// through its effects) and the panic goes on up the chain, to a recovery
// interceptor outside this one or to the process. When the call's context
// ends (client gone, deadline passed) before the handler returned, a
// response or a final error the handler still returned is stored; any other
// error makes the record unknown, because a handler failing while its call
// is torn down may have been part way through its effects.
package grpcidem

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Metadata keys read and written by the interceptor.
const (
	// KeyMetadata is the request metadata that carries the idempotency key.
	KeyMetadata = "idempotency-key"
	// ReplayedMetadata is set to "true" in the header metadata of a replay.
	ReplayedMetadata = "idempotent-replayed"
)

// Method and ContentType are what the interceptor passes to the engine for
// every gRPC call: Method as the request method of the scope and the
// fingerprint, ContentType for the fingerprint (the message bytes are
// hashed raw). Reconciliation tools can recognise gRPC records by Method
// (see idem.ParseScope).
const (
	Method      = "GRPC"
	ContentType = "application/grpc+proto"
)

// Outcome is what becomes of a record when its handler returned an error.
type Outcome int

const (
	// Keep: the error is the call's final answer; it is stored and replayed
	// to every retry.
	Keep Outcome = iota
	// Release: the call certainly had no effect; the key is released and a
	// retry runs the handler again.
	Release
	// Unknown: the call may have had effects; retries are refused (Aborted)
	// until reconciliation settles the record.
	Unknown
)

func (o Outcome) String() string {
	switch o {
	case Keep:
		return "keep"
	case Release:
		return "release"
	case Unknown:
		return "unknown"
	}
	return "invalid"
}

// DefaultClassify mirrors the HTTP response policy (docs/http-contract.md: 4xx stored,
// 5xx and the transient 4xx released) through the usual mapping of gRPC
// codes to HTTP statuses:
//
//   - Keep (definite answers, 4xx): InvalidArgument, NotFound, AlreadyExists,
//     PermissionDenied, FailedPrecondition, OutOfRange, Unauthenticated.
//   - Release (transient, 5xx, 429, 499): every other code: Canceled,
//     Unknown (which includes plain Go errors), DeadlineExceeded,
//     ResourceExhausted, Aborted, Unimplemented, Internal, Unavailable,
//     DataLoss.
//
// DeadlineExceeded is released like HTTP 504: a handler that returns it
// because a downstream call timed out after it may have taken effect must
// call idem.FromContext(ctx).Uncertain, exactly as an HTTP handler
// answering 504 must.
func DefaultClassify(err error) Outcome {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unauthenticated:
		return Keep
	}
	return Release
}

// Config configures the interceptor. The zero value is valid: every field
// has a documented default.
type Config struct {
	// Required lists the full method names ("/pkg.Service/Method") that
	// require a key: a call without one is refused with InvalidArgument. A
	// call to any other method is protected too when it carries a key, and
	// passes through untouched when it does not. Defaults to none.
	//
	// Only unary methods can be protected: a streaming method listed here is
	// refused at every call by StreamServerInterceptor (Unimplemented,
	// ReasonStreamNotProtected), so that a method its operator believes
	// protected never runs without the protection.
	Required []string

	// PassKeyedStreams lets a streaming call that carries a key run,
	// unprotected, when its method is not in Required: for clients that
	// attach a key to every call. Its key is then ignored, whatever its form
	// (malformed or given twice), as a key on an HTTP GET is, and the
	// handler still sees it in the metadata. Defaults to false: such a call
	// is refused (Unimplemented, ReasonStreamNotProtected), because its
	// client expects a protection that a stream cannot have.
	PassKeyedStreams bool

	// Tenant returns the caller's tenant, taken from the call's
	// authentication (peer certificate, auth metadata checked by an earlier
	// interceptor), never from the message; keys of two tenants never meet.
	// Defaults to one shared tenant "".
	Tenant func(ctx context.Context) string

	// Classify decides what becomes of a record whose handler returned an
	// error. Defaults to DefaultClassify.
	Classify func(err error) Outcome

	// KeyReusedCode answers a key reused with a different request. Defaults
	// to codes.FailedPrecondition: the key is well formed, but the server's
	// state (the key's first request) forbids this one, and the client must
	// not retry it unchanged. (The HTTP middleware's 422 is the same idea.)
	KeyReusedCode codes.Code

	// Wait, when positive, makes a duplicate of an in-flight call wait up to
	// Wait for the original to finish and then replay its answer, instead of
	// answering Aborted at once. Defaults to the engine's Config.Wait.
	Wait time.Duration

	// RetryAfter is the delay advertised in the RetryInfo of Aborted and
	// Unavailable answers. Defaults to the engine's Config.RetryAfter.
	RetryAfter time.Duration

	// MaxResponseBytes bounds the encoded answer kept for replay. A larger
	// answer is still delivered, but only the fact that the call completed
	// is kept: retries get FailedPrecondition with ReasonResponseNotKept
	// and the handler is never run again. Defaults to the engine's
	// Config.MaxResponseBytes.
	MaxResponseBytes int

	// Logger receives the interceptor's events. Defaults to the engine's
	// Config.Logger.
	Logger *slog.Logger
}

type interceptor struct {
	e        *idem.Engine
	cfg      Config
	required map[string]bool
}

// UnaryServerInterceptor returns an interceptor that runs the idempotency
// protocol of e (idem.Engine.Run) for unary calls. It panics on an invalid
// Config, as a programming error.
//
// Install it inside the recovery interceptor, if any, and after the
// interceptors that authenticate the call (Tenant reads what they found).
//
// It sees unary calls only: install StreamServerInterceptor beside it (or
// both at once with ServerOptions), or a streaming method listed in
// Required, or a streaming call with a key, runs unprotected without a word.
func UnaryServerInterceptor(e *idem.Engine, cfg Config) grpc.UnaryServerInterceptor {
	return newInterceptor(e, cfg).intercept
}

// newInterceptor checks cfg, applies its defaults and builds the state both
// interceptors share, so that they judge one Config alike.
func newInterceptor(e *idem.Engine, cfg Config) *interceptor {
	if e == nil {
		panic("grpcidem: an engine is required")
	}
	switch {
	case cfg.Wait < 0, cfg.RetryAfter < 0, cfg.MaxResponseBytes < 0:
		panic("grpcidem: Wait, RetryAfter and MaxResponseBytes must not be negative")
	case cfg.KeyReusedCode > codes.Unauthenticated:
		panic(fmt.Sprintf("grpcidem: KeyReusedCode %d is not a gRPC code", cfg.KeyReusedCode))
	}
	if cfg.Tenant == nil {
		cfg.Tenant = func(context.Context) string { return "" }
	}
	if cfg.Classify == nil {
		cfg.Classify = DefaultClassify
	}
	if cfg.KeyReusedCode == codes.OK {
		cfg.KeyReusedCode = codes.FailedPrecondition
	}
	// The engine applies the settings; those left zero keep e's. A unary
	// call has no asynchronous answer (no 202, no status resource), so an
	// engine made for asynchronous HTTP routes runs calls synchronously.
	{
		var err error
		e, err = e.With(func(c *idem.Config) {
			c.Async = false
			if cfg.Wait > 0 {
				c.Wait = cfg.Wait
			}
			if cfg.RetryAfter > 0 {
				c.RetryAfter = cfg.RetryAfter
			}
			if cfg.MaxResponseBytes > 0 {
				c.MaxResponseBytes = cfg.MaxResponseBytes
			}
			if cfg.Logger != nil {
				c.Logger = cfg.Logger
			}
		})
		if err != nil {
			panic("grpcidem: " + err.Error())
		}
	}
	i := &interceptor{e: e, cfg: cfg, required: make(map[string]bool, len(cfg.Required))}
	for _, m := range cfg.Required {
		i.required[m] = true
	}
	return i
}

var deterministic = proto.MarshalOptions{Deterministic: true}

// Whether a call must carry a key, as idem.Call.KeyRequired wants it.
var (
	keyRequired = true
	keyOptional = false
)

func (i *interceptor) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	c := idem.Call{
		Tenant: i.cfg.Tenant(ctx), Method: Method, Route: info.FullMethod, Target: info.FullMethod,
		Keys: md.Get(KeyMetadata), KeyRequired: &keyOptional, ContentType: ContentType,
		ReadBody: func() ([]byte, error) {
			msg, ok := req.(proto.Message)
			if !ok {
				return nil, fmt.Errorf("the request of %s is a %T, not a protobuf message", info.FullMethod, req)
			}
			return deterministic.Marshal(msg)
		},
	}
	if i.required[info.FullMethod] {
		c.KeyRequired = &keyRequired
	}
	outer := idem.FromContext(ctx)
	var (
		resp any
		herr error
	)
	a := i.e.Run(ctx, c, func(ctx context.Context) idem.Result {
		resp, herr = handler(ctx, req)
		herr = asSent(herr)
		if x := idem.FromContext(ctx); x == nil || x == outer {
			return idem.Result{} // passed through: nothing is recorded
		}
		return i.result(resp, herr)
	})
	switch a.Verdict {
	case idem.Executed, idem.Passed:
		return resp, herr
	case idem.Replayed:
		grpc.SetHeader(ctx, metadata.Pairs(ReplayedMetadata, "true"))
		return Decode(*a.Response)
	}
	return nil, i.refused(ctx, a)
}

// refused is the status of a call the engine answered without running
// the handler, other than by a replay.
func (i *interceptor) refused(ctx context.Context, a idem.Answer) error {
	switch a.Verdict {
	case idem.KeyReused:
		return refusal(i.cfg.KeyReusedCode, ReasonKeyReused,
			"idempotency: this key was already used with a different request; use a new key for a new request", 0)
	case idem.OutcomeUnknown:
		return refusal(codes.Aborted, ReasonOutcomeUnknown,
			"idempotency: the outcome of the first call with this key is unknown and is being reconciled; retry later", a.Problem.RetryAfter)
	case idem.InProgress:
		return refusal(codes.Aborted, ReasonInProgress,
			"idempotency: a call with this key is in progress; retry later", a.Problem.RetryAfter)
	case idem.Limited:
		code, reason := codes.ResourceExhausted, ReasonTenantLimited
		switch a.Problem.Slug {
		case idem.SlugNewKeysLimited:
			reason = ReasonNewKeysLimited
		case idem.SlugOverCapacity:
			code, reason = codes.Unavailable, ReasonOverCapacity
		}
		return refusal(code, reason, "idempotency: "+a.Problem.Title+" ("+a.Problem.Slug+")", a.Problem.RetryAfter)
	case idem.Unavailable:
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		return refusal(codes.Unavailable, ReasonStoreUnavailable,
			"idempotency: the idempotency store is unavailable; the call was not executed", a.Problem.RetryAfter)
	}
	// idem.Invalid
	switch a.Problem.Slug {
	case idem.SlugKeyMissing:
		return refusal(codes.InvalidArgument, ReasonKeyMissing,
			"idempotency: this method requires "+KeyMetadata+" metadata", 0)
	case idem.SlugKeyRepeated:
		return refusal(codes.InvalidArgument, ReasonKeyRepeated,
			"idempotency: "+KeyMetadata+" metadata must be given once", 0)
	case idem.SlugKeyMalformed:
		return refusal(codes.InvalidArgument, ReasonKeyMalformed, "idempotency: "+a.Problem.Detail, 0)
	case idem.SlugScopeTooLong, idem.SlugScopeInvalid:
		return refusal(codes.InvalidArgument, ReasonScopeInvalid,
			"idempotency: "+a.Problem.Title+" (tenant and method name)", 0)
	}
	return status.Errorf(codes.Internal, "idempotency: cannot fingerprint the request: %s", a.Problem.Detail)
}

// asSent returns err as grpc-go sends it, so that Classify judges, the
// record keeps and a replay sends the status the first client got: an
// error that carries no status is one from a context (wrapped or not:
// DeadlineExceeded or Canceled) or Unknown, as grpc-go makes it; and a
// message that is not UTF-8 (which google.rpc.Status cannot hold, so the
// record could not be stored) has its invalid bytes replaced.
func asSent(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	if !utf8.ValidString(st.Message()) {
		p := st.Proto()
		p.Message = strings.ToValidUTF8(p.Message, "\uFFFD")
		st = status.FromProto(p)
	} else if ok {
		return err
	}
	return st.Err()
}

// result is the record of the handler's answer: the response policy in
// gRPC terms. A response message or an error Classify keeps is stored;
// the engine applies the handler's declared outcome (Uncertain,
// Committed) first, and makes a released failure unknown when the call
// ended before the handler returned.
func (i *interceptor) result(resp any, herr error) idem.Result {
	if herr != nil {
		switch i.cfg.Classify(herr) {
		case Release:
			return idem.Result{Outcome: idem.Release, Reason: "status " + status.Code(herr).String()}
		case Unknown:
			return idem.Result{Outcome: idem.Unknown, Reason: "status " + status.Code(herr).String()}
		}
	}
	var msg proto.Message
	if herr == nil {
		var ok bool
		if msg, ok = resp.(proto.Message); !ok || msg == nil {
			// Nothing that can be replayed, yet the handler ran.
			return idem.Result{Outcome: idem.Unknown, Reason: fmt.Sprintf("the handler's response (%T) cannot be stored", resp)}
		}
	}
	stored, err := Encode(msg, herr)
	if err != nil {
		return idem.Result{Outcome: idem.Unknown, Reason: "the handler's response cannot be stored: " + err.Error()}
	}
	return idem.Result{Response: stored, Outcome: idem.Keep}
}
