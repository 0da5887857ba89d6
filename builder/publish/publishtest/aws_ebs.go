package publishtest

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
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
	case "ListSnapshotBlocks":
		f.listSnapshotBlocks(w, reg, blocksPath.FindStringSubmatch(r.URL.Path)[1], r.URL.Query())
	case "GetSnapshotBlock":
		m := blockPath.FindStringSubmatch(r.URL.Path)
		f.getSnapshotBlock(w, reg, m[1], m[2], r.URL.Query().Get("blockToken"))
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

// readable is the completed snapshot id of the account, or nil after answering EBS's error.
func readable(w http.ResponseWriter, reg *regionState, id string) *Snapshot {
	s := reg.snapshots[id]
	switch {
	case s == nil || owner(s.Owner) != AWSAccount:
		ebsError(w, http.StatusNotFound, "ResourceNotFoundException", "The snapshot '"+id+"' does not exist.", "SNAPSHOT_NOT_FOUND")
		return nil
	case s.State != "completed":
		ebsError(w, http.StatusBadRequest, "ValidationException", "The snapshot is not in the completed state", "INVALID_SNAPSHOT_ID")
		return nil
	}
	return s
}

// blockToken is the token ListSnapshotBlocks gives for a block, which GetSnapshotBlock needs.
func blockToken(id string, i int32) string {
	return base64.StdEncoding.EncodeToString(fmt.Appendf(nil, "%s/%d", id, i))
}

// listSnapshotBlocks lists the blocks put in a completed snapshot, by index, in pages of
// maxResults (100-10000, default 10000) from pageToken.
func (f *AWS) listSnapshotBlocks(w http.ResponseWriter, reg *regionState, id string, q url.Values) {
	s := readable(w, reg, id)
	if s == nil {
		return
	}
	limit, from := 10000, 0
	if v := q.Get("maxResults"); v != "" {
		limit, _ = strconv.Atoi(v)
	}
	if v := q.Get("pageToken"); v != "" {
		from, _ = strconv.Atoi(v)
	}
	if limit < 100 || limit > 10000 {
		ebsError(w, http.StatusBadRequest, "ValidationException", "maxResults must be between 100 and 10000", "INVALID_PARAMETER_VALUE")
		return
	}
	idx := slices.Sorted(maps.Keys(s.Blocks))
	var blocks []map[string]any
	for _, i := range idx[min(from, len(idx)):min(from+limit, len(idx))] {
		blocks = append(blocks, map[string]any{"BlockIndex": i, "BlockToken": blockToken(id, i)})
	}
	out := map[string]any{"Blocks": blocks, "BlockSize": EBSBlockSize, "VolumeSize": s.GiB, "ExpiryTime": float64(time.Now().Add(time.Hour).Unix())}
	if from+limit < len(idx) {
		out["NextToken"] = strconv.Itoa(from + limit)
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(out)
}

// getSnapshotBlock answers a block's data with its checksum.
func (f *AWS) getSnapshotBlock(w http.ResponseWriter, reg *regionState, id, index, token string) {
	s := readable(w, reg, id)
	if s == nil {
		return
	}
	i, _ := strconv.ParseInt(index, 10, 32)
	data := s.Blocks[int32(i)]
	if data == nil || token != blockToken(id, int32(i)) {
		ebsError(w, http.StatusBadRequest, "ValidationException", "The block token is not valid", "INVALID_BLOCK_TOKEN")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Amz-Data-Length", strconv.Itoa(len(data)))
	w.Header().Set("X-Amz-Checksum", base64.StdEncoding.EncodeToString(s.digests[int32(i)]))
	w.Header().Set("X-Amz-Checksum-Algorithm", "SHA256")
	w.Write(data)
}
