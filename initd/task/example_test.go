package task_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/kilnproject/kiln/initd/task"
)

func Example() {
	root, _ := os.MkdirTemp("", "kiln-node")
	defer os.RemoveAll(root)
	hostname := filepath.Join(root, "etc", "hostname")

	tasks := []task.Task{
		task.Func("etc", nil,
			func(context.Context) (bool, error) { _, err := os.Stat(filepath.Dir(hostname)); return err == nil, nil },
			func(context.Context) error { return os.MkdirAll(filepath.Dir(hostname), 0o755) }),
		task.Func("hostname", []string{"etc"},
			func(context.Context) (bool, error) { b, _ := os.ReadFile(hostname); return string(b) == "cp-1\n", nil },
			func(context.Context) error { return os.WriteFile(hostname, []byte("cp-1\n"), 0o644) }),
	}
	for range 2 {
		rep, err := task.Run(context.Background(), tasks, task.Options{})
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(rep.Summary())
	}
	// Output:
	// tasks=2 applied=2 unchanged=0 failed=0
	// tasks=2 applied=0 unchanged=2 failed=0
}
