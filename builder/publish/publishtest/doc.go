// Package publishtest holds fakes of the AWS and Google Cloud APIs kiln publish calls, for
// tests only: the official SDKs are pointed at them, and they check each request the way the
// clouds do (SigV4 signatures, EBS block and aggregate checksums, RegisterImage and
// images.insert parameters, bearer tokens) and answer with the clouds' status codes and error
// bodies.
//
// AWS serves EBS direct and EC2 over TLS for every region; GCS stands in front of the Cloud
// Storage emulator (fake-gcs-server) and Compute answers the Compute Engine image calls. Each
// keeps what it was sent (snapshots, images, objects, call counts) for the test to read, and
// fails calls as the test injects faults.
//
// Only _test.go files may import this package.
package publishtest
