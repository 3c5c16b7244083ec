// Command kfelastic is the one binary of the project: agent, master, local,
// errors, report, version. Each subcommand lives in its own file and adds
// itself to the root command in init.
package main

import (
	"context"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/kfelastic/kfelastic/agent/guardian"
	"github.com/kfelastic/kfelastic/internal/nonblocking"
	"github.com/kfelastic/kfelastic/internal/stopsignal"
	"github.com/kfelastic/kfelastic/internal/termsafe"
)

var rootCmd = &cobra.Command{
	Use:           "kfelastic",
	Short:         "Elastic, legible distributed training for Flyte",
	SilenceUsage:  true,
	SilenceErrors: true,
}

func main() {
	// The agent's guardian is this binary, re-executed (agent/guardian).
	guardian.MaybeRun()
	// SIGTERM, SIGINT, SIGHUP and SIGQUIT end the context, with the signal
	// as its cause: the agent tells a preemption from an interruption by it.
	ctx, stop := stopsignal.NotifyContext(context.Background())
	defer stop()
	if err := rootCmd.ExecuteContext(ctx); err != nil {
		// Errors quote URLs, pod names and messages: escaped, as all output.
		// Written without waiting on a stderr nobody reads: the exit code
		// is what the training operator acts on.
		msg := "kfelastic: " + termsafe.Text(err.Error()) + "\n"
		out := nonblocking.NewOutput(os.Stderr)
		_, _ = out.Write([]byte(msg))
		out.Close(2 * time.Second)
		os.Exit(exitCode(err))
	}
}

// exitCoder lets a subcommand choose its process exit status (the agent exits
// ≥128 for retryable node-level causes, as the training operator expects).
type exitCoder interface{ ExitCode() int }

func exitCode(err error) int {
	if ec, ok := err.(exitCoder); ok {
		return ec.ExitCode()
	}
	return 1
}
