package main

import (
	"context"
	"fmt"
	"io"
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

-o - writes the page to stdout. Exit status: 0 when the page is written (also
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

// writeFileAtomic writes path through a temporary file in its folder, so
// that a failed write leaves no half page (nor removes an old one).
func writeFileAtomic(path string, write func(io.Writer) error) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
