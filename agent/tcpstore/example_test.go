package tcpstore_test

import (
	"bytes"
	"fmt"

	"github.com/kfelastic/kfelastic/agent/tcpstore"
)

// A torch 2.2+ client's first bytes: the handshake, then a PING and a SET.
// The decoder recognises the handshake and reads the rest in 2.2+ numbering.
func ExampleDecoder() {
	stream := []byte{0x00, 0xce, 0xf7, 0x85, 0x3c, // VALIDATE, magic
		0x0d, 0x2a, 0, 0, 0, // PING 42
		0x01, 2, 0, 0, 0, 0, 0, 0, 0, '/', 'a', 1, 0, 0, 0, 0, 0, 0, 0, '1'} // SET "/a" "1"
	d := tcpstore.NewDecoder(bytes.NewReader(stream), tcpstore.Torch113, tcpstore.Limits{})
	for {
		req, err := d.Next()
		if err != nil {
			break
		}
		fmt.Println(d.Numbering(), req.Cmd, req.Key, string(req.Value), req.Number)
	}
	// Output:
	// torch-2.2+ VALIDATE   1015412686
	// torch-2.2+ PING   42
	// torch-2.2+ SET /a 1 0
}
