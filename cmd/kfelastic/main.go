// Command kfelastic is the one binary of the project: agent, master, local,
// errors, report, version. Each subcommand lives in its own file and adds
// itself to the root command in init.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kfelastic/kfelastic/internal/termsafe"
)

var rootCmd = &cobra.Command{
	Use:           "kfelastic",
	Short:         "Elastic, legible distributed training for Flyte",
	SilenceUsage:  true,
	SilenceErrors: true,
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := rootCmd.ExecuteContext(ctx); err != nil {
		// Errors quote URLs, pod names and messages: escaped, as all output.
		fmt.Fprintln(os.Stderr, "kfelastic:", termsafe.Text(err.Error()))
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
