package main

import (
	"errors"

	"github.com/spf13/cobra"
)

func newPublishAWSCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "aws",
		Hidden: true,
		RunE:   func(*cobra.Command, []string) error { return errors.New("publish aws: not available") },
	}
}
