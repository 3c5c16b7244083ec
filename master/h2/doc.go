// Package h2 is the master's lean transport (--transport lean, the
// default): an HTTP/2 server for a gRPC service whose methods are all
// unary, as grpc-go's clients (the agents) speak it over plaintext TCP
// (h2c with prior knowledge). The master hands it its service (a
// grpc.ServiceDesc and its implementation), a check of the job token and
// its bounds (Config); the package knows nothing else of the master.
//
// It exists for memory at scale (docs/DESIGN.md §5.11): at 10,000 agents,
// each with one connection and one held call, the master peaks at ≈200 MiB
// on it against ≈430 MiB on grpc-go's server. Each connection is one
// goroutine, which reads frames and keeps the connection's state; each
// call is one goroutine while its handler runs (a held long poll
// included), started on a shallow stack, the generated method handler
// called directly; answers are written by the call's goroutine under the
// connection's lock, from a pooled buffer. grpc-go's server costs three
// goroutines and their buffers per connection and grows each call's stack
// to 8 KiB; x/net's http2.Server two goroutines per connection, 4 KiB of
// response buffer per call.
//
// From golang.org/x/net/http2 it takes the Framer (reading frames, 16 KiB
// at most, and a header block's CONTINUATIONs joined, its HPACK decoded,
// bounded by Config.MaxHeaderListBytes) and the HPACK encoder (with no
// dynamic table: the answers' few headers go literal). Frames are written
// by hand (frames.go), several to one write.
//
// What it does of HTTP/2 and gRPC: SETTINGS (the peer's initial window and
// frame size; a value out of range ends the connection, RFC 9113 §6.5.2),
// flow control both ways (the peer's windows are respected when
// answering; what the peer sends is credited back as it is read), PING
// (answered; too frequent pings end the connection as grpc-go's
// enforcement policy does), SETTINGS_MAX_CONCURRENT_STREAMS (advertised; a
// call beyond it is refused with RST_STREAM REFUSED_STREAM), RST_STREAM
// (the call's context ends), GOAWAY on Stop (calls in flight are
// answered, then the connection closes), grpc-timeout, status and message
// (percent-encoded) in trailers, trailers-only errors. The token is
// checked on a call's headers, before any of its message is kept; a
// message's buffer grows as its bytes arrive, never to the length its
// prefix declares. Frames on idle or closed streams, malformed requests
// (a pseudo-header missing, a connection-specific header) and frames too
// large are the stream or connection errors RFC 9113 asks for (h2spec:
// 139 of its 145 cases pass; a preface that is not HTTP/2's gets GOAWAY
// and an orderly close). Connections are bounded in number and in
// how long one may go without a call with the token.
//
// Deliberately left out, since the master and its agents use none of it:
// TLS and ALPN, the HTTP/1.1 Upgrade to h2c, server push, stream
// priorities (PRIORITY frames are read and ignored), streaming methods,
// compression (grpc-encoding other than identity is UNIMPLEMENTED),
// server-side keepalive pings (a dead peer is found by TCP keepalive), a
// dynamic HPACK table for what it sends. It is held to grpc-go's server
// by the master's transport tests (master/transport_test.go), to the
// protocol by h2spec (TestH2spec; the cases it still fails, each with
// why, in testdata/h2spec.txt), and to hostile peers by FuzzConn and the
// attack tests of server_test.go.
package h2
