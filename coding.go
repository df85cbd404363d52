package idem

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"strings"
)

// errDecodedTooLarge: a body's decoded content passes the fingerprint
// limit (a small compressed body can stand for a huge one).
var errDecodedTooLarge = errors.New("decoded body too large")

// decodeContent undoes the content codings of a request body, listed as
// the Content-Encoding header lists them (the last applied last), so that
// the fingerprint sees the content: two compressors, or one compressor at
// two moments (gzip's header holds a time), write different bytes for
// one request. It decodes gzip and deflate, at most limit bytes of
// content; a body in any other coding is returned as it came, with the
// codings' names normalised for the fingerprint, which then hashes it
// raw. The handler always gets the body as sent.
func decodeContent(codings string, body []byte, limit int64) (content []byte, undecoded string, err error) {
	if codings == "" {
		return body, "", nil
	}
	var names []string
	for name := range strings.SplitSeq(codings, ",") {
		name = strings.ToLower(strings.TrimSpace(name))
		if name == "x-gzip" {
			name = "gzip" // RFC 9110 8.4.1.3
		}
		if name != "" && name != "identity" {
			names = append(names, name)
		}
	}
	for _, name := range names {
		if name != "gzip" && name != "deflate" {
			return body, strings.Join(names, ","), nil
		}
	}
	content = body
	for i := len(names) - 1; i >= 0; i-- {
		if content, err = decodeOne(names[i], content, limit); err != nil {
			return nil, "", err
		}
	}
	return content, "", nil
}

// decodeOne undoes one coding, reading at most limit bytes of its output.
func decodeOne(name string, body []byte, limit int64) ([]byte, error) {
	var r io.Reader
	switch name {
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if err != nil {
			return nil, fmt.Errorf("the body is not valid gzip: %w", err)
		}
		r = zr
	default: // deflate: zlib's format (RFC 9110 8.4.1.2), or raw deflate, which some clients send
		zr, err := zlib.NewReader(bytes.NewReader(body))
		if err != nil {
			zr = flate.NewReader(bytes.NewReader(body))
		}
		r = zr
	}
	out, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("the body is not valid %s: %w", name, err)
	}
	if int64(len(out)) > limit {
		return nil, errDecodedTooLarge
	}
	return out, nil
}
