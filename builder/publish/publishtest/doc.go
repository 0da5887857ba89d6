// Package publishtest holds fakes of the AWS and Google Cloud APIs kiln publish calls, for
// tests only: the official SDKs are pointed at them, and they check each request the way the
// clouds do (SigV4 signatures, EBS block and aggregate checksums, RegisterImage and
// images.insert parameters, bearer tokens) and answer with the clouds' status codes and error
// bodies.
//
// AWS serves EBS direct, EC2 and STS over TLS (or plain http, as an emulator) for every
// region; GCS stands in front of the Cloud Storage emulator (fake-gcs-server), adding the
// preconditions of object deletes it lacks, and Compute answers the Compute Engine image calls.
// Each keeps what it was sent (snapshots, images, objects, call counts) for the test to read,
// and fails calls as the test injects faults. They also play the other principals a publish
// must not trust: snapshots and AMIs planted with kiln's tag (of other bytes, of another
// account, listed by an endpoint that ignores Owner=self, registered between a lookup and a
// call), answers lost after the call was made, images of another name carrying the digest, and
// objects written at the upload's name during the upload or while an image is made from it.
//
// Only _test.go files may import this package.
package publishtest
