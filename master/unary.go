package master

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kfelastic/kfelastic/api/masterpb"
)

// unaryHandler serves the master's gRPC service (every method unary) as an
// http.Handler on Go's HTTP/2 server, without grpc-go's server: a call is
// the HTTP/2 server's handler goroutine and nothing else, where grpc-go's
// ServeHTTP adds a goroutine that watches the request and one that reads
// its body. It speaks what grpc-go's clients send: one length-prefixed,
// uncompressed message; an answer in one DATA frame and the status in the
// trailers (or, for an error, in a trailers-only response).
//
// Callers are authenticated before it (httpAuthorized), on the headers.
type unaryHandler struct {
	svc     *service
	methods map[string]grpc.MethodDesc // by path, "/kfelastic.master.v1.Master/Join"
}

func (s *Server) unaryHandler() *unaryHandler {
	d := masterpb.Master_ServiceDesc
	u := &unaryHandler{svc: &service{s: s}, methods: map[string]grpc.MethodDesc{}}
	for _, m := range d.Methods {
		u.methods["/"+d.ServiceName+"/"+m.MethodName] = m
	}
	return u
}

func (u *unaryHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.ProtoMajor != 2 {
		http.Error(w, "gRPC requires HTTP/2 POST", http.StatusMethodNotAllowed)
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/grpc" && !strings.HasPrefix(ct, "application/grpc+proto") &&
		!strings.HasPrefix(ct, "application/grpc;") {
		http.Error(w, "invalid gRPC content-type", http.StatusUnsupportedMediaType)
		return
	}
	m, ok := u.methods[r.URL.Path]
	if !ok {
		writeStatusOnly(w, codes.Unimplemented, fmt.Sprintf("unknown method %s", r.URL.Path))
		return
	}
	if enc := r.Header.Get("Grpc-Encoding"); enc != "" && enc != "identity" {
		writeStatusOnly(w, codes.Unimplemented, fmt.Sprintf("grpc: Decompressor is not installed for grpc-encoding %q", enc))
		return
	}
	ctx := r.Context()
	if v := r.Header.Get("Grpc-Timeout"); v != "" {
		d, err := decodeTimeout(v)
		if err != nil {
			writeStatusOnly(w, codes.Internal, fmt.Sprintf("malformed grpc-timeout: %v", err))
			return
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	msg, st := readMessage(r.Body)
	if st != nil {
		writeStatusOnly(w, st.Code(), st.Message())
		return
	}
	dec := func(v any) error {
		if err := proto.Unmarshal(msg, v.(proto.Message)); err != nil {
			return status.Errorf(codes.Internal, "grpc: error unmarshalling request: %v", err)
		}
		return nil
	}
	// No interceptor: httpAuthorized checked the token on the headers.
	res, err := m.Handler(u.svc, ctx, dec, nil)
	if err != nil {
		writeStatus(w, status.Convert(err))
		return
	}
	pm, _ := res.(proto.Message)
	size := proto.Size(pm)
	if size > MaxMessageBytes {
		writeStatusOnly(w, codes.ResourceExhausted, fmt.Sprintf("grpc: trying to send message larger than max (%d vs. %d)", size, MaxMessageBytes))
		return
	}
	out := make([]byte, 5, 5+size)
	binary.BigEndian.PutUint32(out[1:], uint32(size))
	out, err = proto.MarshalOptions{}.MarshalAppend(out, pm)
	if err != nil {
		writeStatusOnly(w, codes.Internal, fmt.Sprintf("grpc: error while marshaling: %v", err))
		return
	}
	h := w.Header()
	h["Content-Type"] = []string{"application/grpc"}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
	h[http.TrailerPrefix+"Grpc-Status"] = []string{"0"}
}

// readMessage reads a unary call's one message: 5 bytes (compressed flag,
// length) and the message, refusing one over MaxMessageBytes before it is
// read.
func readMessage(body io.Reader) ([]byte, *status.Status) {
	var hdr [5]byte
	if _, err := io.ReadFull(body, hdr[:]); err != nil {
		return nil, readError(err)
	}
	if hdr[0] != 0 {
		return nil, status.New(codes.Internal, "grpc: compressed flag set with identity or empty encoding")
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxMessageBytes {
		return nil, status.Newf(codes.ResourceExhausted, "grpc: received message larger than max (%d vs. %d)", n, MaxMessageBytes)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(body, msg); err != nil {
		return nil, readError(err)
	}
	return msg, nil
}

func readError(err error) *status.Status {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return status.New(codes.Internal, "grpc: the request ended before its message")
	}
	return status.New(codes.Canceled, err.Error())
}

// writeStatus answers a call with an error status, trailers-only: HTTP
// 200, content type and status in the one HEADERS frame.
func writeStatus(w http.ResponseWriter, st *status.Status) {
	h := w.Header()
	h["Content-Type"] = []string{"application/grpc"}
	h["Grpc-Status"] = []string{strconv.Itoa(int(st.Code()))}
	if m := st.Message(); m != "" {
		h["Grpc-Message"] = []string{encodeGRPCMessage(m)}
	}
	if p := st.Proto(); len(p.GetDetails()) > 0 {
		if b, err := proto.Marshal(p); err == nil {
			h["Grpc-Status-Details-Bin"] = []string{base64.RawStdEncoding.EncodeToString(b)}
		}
	}
	w.WriteHeader(http.StatusOK)
}

func writeStatusOnly(w http.ResponseWriter, code codes.Code, msg string) {
	writeStatus(w, status.New(code, msg))
}

// encodeGRPCMessage percent-encodes a status message as gRPC carries it:
// bytes outside printable ASCII, and '%'.
func encodeGRPCMessage(m string) string {
	clean := true
	for i := 0; i < len(m); i++ {
		if c := m[i]; c < 0x20 || c > 0x7e || c == '%' {
			clean = false
			break
		}
	}
	if clean {
		return m
	}
	var b strings.Builder
	for i := 0; i < len(m); i++ {
		if c := m[i]; c < 0x20 || c > 0x7e || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
		} else {
			b.WriteByte(c)
		}
	}
	return b.String()
}

// decodeTimeout parses a grpc-timeout header: up to 8 digits and a unit.
func decodeTimeout(s string) (time.Duration, error) {
	if len(s) < 2 || len(s) > 9 {
		return 0, fmt.Errorf("bad timeout %q", s)
	}
	n, err := strconv.ParseInt(s[:len(s)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("bad timeout %q", s)
	}
	var unit time.Duration
	switch s[len(s)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, fmt.Errorf("bad timeout unit in %q", s)
	}
	if n > math.MaxInt64/int64(unit) {
		return math.MaxInt64, nil
	}
	return time.Duration(n) * unit, nil
}
