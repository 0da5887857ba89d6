package publishtest

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// ebs answers an EBS direct API call.
func (f *AWS) ebs(w http.ResponseWriter, reg *regionState, op string, r *http.Request, body []byte) {
	switch op {
	case "StartSnapshot":
		f.startSnapshot(w, reg, body)
	case "PutSnapshotBlock":
		m := blockPath.FindStringSubmatch(r.URL.Path)
		f.putSnapshotBlock(w, reg, m[1], m[2], r, body)
	case "CompleteSnapshot":
		f.completeSnapshot(w, reg, completePath.FindStringSubmatch(r.URL.Path)[1], r)
	default:
		f.t.Errorf("unexpected EBS call %s", op)
		ebsError(w, http.StatusNotFound, "ResourceNotFoundException", "no such operation", "")
	}
}

func (f *AWS) startSnapshot(w http.ResponseWriter, reg *regionState, body []byte) {
	var in struct {
		VolumeSize               int64
		Description, ClientToken string
		Tags                     []struct{ Key, Value string }
	}
	if err := json.Unmarshal(body, &in); err != nil {
		ebsError(w, http.StatusBadRequest, "ValidationException", "malformed request: "+err.Error(), "INVALID_PARAMETER_VALUE")
		return
	}
	if in.VolumeSize < 1 || in.VolumeSize > 65536 {
		ebsError(w, http.StatusBadRequest, "ValidationException", "The volume size is not valid", "INVALID_VOLUME_SIZE")
		return
	}
	s := &Snapshot{ID: f.newID("snap"), State: "pending", Description: in.Description, GiB: in.VolumeSize,
		Tags: map[string]string{}, Blocks: map[int32][]byte{}, digests: map[int32][]byte{}}
	for _, t := range in.Tags {
		s.Tags[t.Key] = t.Value
	}
	reg.snapshots[s.ID] = s
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(map[string]any{
		"SnapshotId": s.ID, "OwnerId": AWSAccount, "Status": "pending", "StartTime": float64(time.Now().Unix()),
		"VolumeSize": s.GiB, "BlockSize": EBSBlockSize, "Tags": in.Tags, "Description": in.Description,
	})
}

func (f *AWS) putSnapshotBlock(w http.ResponseWriter, reg *regionState, id, index string, r *http.Request, body []byte) {
	s := reg.snapshots[id]
	if s == nil {
		ebsError(w, http.StatusNotFound, "ResourceNotFoundException", "The snapshot '"+id+"' does not exist.", "SNAPSHOT_NOT_FOUND")
		return
	}
	i, err := strconv.ParseInt(index, 10, 32)
	switch {
	case s.State != "pending":
		ebsError(w, http.StatusBadRequest, "ValidationException", "The snapshot is not in the pending state", "INVALID_SNAPSHOT_ID")
	case err != nil || i < 0 || i >= s.GiB<<30/EBSBlockSize:
		ebsError(w, http.StatusBadRequest, "ValidationException", "The block index is out of range", "INVALID_BLOCK")
	case r.Header.Get("X-Amz-Data-Length") != strconv.Itoa(EBSBlockSize) || len(body) != EBSBlockSize:
		ebsError(w, http.StatusBadRequest, "ValidationException", "The data length must be 524288 and match the block", "INVALID_PARAMETER_VALUE")
	case r.Header.Get("X-Amz-Checksum-Algorithm") != "SHA256" || r.Header.Get("Content-Type") != "application/octet-stream":
		ebsError(w, http.StatusBadRequest, "ValidationException", "SHA256 checksum and an octet stream required", "INVALID_PARAMETER_VALUE")
	case r.Header.Get("X-Amz-Checksum") != digestOf(body):
		ebsError(w, http.StatusBadRequest, "ValidationException", "The checksum of the block data does not match the checksum provided", "INVALID_BLOCK")
	default:
		sum := sha256.Sum256(body)
		s.Blocks[int32(i)], s.digests[int32(i)] = slices.Clone(body), sum[:]
		w.Header().Set("X-Amz-Checksum", digestOf(body))
		w.Header().Set("X-Amz-Checksum-Algorithm", "SHA256")
		w.WriteHeader(http.StatusCreated)
	}
}

// completeSnapshot checks the count of blocks and their linear aggregate checksum: the
// SHA-256 of the blocks' SHA-256s in index order.
func (f *AWS) completeSnapshot(w http.ResponseWriter, reg *regionState, id string, r *http.Request) {
	s := reg.snapshots[id]
	if s == nil {
		ebsError(w, http.StatusNotFound, "ResourceNotFoundException", "The snapshot '"+id+"' does not exist.", "SNAPSHOT_NOT_FOUND")
		return
	}
	agg := sha256.New()
	idx := make([]int32, 0, len(s.digests))
	for i := range s.digests {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	for _, i := range idx {
		agg.Write(s.digests[i])
	}
	switch {
	case s.State != "pending":
		ebsError(w, http.StatusBadRequest, "ValidationException", "The snapshot is not in the pending state", "INVALID_SNAPSHOT_ID")
	case r.Header.Get("X-Amz-Changedblockscount") != strconv.Itoa(len(s.Blocks)):
		ebsError(w, http.StatusBadRequest, "ValidationException", "ChangedBlocksCount does not match the blocks written", "INVALID_PARAMETER_VALUE")
	case r.Header.Get("X-Amz-Checksum-Aggregation-Method") != "LINEAR" || r.Header.Get("X-Amz-Checksum-Algorithm") != "SHA256":
		ebsError(w, http.StatusBadRequest, "ValidationException", "LINEAR SHA256 aggregation required", "INVALID_PARAMETER_VALUE")
	case r.Header.Get("X-Amz-Checksum") != base64.StdEncoding.EncodeToString(agg.Sum(nil)):
		s.State = "error"
		ebsError(w, http.StatusBadRequest, "ValidationException", "The aggregated checksum does not match", "INVALID_PARAMETER_VALUE")
	default:
		s.State = "completing"
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		json.NewEncoder(w).Encode(map[string]string{"Status": "pending"})
	}
}
