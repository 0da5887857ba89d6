package main

import (
	"errors"

	"github.com/spf13/cobra"
)

func newPublishGCECmd() *cobra.Command {
	return &cobra.Command{
		Use:    "gce",
		Hidden: true,
		RunE:   func(*cobra.Command, []string) error { return errors.New("publish gce: not available") },
	}
}
