package master

import (
	"context"
	"path/filepath"

	"github.com/kfelastic/kfelastic/api/masterpb"
)

// StateBatches counts the batches in the log segments of the file://
// state in dir, for the tests outside the package.
func StateBatches(dir string) (int, error) {
	d := &durableLog{dir: filepath.Clean(dir)}
	gens, err := d.listSegments()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, g := range gens {
		r, err := readSegment(d.dir, g, func(string, *masterpb.StateFile) error { return nil })
		if err != nil {
			return 0, err
		}
		n += len(r.frames)
	}
	return n, nil
}

// WithStateWriteHook is o with hook run before each write of a batch of
// the state: a test's storage stall or failure.
func WithStateWriteHook(o Options, hook func(context.Context) error) Options {
	o.stateWriteHook = hook
	return o
}
