package master

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"

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
