package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	kferrors "github.com/kfelastic/kfelastic/errors"
	"github.com/kfelastic/kfelastic/internal/termsafe"
	"github.com/kfelastic/kfelastic/outputreader"
)

// errorsConfig is the flags of `kfelastic errors`.
type errorsConfig struct {
	URL         string
	JSON        bool
	WaitWorkers int
	Grace       time.Duration
	Concurrency int
	// Timeout bounds each storage call: a listing, one document read.
	Timeout time.Duration
	// warn gets what is said beside the table (stderr); nil: nothing.
	warn io.Writer
}

// Ranges of the errors command's numeric flags, as --help states them.
const (
	maxConcurrency = 1024
	maxWaitWorkers = 100000
	maxGrace       = 24 * time.Hour
	maxTimeout     = time.Hour
	// defaultTimeout is long enough for a listing of 10,000 documents on a
	// loaded server (≈0.5 s here), short enough to tell a silent one soon.
	defaultTimeout = 30 * time.Second
)

func (c errorsConfig) validate() error {
	for _, err := range []error{
		intIn("concurrency", c.Concurrency, 1, maxConcurrency),
		intIn("wait-workers", c.WaitWorkers, 0, maxWaitWorkers),
		durationIn("grace", c.Grace, 0, maxGrace),
		durationIn("timeout", c.Timeout, time.Millisecond, maxTimeout),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// exitError carries a process exit status out of a subcommand.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }
func (e *exitError) ExitCode() int { return e.code }

// exitNoUsableDocuments: documents exist under the prefix, none could be read.
const exitNoUsableDocuments = 2

func init() { rootCmd.AddCommand(newErrorsCmd()) }

// newErrorsCmd is `kfelastic errors`; a function so that each test runs a
// fresh command (cobra keeps the context it was first executed with).
func newErrorsCmd() *cobra.Command {
	var c errorsConfig
	cmd := &cobra.Command{
		Use:   "errors URL",
		Short: "Show every error document under an output prefix and the root cause",
		Long: `Lists the error documents under URL (file://, s3://…?endpoint=…, mem://),
prints them as a table in the total order (time, worker, key) with the root cause
marked "*", any skipped (unreadable) document with its reason, and the message
the Flyte UI shows.

Every storage call (a listing, one document read) gets at most --timeout: a store
that accepts connections and never answers fails the command, it does not hang it.
On a file:// prefix, symbolic links and special files are never followed: they are
listed as skipped, as are documents that cannot be read or decoded. Pod names, codes,
keys and messages are printed with control characters escaped (\x1b, \u202e);
--json prints them as they are, JSON-escaped.

Exit status: 0 with a root cause, and also 0 with "no error documents under URL"
(an empty prefix is an answer, not a failure); 2 when documents exist but none
is usable; 1 for a bad URL or flag, or a prefix that cannot be listed or read.`,
		Args:          cobra.ExactArgs(1),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			c.URL = args[0]
			if err := c.validate(); err != nil {
				return err
			}
			c.warn = cmd.ErrOrStderr()
			return runErrors(cmd.Context(), c, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&c.JSON, "json", false, "print one JSON object instead of the table")
	cmd.Flags().IntVar(&c.WaitWorkers, "wait-workers", 0, fmt.Sprintf("wait until documents from this many workers exist, up to --grace (0 to %d; 0: do not wait)", maxWaitWorkers))
	cmd.Flags().DurationVar(&c.Grace, "grace", 30*time.Second, fmt.Sprintf("how long --wait-workers waits for late documents (0s to %v)", maxGrace))
	cmd.Flags().IntVar(&c.Concurrency, "concurrency", 32, fmt.Sprintf("concurrent document reads (1 to %d)", maxConcurrency))
	cmd.Flags().DurationVar(&c.Timeout, "timeout", defaultTimeout, fmt.Sprintf("bound on each storage call: a listing, one document read (1ms to %v)", maxTimeout))
	cmd.AddCommand(newErrorsPutCmd())
	return cmd
}

func runErrors(ctx context.Context, c errorsConfig, out io.Writer) error {
	bucket, err := kferrors.OpenPrefix(ctx, c.URL, false)
	if err != nil {
		return err
	}
	defer bucket.Close()
	src := outputreader.NewBucketSource(bucket)
	opts := &outputreader.Options{Concurrency: c.Concurrency, OpenAll: true, CallTimeout: c.Timeout}
	var r *outputreader.Report
	if c.WaitWorkers > 0 {
		r, err = outputreader.WaitFor(ctx, src, opts, c.WaitWorkers, time.Now().Add(c.Grace))
		if err == nil && r.Workers() < c.WaitWorkers && c.warn != nil {
			// The table below is what there is; say that it is not what
			// was asked for, so that nobody reads it as complete.
			fmt.Fprintf(c.warn, "gave up waiting after --grace %v: documents from %d of the %d workers asked for (--wait-workers); showing those\n",
				c.Grace, r.Workers(), c.WaitWorkers)
		}
	} else {
		r, err = outputreader.Read(ctx, src, opts)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", c.URL, err)
	}
	if c.JSON {
		err = writeErrorsJSON(out, c.URL, r)
	} else {
		err = writeErrorsTable(out, termsafe.Line(c.URL), r)
	}
	if err != nil {
		return err
	}
	if r.RootCause == nil && len(r.Skipped) > 0 {
		return &exitError{code: exitNoUsableDocuments, msg: fmt.Sprintf("no usable error document under %s: %d skipped", c.URL, len(r.Skipped))}
	}
	return nil
}

// rows is every document in the total order, the root cause first.
func rows(r *outputreader.Report) []outputreader.Document {
	if r.RootCause == nil {
		return nil
	}
	return append([]outputreader.Document{*r.RootCause}, r.Others...)
}

func timeText(d outputreader.Document) string {
	t := d.Time().UTC().Format(outputreader.TimeLayout)
	switch d.AtSource {
	case outputreader.TimeFromModified:
		t += " (upload time)"
	case outputreader.TimeFromModifiedClamped:
		t += " (upload time; the document said " + d.Failure.Time.UTC().Format(outputreader.TimeLayout) + ")"
	case outputreader.TimeFromListing:
		t += " (read time)"
	case outputreader.TimeFromName:
		t += " (from name)"
	}
	return t
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func writeErrorsTable(out io.Writer, url string, r *outputreader.Report) error {
	if r.RootCause == nil && len(r.Skipped) == 0 {
		_, err := fmt.Fprintf(out, "no error documents under %s\n", url)
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	if r.RootCause != nil {
		fmt.Fprintln(tw, "\tTIME\tWORKER\tCODE\tKIND\tORIGIN\tKEY")
		for i, d := range rows(r) {
			mark := ""
			if i == 0 {
				mark = "*"
			}
			kind, origin := d.Failure.Kind().String(), d.Failure.Origin.String()
			if !d.Opened() {
				kind, origin = "-", "-"
			}
			key := termsafe.Line(d.Key)
			if d.Synthesized {
				key = "(from pod status)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", mark, timeText(d), orDash(termsafe.Line(d.Failure.Worker)),
				orDash(termsafe.Line(d.Failure.Code)), kind, origin, key)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Skipped) > 0 {
		fmt.Fprintf(out, "\nskipped %d unreadable document(s):\n", len(r.Skipped))
		for _, s := range r.Skipped {
			fmt.Fprintf(out, "  %s: %s\n", termsafe.Line(s.Key), termsafe.Line(s.Err.Error()))
		}
	}
	if r.RootCause == nil {
		_, err := fmt.Fprintf(out, "\nno usable error document under %s\n", url)
		return err
	}
	_, err := fmt.Fprintf(out, "\nroot cause (* above), as the Flyte UI shows it:\n%s\n", indent(termsafe.Text(r.Message()), "  "))
	return err
}

func indent(s, by string) string {
	return by + strings.ReplaceAll(s, "\n", "\n"+by)
}

// errorsJSON is the --json output: one object.
type errorsJSON struct {
	Prefix string `json:"prefix"`
	// Outcome is "root-cause", "no-documents" or "no-usable-documents".
	Outcome     string        `json:"outcome"`
	Message     string        `json:"message,omitempty"`
	Recoverable *bool         `json:"recoverable,omitempty"`
	Workers     int           `json:"workers"`
	Opened      int           `json:"opened"`
	Documents   []docJSON     `json:"documents"`
	Skipped     []skippedJSON `json:"skipped"`
}

type docJSON struct {
	RootCause   bool      `json:"rootCause,omitempty"`
	Key         string    `json:"key,omitempty"`
	Time        time.Time `json:"time"`
	TimeSource  string    `json:"timeSource"`
	Worker      string    `json:"worker"`
	Code        string    `json:"code,omitempty"`
	Kind        string    `json:"kind,omitempty"`
	Origin      string    `json:"origin,omitempty"`
	Message     string    `json:"message,omitempty"`
	Synthesized bool      `json:"synthesized,omitempty"`
}

type skippedJSON struct {
	Key   string `json:"key"`
	Error string `json:"error"`
}

func writeErrorsJSON(out io.Writer, url string, r *outputreader.Report) error {
	j := errorsJSON{Prefix: url, Workers: r.Workers(), Opened: r.Opened, Documents: []docJSON{}, Skipped: []skippedJSON{}}
	switch {
	case r.RootCause != nil:
		j.Outcome, j.Message = "root-cause", r.Message()
		rec := r.RootCause.Failure.Recoverable
		j.Recoverable = &rec
	case len(r.Skipped) > 0:
		j.Outcome = "no-usable-documents"
	default:
		j.Outcome = "no-documents"
	}
	for i, d := range rows(r) {
		dj := docJSON{RootCause: i == 0, Key: d.Key, Time: d.Time().UTC(), TimeSource: d.AtSource.String(),
			Worker: d.Failure.Worker, Code: d.Failure.Code, Message: d.Failure.Message, Synthesized: d.Synthesized}
		if d.Opened() {
			dj.Kind, dj.Origin = d.Failure.Kind().String(), d.Failure.Origin.String()
		}
		j.Documents = append(j.Documents, dj)
	}
	for _, s := range r.Skipped {
		j.Skipped = append(j.Skipped, skippedJSON{Key: s.Key, Error: s.Err.Error()})
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(j)
}

// newErrorsPutCmd is `kfelastic errors put`: write one worker's error
// document from what a supervisor observed (a torch error file, an exit
// code). Hidden: the agent writes documents itself; this serves scripts and
// tests that run workers without it.
func newErrorsPutCmd() *cobra.Command {
	var worker, torchFile string
	var exitCode int
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:    "put URL --worker NAME [--from-torch-error FILE] [--exit-code N]",
		Short:  "Write one error document (from a torch error file or an exit code) under URL",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if worker == "" {
				return fmt.Errorf("--worker is required")
			}
			if err := durationIn("timeout", timeout, time.Millisecond, maxTimeout); err != nil {
				return err
			}
			e := kferrors.WorkerExit{Worker: worker, ExitCode: exitCode, ObservedAt: time.Now().UTC()}
			if torchFile != "" {
				// A file that cannot be used still leaves the worker's
				// failure documented, with the reason in its message.
				te, rec, err := kferrors.ReadTorchError(torchFile)
				e.TorchError, e.RecoverableMarker = te, rec
				if err != nil {
					e.ErrorFileProblem = err.Error()
				}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			bucket, err := kferrors.OpenPrefix(ctx, args[0], true)
			if err != nil {
				return err
			}
			defer bucket.Close()
			key, err := kferrors.NewWriter(bucket, nil).Write(ctx, kferrors.Classify(e))
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), key)
			return err
		},
	}
	cmd.Flags().StringVar(&worker, "worker", "", "worker (pod) name recorded in the document")
	cmd.Flags().StringVar(&torchFile, "from-torch-error", "", "the worker's TORCHELASTIC_ERROR_FILE")
	cmd.Flags().IntVar(&exitCode, "exit-code", 1, "the worker's exit status")
	cmd.Flags().DurationVar(&timeout, "timeout", defaultTimeout, fmt.Sprintf("bound on the write (1ms to %v)", maxTimeout))
	return cmd
}
