package grpcidem_test

import (
	"errors"
	"net/http"
	"testing"

	"github.com/idem-go/idem/grpcidem"
	"github.com/idem-go/idem/store"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	hpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

func TestEncodeDecodeResponse(t *testing.T) {
	t.Parallel()
	in := &hpb.HealthListResponse{Statuses: map[string]*hpb.HealthCheckResponse{
		"b": {Status: hpb.HealthCheckResponse_SERVING}, "a": {Status: hpb.HealthCheckResponse_NOT_SERVING},
	}}
	r, err := grpcidem.Encode(in, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusOK || r.Header.Get("Content-Type") != grpcidem.AnyContentType {
		t.Errorf("stored as %d %q", r.Status, r.Header.Get("Content-Type"))
	}
	again, _ := grpcidem.Encode(in, nil)
	if string(again.Body) != string(r.Body) {
		t.Error("encoding a message twice gave different bytes")
	}
	out, err := grpcidem.Decode(r)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := out.(*hpb.HealthListResponse); !ok || !proto.Equal(in, out) {
		t.Errorf("decoded %T %v, want %v", out, out, in)
	}
}

func TestEncodeDecodeError(t *testing.T) {
	t.Parallel()
	st, err := status.New(codes.FailedPrecondition, "card declined").WithDetails(
		&errdetails.ErrorInfo{Reason: "CARD_DECLINED", Domain: "payments.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	r, err := grpcidem.Encode(nil, st.Err())
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusBadRequest || r.Header.Get("Content-Type") != grpcidem.StatusContentType {
		t.Errorf("stored as %d %q", r.Status, r.Header.Get("Content-Type"))
	}
	msg, derr := grpcidem.Decode(r)
	if msg != nil || !proto.Equal(status.Convert(derr).Proto(), st.Proto()) {
		t.Errorf("decoded %v, %v; want the error %v", msg, derr, st.Proto())
	}

	// A plain Go error is stored as gRPC would send it: Unknown.
	r, err = grpcidem.Encode(nil, errors.New("boom"))
	if err != nil {
		t.Fatal(err)
	}
	if _, derr := grpcidem.Decode(r); status.Code(derr) != codes.Unknown || status.Convert(derr).Message() != "boom" {
		t.Errorf("decoded %v, want Unknown boom", derr)
	}
}

func TestEncodeRefuses(t *testing.T) {
	t.Parallel()
	if _, err := grpcidem.Encode(nil, nil); err == nil {
		t.Error("no response and no error encoded")
	}
	if _, err := grpcidem.Encode(nil, status.Error(codes.OK, "")); err == nil {
		t.Error("an OK status encoded as an error")
	}
}

func TestDecodeUnusual(t *testing.T) {
	t.Parallel()
	unlinked, _ := proto.Marshal(&anypb.Any{TypeUrl: "type.googleapis.com/example.NotLinked", Value: []byte{}})
	for name, tc := range map[string]struct {
		r      store.Response
		code   codes.Code
		reason string
	}{
		"body not kept": {
			r:    store.Response{Status: 200, Header: http.Header{"Content-Type": {grpcidem.AnyContentType}}, BodyOmitted: true},
			code: codes.FailedPrecondition, reason: grpcidem.ReasonResponseNotKept,
		},
		"abandoned by the maintainer": {
			r: store.Response{Status: http.StatusGatewayTimeout, Header: http.Header{"Content-Type": {"application/problem+json"}},
				Body: []byte(`{"title":"The request was abandoned before its outcome was recorded","status":504}`)},
			code: codes.DeadlineExceeded, reason: grpcidem.ReasonForeignResponse,
		},
		"HTTP success": {
			r:    store.Response{Status: 201, Body: []byte(`{"id":1}`)},
			code: codes.Unknown, reason: grpcidem.ReasonForeignResponse,
		},
		"type not linked": {
			r:    store.Response{Status: 200, Header: http.Header{"Content-Type": {grpcidem.AnyContentType}}, Body: unlinked},
			code: codes.Internal,
		},
		"corrupt status": {
			r:    store.Response{Status: 400, Header: http.Header{"Content-Type": {grpcidem.StatusContentType}}, Body: []byte{0xff}},
			code: codes.Internal,
		},
	} {
		t.Run(name, func(t *testing.T) {
			msg, err := grpcidem.Decode(tc.r)
			if msg != nil {
				t.Fatalf("decoded a message %v", msg)
			}
			if tc.reason == "" {
				if status.Code(err) != tc.code {
					t.Errorf("code %v (%v), want %v", status.Code(err), err, tc.code)
				}
				return
			}
			wantRefusal(t, err, tc.code, tc.reason)
		})
	}
}
