package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"gocloud.dev/blob"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/events"
	"github.com/kfelastic/kfelastic/internal/termsafe"
	"github.com/kfelastic/kfelastic/outputreader"
	"github.com/kfelastic/kfelastic/report"
)

// reportConfig is the flags of `kfelastic report`.
type reportConfig struct {
	URL         string
	Output      string
	Concurrency int
	OpenLanes   int
	// Timeout bounds each storage call, as `kfelastic errors --timeout`.
	Timeout time.Duration
}

// maxOpenLanes is --lanes' bound: the report draws at most 2000 lanes.
const maxOpenLanes = 2000

func (c reportConfig) validate() error {
	for _, err := range []error{
		intIn("concurrency", c.Concurrency, 1, maxConcurrency),
		intIn("lanes", c.OpenLanes, 1, maxOpenLanes),
		durationIn("timeout", c.Timeout, time.Millisecond, maxTimeout),
		outputPathError(c.Output),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

func init() { rootCmd.AddCommand(newReportCmd()) }

// newReportCmd is `kfelastic report`; a function so that each test runs a
// fresh command, as newErrorsCmd.
func newReportCmd() *cobra.Command {
	var c reportConfig
	cmd := &cobra.Command{
		Use:   "report URL [-o report.html]",
		Short: "Write the failure report of an output prefix: one self-contained HTML page",
		Long: `Reads every error document under URL (file://, s3://…?endpoint=…, mem://), the
recovered ones under superseded/, and the pods' events under events/, and writes
one HTML page: a lane per pod with each failure at its time, the root cause
highlighted with its message, the other failures dimmed, restarts and relaunches
in their lanes, and the Flyte UI message as the summary. The page has no script
and fetches nothing; every text from storage is shown as text.

Every storage call (a listing, one read) gets at most --timeout: a store that
accepts connections and never answers fails the command, it does not hang it. On
a file:// prefix, symbolic links and special files are never followed; they count
as skipped.

-o - writes the page to stdout. Otherwise -o names a file: a new one, or a
regular file it replaces (keeping its mode); a folder, a device, a FIFO or a
socket is refused. A new page is 0666 less the umask, as any file a command
creates. Exit status: 0 when the page is written (also
for a prefix without documents: the page says so); 1 for a bad URL or a prefix
that cannot be listed or read.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c.URL = args[0]
			if err := c.validate(); err != nil {
				return err
			}
			return runReport(cmd.Context(), c, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVarP(&c.Output, "output", "o", "report.html", "where to write the page; - for stdout")
	cmd.Flags().IntVar(&c.Concurrency, "concurrency", 32, fmt.Sprintf("concurrent reads (1 to %d)", maxConcurrency))
	cmd.Flags().IntVar(&c.OpenLanes, "lanes", 30, fmt.Sprintf("lanes shown at once; the others fold into a list (1 to %d)", maxOpenLanes))
	cmd.Flags().DurationVar(&c.Timeout, "timeout", defaultTimeout, fmt.Sprintf("bound on each storage call: a listing, one read (1ms to %v)", maxTimeout))
	return cmd
}

func runReport(ctx context.Context, c reportConfig, out io.Writer) error {
	in, err := readReport(ctx, c)
	if err != nil {
		return fmt.Errorf("%s: %w", c.URL, err)
	}
	if c.Output == "-" {
		return report.Build(out, in)
	}
	if err := writeFileAtomic(c.Output, func(w io.Writer) error { return report.Build(w, in) }); err != nil {
		return err
	}
	headline, _, _ := strings.Cut(in.Message, "\n")
	if headline == "" {
		headline = "no root cause"
	}
	// The headline comes from storage: escaped, as errors prints it.
	_, err = fmt.Fprintf(out, "%s: %s\n", termsafe.Line(c.Output), termsafe.Line(headline))
	return err
}

// readReport gathers what the report shows: the UI message as the plugin
// says it (Summarize), every document (Read, all opened), the superseded
// ones, and the events.
func readReport(ctx context.Context, c reportConfig) (report.Input, error) {
	in := report.Input{Prefix: c.URL, OpenLanes: c.OpenLanes}
	bucket, err := kferrors.OpenPrefix(ctx, c.URL, false)
	if err != nil {
		return in, err
	}
	defer bucket.Close()
	src := outputreader.NewBucketSource(bucket)
	sum, err := outputreader.Summarize(ctx, src, &outputreader.Options{Concurrency: c.Concurrency, CallTimeout: c.Timeout})
	if err != nil {
		return in, err
	}
	in.Message = sum.Message()
	all := &outputreader.Options{Concurrency: c.Concurrency, OpenAll: true, CallTimeout: c.Timeout}
	if in.Current, err = outputreader.Read(ctx, src, all); err != nil {
		return in, err
	}
	if in.Events, err = events.Read(ctx, bucket, &events.ReadOptions{Concurrency: c.Concurrency, CallTimeout: c.Timeout}); err != nil {
		return in, err
	}
	// PrefixedBucket takes its bucket over, so superseded/ gets its own.
	sb, err := kferrors.OpenPrefix(ctx, c.URL, false)
	if err != nil {
		return in, err
	}
	superseded := blob.PrefixedBucket(sb, kferrors.SupersededPrefix)
	defer superseded.Close()
	if in.Superseded, err = outputreader.Read(ctx, outputreader.NewBucketSource(superseded), all); err != nil {
		return in, fmt.Errorf("%s: %w", kferrors.SupersededPrefix, err)
	}
	return in, nil
}

// outputPathError says what is wrong with -o PATH before anything is read:
// the page replaces only a regular file (through a link to one, the file),
// never a device or a FIFO (renaming over /dev/null as root replaced the
// device node), and needs a file name, not a folder.
func outputPathError(path string) error {
	switch {
	case path == "-":
		return nil
	case path == "":
		return fmt.Errorf("--output: empty; give a file name, or - for stdout")
	case strings.HasSuffix(path, "/"):
		return fmt.Errorf("--output %q: a folder; give a file name, e.g. %s", path, filepath.Join(path, "report.html"))
	}
	st, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if dir, err := os.Stat(filepath.Dir(path)); err != nil || !dir.IsDir() {
			return fmt.Errorf("--output %q: its folder %q does not exist", path, filepath.Dir(path))
		}
		return nil
	case err != nil:
		return fmt.Errorf("--output %q: %w", path, err)
	case st.IsDir():
		return fmt.Errorf("--output %q: a folder; give a file name, e.g. %s", path, filepath.Join(path, "report.html"))
	case !st.Mode().IsRegular():
		return fmt.Errorf("--output %q: not a regular file (%s); the report replaces only regular files, or - for stdout", path, fileKind(st.Mode()))
	}
	return nil
}

// fileKind names a file's type for a message.
func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	}
	return m.Type().String()
}

// writeFileAtomic writes path through a temporary file in its folder, so
// that a failed write leaves no half page (nor removes an old one). A link
// is followed: its file is replaced, the link kept. The page keeps the mode
// of the file it replaces; a new one is created 0666 less the umask, as
// os.Create would (CreateTemp's 0600 would hide it from the group that
// reads the folder; a fixed 0644 ignored the user's umask).
func writeFileAtomic(path string, write func(io.Writer) error) error {
	if err := outputPathError(path); err != nil {
		return err
	}
	if target, err := filepath.EvalSymlinks(path); err == nil {
		path = target
	}
	st, statErr := os.Stat(path)
	replacing := statErr == nil
	var f *os.File
	var err error
	for range 100 {
		name := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%s.%d", filepath.Base(path), rand.Uint32()))
		if f, err = os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666); !errors.Is(err, fs.ErrExist) {
			break
		}
	}
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if replacing {
		if err := f.Chmod(st.Mode().Perm()); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
