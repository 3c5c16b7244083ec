package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// version is set at link time (-X main.version=…); otherwise the module's.
var version = ""

func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the version",
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := version
			if v == "" {
				if bi, ok := debug.ReadBuildInfo(); ok {
					v = bi.Main.Version
				}
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "kfelastic", v)
			return err
		},
	})
}
