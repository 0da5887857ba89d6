package firstboot

import "golang.org/x/sys/unix"

func setKernelHostname(name string) error { return unix.Sethostname([]byte(name)) }
