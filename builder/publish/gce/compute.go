package gce

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"strings"
	"time"

	compute "google.golang.org/api/compute/v1"
)

// existing returns the image o.Name when an earlier publish made it of this file (its digest
// label, and the whole digest ending its description) and it is READY, or nil when there is
// no image of that name. An image of that name made from something else, or not READY, is an
// error. Images of other names are never answered, whatever they carry.
func (p *gcePublisher) existing(ctx context.Context) (*Result, error) {
	digest := p.img.SHA256
	im, err := p.compute.Images.Get(p.o.Project, p.o.Name).Context(ctx).Do()
	switch {
	case isNotFound(err):
		return nil, nil
	case err != nil:
		return nil, apiError("images.get "+p.o.Name, err)
	}
	if im.Labels[DigestLabel] != gceDigestLabelValue(digest) || !strings.HasSuffix(im.Description, gceDescriptionDigest(digest)) {
		return nil, fmt.Errorf("--name %s: image exists in project %s, made from another file (label %s=%q, description %q; this file's sha256 is %s): choose another --name",
			p.o.Name, p.o.Project, DigestLabel, im.Labels[DigestLabel], im.Description, digest)
	}
	if im.Status != "READY" {
		return nil, fmt.Errorf("image %s of this file (sha256 %s) is %s: publish again once it is READY, or delete it (gcloud compute images delete %s --project %s)", im.Name, digest, im.Status, im.Name, p.o.Project)
	}
	p.log.Info("image of this file exists; nothing uploaded", "image", im.Name, "sha256", digest)
	why := fmt.Sprintf("image %s of project %s is READY, labelled %s=%s, and its description ends %s, the SHA-256 of %s (hashed before any request)",
		im.Name, p.o.Project, DigestLabel, im.Labels[DigestLabel], gceDescriptionDigest(digest), p.o.file)
	if prov := p.img.ProvenanceSHA256(); prov != "" && im.Labels[ProvenanceLabel] != gceDigestLabelValue(prov) {
		p.log.Warn("the image found keeps the provenance it was published with; this run's checked provenance is not recorded on it",
			"image", im.Name, "label", ProvenanceLabel, "has", im.Labels[ProvenanceLabel], "checked", prov)
	}
	return &Result{Image: im.Name, SelfLink: im.SelfLink, Reused: true, Reason: why, Provenance: p.img.ProvenanceSHA256()}, nil
}

// gceImageSpec is the image o.Name made from the uploaded object.
func (p *gcePublisher) gceImageSpec() *compute.Image {
	labels := maps.Clone(p.o.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[DigestLabel] = gceDigestLabelValue(p.img.SHA256)
	provenance := ""
	if prov := p.img.ProvenanceSHA256(); prov != "" {
		labels[ProvenanceLabel] = gceDigestLabelValue(prov)
		provenance = "provenance sha256:" + prov + "; "
	}
	var features []*compute.GuestOsFeature
	for _, f := range gceGuestOSFeatures {
		features = append(features, &compute.GuestOsFeature{Type: f})
	}
	md := p.img.Metadata
	return &compute.Image{
		Name:            p.o.Name,
		Family:          p.o.Family,
		Description:     fmt.Sprintf("kiln image %s, role %s, platform %s, baked %s; %s%s", md.Name, md.Role, md.Platform, md.Created.UTC().Format(time.RFC3339), provenance, gceDescriptionDigest(p.img.SHA256)),
		Labels:          labels,
		Architecture:    gceArchitecture,
		GuestOsFeatures: features,
		RawDisk: &compute.ImageRawDisk{
			Source:        "https://storage.googleapis.com/" + p.o.Bucket + "/" + (&url.URL{Path: p.o.Object}).EscapedPath(),
			ContainerType: "TAR",
		},
	}
}

// createImage inserts the image and waits for it to be READY. An image left FAILED is
// deleted; an error says what is left when that is unknown.
func (p *gcePublisher) createImage(ctx context.Context) (*Result, error) {
	spec := p.gceImageSpec()
	p.log.Info("creating image", "image", spec.Name, "source", spec.RawDisk.Source, "family", spec.Family)
	op, err := p.compute.Images.Insert(p.o.Project, spec).Context(ctx).Do()
	if err != nil {
		return nil, apiError("images.insert "+spec.Name, err)
	}
	if op, err = p.wait(ctx, op); err != nil {
		return nil, fmt.Errorf("%w; image %s may still be created: see gcloud compute images describe %s --project %s", err, spec.Name, spec.Name, p.o.Project)
	}
	if err := operationError("images.insert "+spec.Name, op); err != nil {
		return nil, p.dropImage(err)
	}
	im, err := p.compute.Images.Get(p.o.Project, spec.Name).Context(ctx).Do()
	if err != nil {
		return nil, apiError("images.get "+spec.Name, err)
	}
	if im.Status != "READY" {
		return nil, p.dropImage(fmt.Errorf("image %s is %s once created, want READY", spec.Name, im.Status))
	}
	p.log.Info("image ready", "image", im.Name, "selfLink", im.SelfLink)
	return &Result{Image: im.Name, SelfLink: im.SelfLink, Object: p.objectURL(), Provenance: p.img.ProvenanceSHA256()}, nil
}

// wait waits for the global operation op to be DONE.
func (p *gcePublisher) wait(ctx context.Context, op *compute.Operation) (*compute.Operation, error) {
	for op.Status != "DONE" {
		start := time.Now()
		next, err := p.compute.GlobalOperations.Wait(p.o.Project, op.Name).Context(ctx).Do()
		if err != nil {
			return nil, apiError("globalOperations.wait "+op.Name, err)
		}
		op = next
		// Wait returns at the latest after two minutes; it may return early, so pace the loop.
		if op.Status != "DONE" && time.Since(start) < time.Second {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Second):
			}
		}
	}
	return op, nil
}

// operationError is the error a DONE operation ended with, or nil.
func operationError(call string, op *compute.Operation) error {
	if op.Error == nil || len(op.Error.Errors) == 0 {
		return nil
	}
	var msgs []string
	for _, e := range op.Error.Errors {
		msgs = append(msgs, e.Code+": "+e.Message)
	}
	msg := strings.Join(msgs, "; ")
	if op.HttpErrorStatusCode == 403 {
		if m := permissionIn.FindStringSubmatch(msg); m != nil {
			return fmt.Errorf("%s: operation %s: permission %s denied: %s", call, op.Name, m[1], msg)
		}
	}
	return fmt.Errorf("%s: operation %s failed: %s", call, op.Name, msg)
}

// dropImage deletes the image o.Name, which this publish created and which failed or cannot
// be vouched for, and returns cause, saying so, or what is left if it could not be deleted.
func (p *gcePublisher) dropImage(cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	op, err := p.compute.Images.Delete(p.o.Project, p.o.Name).Context(ctx).Do()
	if isNotFound(err) {
		return cause
	}
	if err == nil {
		op, err = p.wait(ctx, op)
	}
	if err == nil {
		err = operationError("images.delete "+p.o.Name, op)
	}
	if err != nil {
		return fmt.Errorf("%w (and image %s is left: %v)", cause, p.o.Name, err)
	}
	p.log.Info("deleted the image this publish created", "image", p.o.Name)
	return fmt.Errorf("%w (image %s deleted)", cause, p.o.Name)
}
