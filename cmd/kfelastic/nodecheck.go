package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/kfelastic/kfelastic/agent"
)

// node-check is the Go node health check the agent runs as a child process
// where the job has no torch (agent.GoCheckMain); hidden: only the agent
// calls it.
func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:                "node-check --leader HOST:PORT --rank R --size N [--timeout D] [--work N]",
		Short:              "One node's part of a node health-check round, without torch (run by the agent)",
		Hidden:             true,
		DisableFlagParsing: true,
		SilenceUsage:       true,
		RunE: func(cmd *cobra.Command, args []string) error {
			if code := agent.GoCheckMain(args, os.Stdout, os.Stderr); code != 0 {
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
