package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kfelastic/kfelastic/agent/nodecheck"
)

// node-check is the Go node health check the agent runs as a child process
// where the job has no torch (nodecheck.GoMain); hidden: only the agent
// calls it, with the arguments nodecheck.Checker passes.
func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:                "node-check --leader HOST:PORT --rank R --size N [--timeout D] [--work N]",
		Short:              "One node's part of a node health-check round, without torch (run by the agent)",
		Hidden:             true,
		DisableFlagParsing: true,
		SilenceUsage:       true,
		RunE: func(cmd *cobra.Command, args []string) error {
			// main turns stop signals into a cancelled context, which the
			// check does not watch: a check told to stop dies at once.
			signal.Reset(syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT)
			if code := nodecheck.GoMain(args, os.Stdout, os.Stderr); code != 0 {
				return exitStatus(code)
			}
			return nil
		},
	})
}

// exitStatus is an error that only carries a process exit status.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }
func (e exitStatus) ExitCode() int { return int(e) }
