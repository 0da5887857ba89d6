// Package devmapper makes device-mapper devices through the kernel's ioctl interface
// (/dev/mapper/control), without libdevmapper or dmsetup in the initramfs: stage 1 opens the
// root through a read-only dm-verity target (OpenVerity) and asks it, when a read failed, whether
// it found a block that does not match the tree (Corrupted).
package devmapper

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kilnproject/kiln/internal/verity"
)

// ControlPath is the device-mapper control node devtmpfs makes once dm_mod is loaded.
const ControlPath = "/dev/mapper/control"

// The ioctl interface, linux/dm-ioctl.h: every call passes a struct dm_ioctl (312 bytes)
// followed by its data.
const (
	headerSize = 312
	specSize   = 40 // struct dm_target_spec

	cmdDevCreate   = 3
	cmdDevRemove   = 4
	cmdDevSuspend  = 6
	cmdTableLoad   = 9
	cmdTableStatus = 12

	flagReadOnly = 1 << 0
	// flagBufferFull: the answer did not fit the buffer given.
	flagBufferFull = 1 << 8

	versionMajor = 4
	nameLen      = 128
	uuidLen      = 129
)

// ioctlNumber is _IOWR(0xfd, cmd, struct dm_ioctl).
func ioctlNumber(cmd uintptr) uintptr {
	return 3<<30 | headerSize<<16 | 0xfd<<8 | cmd
}

// request is one ioctl's buffer: the header, then data.
type request struct {
	buf []byte
}

func newRequest(name string, flags uint32, data []byte, room int) (*request, error) {
	if name == "" || len(name) >= nameLen || strings.ContainsRune(name, '/') {
		return nil, fmt.Errorf("device-mapper name %q: want 1 to %d characters, no /", name, nameLen-1)
	}
	size := headerSize + max(len(data), room)
	b := make([]byte, size)
	le := binary.LittleEndian
	le.PutUint32(b[0:], versionMajor)
	le.PutUint32(b[12:], uint32(size)) // data_size: the whole buffer
	le.PutUint32(b[16:], headerSize)   // data_start
	le.PutUint32(b[28:], flags)        //
	copy(b[48:48+nameLen-1], name)     // name
	copy(b[headerSize:], data)         //
	return &request{buf: b}, nil
}

func (r *request) flags() uint32    { return binary.LittleEndian.Uint32(r.buf[28:]) }
func (r *request) dev() uint64      { return binary.LittleEndian.Uint64(r.buf[40:]) }
func (r *request) dataStart() int   { return int(binary.LittleEndian.Uint32(r.buf[16:])) }
func (r *request) dataSize() int    { return int(binary.LittleEndian.Uint32(r.buf[12:])) }
func (r *request) setTargets(n int) { binary.LittleEndian.PutUint32(r.buf[20:], uint32(n)) }

// Control is an open /dev/mapper/control.
type Control struct {
	f *os.File
}

// Open opens the control node at path (ControlPath on a node).
func Open(path string) (*Control, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open device-mapper control (is dm_mod loaded?): %w", err)
	}
	return &Control{f: f}, nil
}

// Close closes the control node; devices made stay.
func (c *Control) Close() error { return c.f.Close() }

func (c *Control) call(what string, cmd uintptr, r *request) error {
	raw, err := c.f.SyscallConn()
	if err != nil {
		return err
	}
	var errno unix.Errno
	cerr := raw.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, ioctlNumber(cmd), uintptr(unsafe.Pointer(&r.buf[0])))
	})
	runtime.KeepAlive(r.buf)
	if cerr != nil {
		return cerr
	}
	if errno != 0 {
		return fmt.Errorf("device-mapper %s: %w", what, errno)
	}
	return nil
}

// VerityDevice is a dm-verity device made by OpenVerity.
type VerityDevice struct {
	// Name is its device-mapper name, Path its device node (/dev/dm-N).
	Name, Path string
}

// OpenVerity makes the read-only device name mapping dev's data through a dm-verity target with
// the tree p describes (data and tree on dev), and returns its node once devtmpfs made it. Reads
// of a block that does not match the tree fail with EIO and the kernel logs the block; nothing
// unverified is ever returned. On failure the half-made device is removed.
func (c *Control) OpenVerity(name, dev string, p verity.Params) (VerityDevice, error) {
	create, err := newRequest(name, 0, nil, 0)
	if err != nil {
		return VerityDevice{}, err
	}
	if err := c.call("create "+name, cmdDevCreate, create); err != nil {
		return VerityDevice{}, err
	}
	devno := create.dev()
	fail := func(err error) (VerityDevice, error) {
		if rerr := c.Remove(name); rerr != nil {
			err = errors.Join(err, rerr)
		}
		return VerityDevice{}, err
	}
	load, err := newRequest(name, flagReadOnly, targetSpec(p.DataSize()/512, "verity", p.Table(dev)), 0)
	if err != nil {
		return fail(err)
	}
	load.setTargets(1)
	if err := c.call("load the verity table of "+name, cmdTableLoad, load); err != nil {
		return fail(fmt.Errorf("%w (table: %s)", err, p.Table(dev)))
	}
	resume, err := newRequest(name, 0, nil, 0)
	if err != nil {
		return fail(err)
	}
	if err := c.call("resume "+name, cmdDevSuspend, resume); err != nil {
		return fail(err)
	}
	node := fmt.Sprintf("/dev/dm-%d", unix.Minor(devno))
	if err := waitNode(node, devno, 5*time.Second); err != nil {
		return fail(err)
	}
	return VerityDevice{Name: name, Path: node}, nil
}

// Remove removes the device name; it must not be open or mounted.
func (c *Control) Remove(name string) error {
	r, err := newRequest(name, 0, nil, 0)
	if err != nil {
		return err
	}
	return c.call("remove "+name, cmdDevRemove, r)
}

// targetSpec is one struct dm_target_spec with its parameter string, padded to 8 bytes.
func targetSpec(sectors int64, typ, params string) []byte {
	n := (specSize + len(params) + 1 + 7) / 8 * 8
	b := make([]byte, n)
	binary.LittleEndian.PutUint64(b[8:], uint64(sectors))
	copy(b[24:24+15], typ)
	copy(b[specSize:], params)
	return b
}

// waitNode waits for devtmpfs to make the block device node of devno.
func waitNode(node string, devno uint64, bound time.Duration) error {
	deadline := time.Now().Add(bound)
	for {
		var st unix.Stat_t
		err := unix.Stat(node, &st)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFBLK && uint64(st.Rdev) == devno {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("device node %s (%d:%d) did not appear within %s", node, unix.Major(devno), unix.Minor(devno), bound)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Status returns the target's status line: for verity "V" while every block read matched and
// "C" once one did not.
func (c *Control) Status(name string) (string, error) {
	r, err := newRequest(name, 0, nil, 4096)
	if err != nil {
		return "", err
	}
	if err := c.call("status of "+name, cmdTableStatus, r); err != nil {
		return "", err
	}
	if r.flags()&flagBufferFull != 0 {
		return "", fmt.Errorf("device-mapper status of %s: answer longer than 4096 bytes", name)
	}
	start, end := r.dataStart(), r.dataSize()
	if start+specSize > end || end > len(r.buf) {
		return "", fmt.Errorf("device-mapper status of %s: no target in the answer", name)
	}
	s := r.buf[start+specSize : end]
	if i := bytes.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(string(s)), nil
}

// Corrupted says whether the verity device name found a block that does not match its tree.
func (c *Control) Corrupted(name string) (bool, error) {
	s, err := c.Status(name)
	if err != nil {
		return false, err
	}
	return s == "C", nil
}
