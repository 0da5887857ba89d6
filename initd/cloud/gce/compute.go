package gce

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"net/url"
)

// computeAPIVersion is the Compute Engine API version the requests ask for
// (x-goog-api-version): the one the generated v1 client sent.
const computeAPIVersion = "2026-11-01"

// ComputeService is Compute Engine v1, for the calls Disk makes: disks.get, disks.list,
// instances.get, instances.attachDisk and zoneOperations.wait.
type ComputeService struct{ api *apiClient }

// newComputeService is Compute Engine at endpoint (its base URL,
// https://compute.googleapis.com/compute/v1/), with tokens' bearer tokens (nil: none).
func newComputeService(endpoint string, tokens tokenSource) (*ComputeService, error) {
	api, err := newAPIClient(endpoint, tokens)
	if err != nil {
		return nil, err
	}
	api.header.Set("X-Goog-Api-Version", computeAPIVersion)
	return &ComputeService{api: api}, nil
}

// computeDisk is the part of a compute#disk that Disk reads.
type computeDisk struct {
	Name     string            `json:"name"`
	SelfLink string            `json:"selfLink"`
	Users    []string          `json:"users"`
	Labels   map[string]string `json:"labels"`
}

// computeDiskList is a page of disks.list's answer.
type computeDiskList struct {
	Items         []computeDisk `json:"items"`
	NextPageToken string        `json:"nextPageToken"`
}

func (l *computeDiskList) nextPage() string { return l.NextPageToken }

// computeAttachedDisk is a compute#attachedDisk: instances.attachDisk's body, and the
// instance's disks in instances.get's answer.
type computeAttachedDisk struct {
	Source     string `json:"source,omitempty"`
	DeviceName string `json:"deviceName,omitempty"`
	Mode       string `json:"mode,omitempty"`
	Type       string `json:"type,omitempty"`
}

// computeInstance is the part of a compute#instance that Disk reads.
type computeInstance struct {
	Disks []computeAttachedDisk `json:"disks"`
}

// computeOperation is the part of a compute#operation that Disk reads.
type computeOperation struct {
	Name   string `json:"name"`
	Status string `json:"status"` // PENDING, RUNNING, DONE
	Error  *struct {
		Errors []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"errors"`
	} `json:"error"`
}

// zonePath is the path of a resource of project's zone.
func zonePath(project, zone string, rest ...string) []string {
	return append([]string{"projects", project, "zones", zone}, rest...)
}

// getDisk is disks.get.
func (s *ComputeService) getDisk(ctx context.Context, project, zone, name string) (*computeDisk, error) {
	var d computeDisk
	if err := s.api.call(ctx, http.MethodGet, zonePath(project, zone, "disks", name), nil, nil, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// listDisks is disks.list with filter, every page of it.
func (s *ComputeService) listDisks(ctx context.Context, project, zone, filter string, each func([]computeDisk)) error {
	return listAll(ctx, s.api, zonePath(project, zone, "disks"), url.Values{"filter": {filter}},
		func(l *computeDiskList) { each(l.Items) })
}

// getInstance is instances.get.
func (s *ComputeService) getInstance(ctx context.Context, project, zone, name string) (*computeInstance, error) {
	var in computeInstance
	if err := s.api.call(ctx, http.MethodGet, zonePath(project, zone, "instances", name), nil, nil, &in); err != nil {
		return nil, err
	}
	return &in, nil
}

// attachDisk is instances.attachDisk, with requestID (a UUID) so that Compute Engine
// ignores a repeat of a request it has taken: another attempt after an answer that was
// lost does not attach twice, or see the disk as another's.
func (s *ComputeService) attachDisk(ctx context.Context, project, zone, instance, requestID string, d computeAttachedDisk) (*computeOperation, error) {
	var op computeOperation
	err := s.api.call(ctx, http.MethodPost, zonePath(project, zone, "instances", instance, "attachDisk"),
		url.Values{"requestId": {requestID}}, d, &op)
	if err != nil {
		return nil, err
	}
	return &op, nil
}

// waitOperation is zoneOperations.wait: the operation once it is DONE, or as it is after
// up to two minutes.
func (s *ComputeService) waitOperation(ctx context.Context, project, zone, name string) (*computeOperation, error) {
	var op computeOperation
	if err := s.api.call(ctx, http.MethodPost, zonePath(project, zone, "operations", name, "wait"), nil, nil, &op); err != nil {
		return nil, err
	}
	return &op, nil
}

// newRequestID is a random (version 4) UUID, for a request Compute Engine takes once.
func newRequestID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
