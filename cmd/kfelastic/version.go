package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/kfelastic/kfelastic/internal/version"
)

func init() {
	rootCmd.AddCommand(&cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Long: `version prints the binary's version: the one stamped at link time
(-X ` + version.LinkerFlag + `=…, as make build, make image and the
Dockerfile do), else the module's as Go recorded it, else (devel).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := version.Get()
			if v == "" {
				v = "(devel)"
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), "kfelastic", v)
			return err
		},
	})
}
