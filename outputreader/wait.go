package outputreader

import (
	"context"
	goerrors "errors"
	"time"

	kferrors "github.com/kfelastic/kfelastic/errors"
)

// WaitFor reads src until documents (extra failures included) from at least
// workers distinct workers exist or the deadline passes, and returns the last
// Report either way: after the deadline one decides with what there is. This
// covers documents that land after the job turned terminal (docs/DESIGN.md §3).
// It lists again every Options.PollInterval; the clock is Options.Now.
func WaitFor(ctx context.Context, src Source, opts *Options, workers int, deadline time.Time, extra ...kferrors.Failure) (*Report, error) {
	o := opts.withDefaults()
	for {
		r, err := Read(ctx, src, &o, extra...)
		if err != nil {
			return nil, err
		}
		left := deadline.Sub(o.Now())
		if r.Workers() >= workers || left <= 0 {
			return r, nil
		}
		t := time.NewTimer(min(left, o.PollInterval))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

var errFound = goerrors.New("found")

// HasDocuments reports whether src holds at least one error document, usable
// or not, from a listing alone (it stops at the first).
func HasDocuments(ctx context.Context, src Source) (bool, error) {
	err := src.List(ctx, func(Object) error { return errFound })
	if err == errFound {
		return true, nil
	}
	return false, err
}
