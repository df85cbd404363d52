package grpcidem

import (
	"github.com/idem-go/idem"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// StreamServerInterceptor returns an interceptor that refuses the streaming
// calls an idempotency key would be expected to protect, which it cannot:
// a call to a method listed in cfg.Required, and a call that carries a key
// unless cfg.PassKeyedStreams is set. Both are answered Unimplemented with
// ReasonStreamNotProtected, and the handler does not run. Any other
// streaming call passes through untouched. It panics on an invalid Config,
// as a programming error, as UnaryServerInterceptor does.
//
// Install it after the interceptors that authenticate the call, so that an
// unauthenticated caller learns nothing of the configuration.
func StreamServerInterceptor(e *idem.Engine, cfg Config) grpc.StreamServerInterceptor {
	return newInterceptor(e, cfg).interceptStream
}

// ServerOptions returns the options that install both interceptors, the
// unary and the streaming one, built from one Config:
//
//	srv := grpc.NewServer(grpcidem.ServerOptions(engine, cfg)...)
//
// gRPC runs chained interceptors in the order of their options, so options
// given before these (a recovery or an authentication interceptor) run
// outside grpcidem, as they should.
func ServerOptions(e *idem.Engine, cfg Config) []grpc.ServerOption {
	i := newInterceptor(e, cfg)
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(i.intercept), grpc.ChainStreamInterceptor(i.interceptStream)}
}

// interceptStream refuses rather than runs unprotected a call whose client
// or operator expects the protection: see Streaming methods in the package
// documentation for why a stream cannot have it.
func (i *interceptor) interceptStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if i.required[info.FullMethod] {
		// The client can do nothing about it: the configuration is wrong.
		i.e.Logger().Warn("grpcidem: a streaming method is listed in Config.Required; it cannot be protected and its calls are refused",
			"method", info.FullMethod)
		return refusal(codes.Unimplemented, ReasonStreamNotProtected,
			"idempotency: "+info.FullMethod+" is listed as requiring an idempotency key, but it is a streaming method, "+
				"which idempotency keys cannot protect; the call was not executed", 0)
	}
	md, _ := metadata.FromIncomingContext(ss.Context())
	if len(md.Get(KeyMetadata)) > 0 && !i.cfg.PassKeyedStreams {
		return refusal(codes.Unimplemented, ReasonStreamNotProtected,
			"idempotency: "+info.FullMethod+" is a streaming method, which idempotency keys cannot protect; "+
				"the call was not executed (call it without "+KeyMetadata+" metadata)", 0)
	}
	return handler(srv, ss)
}
