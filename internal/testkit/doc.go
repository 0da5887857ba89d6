// Package testkit holds the helpers the tests of builder, initd and qemu-tests share: free
// ports, compressed bytes, tar archives and OCI layers built in memory, snapshots of a
// directory tree, and the lookup of the host tools a test needs.
//
// It is imported only from _test.go files; no program links it.
package testkit
