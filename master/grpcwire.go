package master

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	encodingproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"

	"github.com/kfelastic/kfelastic/api/masterpb"
)

// What of gRPC's wire format the lean transport needs, beside lean.go.

// unaryMethods are the master's gRPC methods by path
// ("/kfelastic.master.v1.Master/Join"), all unary, for the lean transport.
func unaryMethods() map[string]*grpc.MethodDesc {
	d := masterpb.Master_ServiceDesc
	methods := map[string]*grpc.MethodDesc{}
	for _, m := range d.Methods {
		methods["/"+d.ServiceName+"/"+m.MethodName] = &m
	}
	return methods
}

// undecodable is the answer to a request whose message does not decode (a
// string that is not UTF-8, which protobuf refuses: a pod or node name),
// under either transport: INVALID_ARGUMENT, since the caller would send
// the same again. gRPC answers INTERNAL, which the agents take for the
// master failing, and retry (a join, for 10 minutes).
func undecodable(why string) error {
	return status.Error(codes.InvalidArgument, "the request does not decode: "+why)
}

// undecodableCodec has grpc-go's server (--transport grpc) answer a
// request that does not decode with undecodable, as the lean transport
// does: grpc-go answers its codec's failure INTERNAL itself, before any
// handler runs. This codec, protobuf's otherwise, hands such a request on
// as decoded and notes it (failed); each method's decoding (service)
// answers it.
type undecodableCodec struct {
	encoding.CodecV2
	failed sync.Map // request message → why it does not decode
}

func newUndecodableCodec() *undecodableCodec {
	return &undecodableCodec{CodecV2: encoding.GetCodecV2(encodingproto.Name)}
}

func (c *undecodableCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if err := c.CodecV2.Unmarshal(data, v); err != nil {
		c.failed.Store(v, err.Error())
	}
	return nil
}

// service is d with each method's decoding answering undecodable for a
// request the codec noted.
func (c *undecodableCodec) service(d grpc.ServiceDesc) *grpc.ServiceDesc {
	methods := make([]grpc.MethodDesc, len(d.Methods))
	for i, m := range d.Methods {
		handle := m.Handler
		m.Handler = func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			return handle(srv, ctx, func(v any) error {
				err := dec(v)
				if why, failed := c.failed.LoadAndDelete(v); failed && err == nil {
					return undecodable(why.(string))
				}
				return err
			}, ic)
		}
		methods[i] = m
	}
	d.Methods = methods
	return &d
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
