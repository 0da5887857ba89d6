package firstboot_test

import (
	"os"
	"time"

	"github.com/kilnproject/kiln/initd/firstboot"
)

func ExamplePrintStatus() {
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	st := &firstboot.Status{
		State: "ok", Source: "fw_cfg", Version: "v0.1.0",
		Started: start, Finished: start.Add(35 * time.Millisecond), DurationMS: 35,
		Files: []firstboot.FileStatus{
			{Path: "/etc/hostname", Mode: "0644", SHA256: "4c5b1d2f6c5a6c4b3e9a4d1e4f6a2b8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6"},
		},
	}
	firstboot.PrintStatus(os.Stdout, st, "table")
	// Output:
	// STATE     ok
	// SOURCE    fw_cfg
	// PLATFORM  -
	// ROLE      -
	// HOSTNAME  -
	// STARTED   2026-03-01T12:00:00Z
	// FINISHED  2026-03-01T12:00:00Z
	// DURATION  35ms
	// VERSION   v0.1.0
	// TASKS     tasks=0 applied=0 unchanged=0 failed=0
	// FILES     1
	//
	// PATH           MODE  SHA256
	// /etc/hostname  0644  4c5b1d2f6c5a6c4b3e9a4d1e4f6a2b8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6
}
