// Package jobtoken reads and checks the per-job token that the agents and
// the master share (the plugin mounts it from a Secret; kfelastic local
// writes it): the master refuses every call without it.
//
//	tok, err := jobtoken.Read("/etc/kfelastic/token")
//	// tok is what an agent sends as "authorization: Bearer <tok>"
package jobtoken

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
)

// MaxBytes is the most a token file may hold. A token is a few dozen
// bytes; the master reads at most 16 KiB of a call's headers.
const MaxBytes = 4096

// Read reads the token in path: a regular file (a link to one, as a
// Kubernetes Secret volume has, is followed) of at most MaxBytes, its
// content without surrounding white space, which Check accepts. Anything
// else is refused at once: a FIFO is not waited on (it is opened without
// blocking, then refused), a device such as /dev/zero is not read. Errors
// never quote the file's content.
func Read(path string) (string, error) {
	if path == "" {
		return "", errors.New("no token file")
	}
	// Stat first, so that a device is not even opened; then what was
	// opened is checked again (the path may have changed in between).
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file (%s)", path, kind(st.Mode()))
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if st, err = f.Stat(); err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file (%s)", path, kind(st.Mode()))
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return "", err
	}
	if len(b) > MaxBytes {
		return "", fmt.Errorf("%s holds more than a token (%d bytes at most)", path, MaxBytes)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	if err := Check(tok); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return tok, nil
}

// ErrInvalid is the class of a token gRPC cannot carry.
var ErrInvalid = errors.New("invalid job token")

// Check reports whether tok can be sent as gRPC metadata: not empty, at
// most MaxBytes, printable ASCII only (0x20 to 0x7E; gRPC refuses to send
// anything else in a text header, so an agent would retry a call that can
// never leave). The error says where, not what: the token is a secret.
func Check(tok string) error {
	if tok == "" {
		return fmt.Errorf("%w: empty", ErrInvalid)
	}
	if len(tok) > MaxBytes {
		return fmt.Errorf("%w: %d bytes, more than %d", ErrInvalid, len(tok), MaxBytes)
	}
	for i := 0; i < len(tok); i++ {
		if c := tok[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("%w: byte %d of %d is not printable ASCII (a token must be, to travel in a gRPC header)",
				ErrInvalid, i+1, len(tok))
		}
	}
	return nil
}

func kind(m os.FileMode) string {
	switch {
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a block device"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m.IsDir():
		return "a directory"
	}
	return m.Type().String()
}
