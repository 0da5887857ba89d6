// Package publish uploads baked images to clouds and registers them there as bootable images.
//
// Load reads what is published: an output file of a bake and its metadata (<image>-<role>.json
// beside it), whose SHA-256 of the file is the image's identity. The file is hashed against it
// before any request. Publishing records that digest on the cloud image, so publishing the
// same file again finds the image instead of uploading; but a tag or a label is not proof of
// content: an AMI or a snapshot is reused only when it is the caller's account's and its
// blocks, read back, are the file's; a GCE image only when it has the name asked for and its
// description the whole digest.
//
// Each cloud is a package beside this one that implements Publisher: aws uploads a raw disk
// through the EBS direct APIs into a snapshot and registers an AMI from it; gce uploads the gce
// tarball to Cloud Storage in a resumable upload and creates a Compute Engine image from it. A
// failure part-way deletes what the run created, or names what is left. publishtest holds the
// fakes of both clouds' APIs the tests run against.
package publish
