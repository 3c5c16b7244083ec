package master

import (
	"context"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	encodingproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

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
// does (undecodableService): grpc-go answers its codec's failure INTERNAL itself, before any
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

// undecodableService is d with each method answering undecodable for a
// request that does not decode, for the lean transport (whose decoding
// answers INTERNAL, as grpc-go's does).
func undecodableService(d grpc.ServiceDesc) *grpc.ServiceDesc {
	methods := make([]grpc.MethodDesc, len(d.Methods))
	for i, m := range d.Methods {
		handle := m.Handler
		m.Handler = func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			return handle(srv, ctx, func(v any) error {
				if err := dec(v); err != nil {
					return undecodable(strings.TrimPrefix(status.Convert(err).Message(), "grpc: error unmarshalling request: "))
				}
				return nil
			}, ic)
		}
		methods[i] = m
	}
	d.Methods = methods
	return &d
}
